"""Device names from the config (the one place "auto" is resolved), and what this machine's CPU computes in hardware
(its bf16 and fp16 units): asked by inference (`decoding.bundle.loading.choose_dtype`) and training
(`training.trainer.TrainerConfig.choose_precision`) alike."""
from __future__ import annotations

import functools
from pathlib import Path

import torch


def resolve_device(name: str) -> str:
    """"auto" is "cuda" when a GPU is visible, else "cpu"; any other name is returned as given."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def device_name(device: str | torch.device) -> str:
    """What a measured time was measured on: "cuda: <GPU name>" or "cpu: <CPU model name>" (the
    architecture when /proc/cpuinfo names none)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    import platform
    from pathlib import Path

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{device.type}: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"{device.type}: {platform.processor() or platform.machine()}"


def _cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is no such file: not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def _torch_cpu_probe(name: str) -> bool | None:
    """torch's own answer (torch.cpu._is_<name>_supported, what its kernels dispatch on), None where this torch
    has no such probe."""
    probe = getattr(torch.cpu, f"_is_{name}_supported", None)
    if probe is None:
        return None
    try:
        return bool(probe())
    except RuntimeError:
        return None


@functools.lru_cache(maxsize=1)
def cpu_bf16_units() -> tuple[str, ...]:
    """The bf16 units of this CPU by name ("avx512_bf16", "AMX"), () where it has none: asked of torch
    (`torch.cpu._is_avx512_bf16_supported`, `_is_amx_tile_supported`), else of /proc/cpuinfo's flags
    (avx512_bf16, amx_bf16). AMX tiles without amx_bf16 in the flags do not count."""
    flags = _cpu_flags()
    avx, tiles = _torch_cpu_probe("avx512_bf16"), _torch_cpu_probe("amx_tile")
    has_avx = avx if avx is not None else "avx512_bf16" in flags
    # tiles are AMX's registers; bf16 products on them are the amx_bf16 flag (every AMX CPU so far has it)
    has_amx = ("amx_bf16" in flags and tiles is not False) if flags else bool(tiles)
    return tuple(name for name, has in (("avx512_bf16", has_avx), ("AMX", has_amx)) if has)


@functools.lru_cache(maxsize=1)
def cpu_fp16_units() -> bool:
    """Whether torch runs float16 matrix products on this CPU in hardware (oneDNN on avx512_fp16 or AMX-FP16:
    `torch.ops.mkldnn._is_mkldnn_fp16_supported`, else the avx512_fp16 / amx_fp16 flags). Without them its
    generic kernels convert every element: with oneDNN turned off here, an 896 x 4864 linear layer took 1.3x
    fp32's time at one row and 2.2x at five (fastest of 195 interleaved calls, two runs)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return bool({"avx512_fp16", "amx_fp16"} & _cpu_flags())
