"""Loading models and tokenizers for generation: dtype, device placement and bitsandbytes quantization.

The target may be spread over several GPUs (`device_map="auto"` or an explicit map, through
accelerate); drafters and heads sit on one named device. Weights load from safetensors only
(`use_safetensors=True`: nothing is unpickled) and `trust_remote_code` stays off unless asked for.

`dtype: auto` picks what runs fastest on the device at hand (`choose_dtype`): bf16 on a CUDA device that has
it, and on a CPU with bf16 units (avx512_bf16 or AMX), fp32 on any other CPU. Why the CPU matters: a decode step
streams the weights, and in bf16 on a CPU with bf16 units a (K + 1)-token verify costs about one one-token
forward (Qwen2.5-Coder-0.5B, 2 threads of an Intel Xeon: fp32 87 ms one token / 195 ms five; bf16 101 / 88 ms),
where fp32's matrix-matrix kernels at a few rows cost two forwards; without those units torch computes bf16
through conversions and fp32 is the faster choice (docs/decoder.md, "Which dtype").

A drafter loaded for inference (`load_drafter`) may also take int8 weights (`decoding.draft_weights`): its
proposals are verified by the target, so they need not be exact, and on a CPU a one-row draft step that streams
half the bytes costs two thirds of the time (decoding/rounds/int8_linear.py). "auto" takes them where the pair
runs bf16 on a CPU's bf16 units, the machines it was measured on; a target is never quantized by it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdraft.core.devices import cpu_bf16_units, cpu_fp16_units
from specdraft.core.errors import InputError
from specdraft.decoding.defaults import DEFAULTS, DRAFT_WEIGHTS
from specdraft.decoding.rounds.int8_linear import can_quantize, quantize_linears
from specdraft.decoding.rounds.packed_linear import can_pack, pack_linears

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICE_TYPES = ("cpu", "cuda", "mps")  # where the decoder and the stages run


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a model runs in and why: what `--verbose`, `specdraft predict` and the evaluate report say."""

    dtype: torch.dtype
    reason: str  # e.g. "auto: this CPU has avx512_bf16/AMX", "as given"

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def line(self) -> str:
        """One line: "dtype bfloat16 (auto: this CPU has avx512_bf16/AMX)"."""
        return f"dtype {self.name} ({self.reason})"


def _device_type(device: str | torch.device | None) -> str | None:
    return None if device is None else torch.device(device).type


def choose_dtype(dtype: str, device: str | torch.device | None = None) -> DtypeChoice:
    """The dtype `dtype` means on `device` (None: placed by a device_map, CUDA when there is one) and why.
    "auto": bf16 on a CUDA device that supports it and on a CPU with bf16 units (`cpu_bf16_units`), fp32
    elsewhere (a CPU without them computes bf16 through conversions; mps: fp32). An explicit float16 on a
    CPU without float16 units is refused (`cpu_fp16_units`): it would run, slower than float32, so
    nobody asking for it gets what they asked for."""
    kind = _device_type(device)
    if dtype == "auto":
        if (kind in (None, "cuda")) and torch.cuda.is_available():
            if torch.cuda.is_bf16_supported():
                return DtypeChoice(torch.bfloat16, "auto: this CUDA device has bf16")
            return DtypeChoice(torch.float32, "auto: this CUDA device has no bf16")
        if kind in (None, "cpu"):
            units = cpu_bf16_units()
            if units:
                return DtypeChoice(torch.bfloat16, f"auto: this CPU has {'/'.join(units)}")
            return DtypeChoice(torch.float32, "auto: this CPU has no bf16 units (avx512_bf16 or AMX)")
        return DtypeChoice(torch.float32, f"auto: float32 on {kind}")
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    if dtype == "float16" and kind == "cpu" and not cpu_fp16_units():
        raise InputError("dtype float16 on this CPU: it has no float16 units (avx512_fp16 or AMX-FP16), so torch "
                         "would convert every element and run slower than float32; use bfloat16"
                         + (" (this CPU has bf16 units)" if cpu_bf16_units() else "") + ", float32 or auto")
    return DtypeChoice(DTYPES[dtype], "as given")


def resolve_dtype(dtype: str, device: str | torch.device | None = None) -> torch.dtype:
    """The torch dtype of `choose_dtype`."""
    return choose_dtype(dtype, device).dtype


def dtype_of(model) -> str:
    """The dtype a loaded model computes in, by name: its input embeddings' (a quantized model's compute dtype:
    bitsandbytes leaves embeddings unquantized). A drafter loaded beside a target takes it, so the pair runs in
    one precision wherever `auto` resolved the target's."""
    return str(model.get_input_embeddings().weight.dtype).removeprefix("torch.")


def check_device(device: str, option: str = "--device") -> str:
    """`device` if this machine can run models on it, else InputError naming `option` and what to give instead
    (before any model loads): a name torch does not know ("tpu9"), a type the decoder does not run on, or a
    CUDA / mps device this machine does not have."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"{option} {device!r} is not a device name; give cpu, cuda, cuda:N, mps or auto") from None
    if dev.type not in DEVICE_TYPES:
        raise InputError(f"{option} {device!r}: models run on {', '.join(DEVICE_TYPES)} here, not {dev.type}; "
                         "give cpu, cuda, cuda:N, mps or auto")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = "a CPU-only torch build" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
            raise InputError(f"{option} {device}: this machine has no CUDA device ({build}); use --device cpu or auto")
        if dev.index is not None and dev.index >= count:
            raise InputError(f"{option} {device}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"{option} {device}: this machine has no mps device; use --device cpu or auto")
    return device


def quantization_config(quantization: str, compute_dtype: torch.dtype):
    if quantization == "none":
        return None
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quantization == "nf4":
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
    raise InputError(f"quantization {quantization!r} is not one of none, int8, nf4")


def _check_local_or_hub(name_or_path: str) -> bool:
    """True for a local model directory (checked: config.json and safetensors weights), False for a hub id."""
    p = Path(name_or_path)
    looks_local = p.is_absolute() or name_or_path.startswith((".", "~")) or p.exists()
    if not looks_local:
        return False
    if not (p / "config.json").is_file():
        raise InputError(f"'{name_or_path}' is not a model directory (no config.json); point to a save_pretrained dir")
    if not any(p.glob("*.safetensors")):
        raise InputError(f"'{name_or_path}' has no .safetensors weights; convert the checkpoint with "
                         "save_pretrained(safe_serialization=True)")
    return True


def load_causal_lm(
    name_or_path: str | Path,
    dtype: str = "auto",
    device: str | None = None,
    device_map: str | dict | None = None,
    quantization: str = "none",
    trust_remote_code: bool = False,
    max_memory: dict | None = None,
    revision: str | None = None,
    pack: bool = True,
) -> Any:
    """An eval-mode causal LM for inference. pack: in bf16 on a CPU with bf16 units, its linear layers packed
    (`rounds.packed_linear.pack_linears`: 1.2-1.3x faster steps; pack=False for code that trains or rewrites the
    linears' weights in place; saving a packed model writes its plain weights). `device_map` (multi-GPU)
    wins over `device`; quantized models are placed by bitsandbytes/accelerate (device_map defaults to the named
    device, else CPU). `max_memory` ({0: bytes or "10GiB", "cpu": ...}) caps what device_map="auto" puts on each
    device."""
    from transformers import AutoModelForCausalLM

    name_or_path = str(name_or_path)
    local = _check_local_or_hub(name_or_path)
    if device is not None:
        check_device(str(device), "device")
    torch_dtype = resolve_dtype(dtype, device)
    kwargs: dict[str, Any] = dict(dtype=torch_dtype, trust_remote_code=trust_remote_code, use_safetensors=True,
                                  local_files_only=local)
    if revision is not None:  # a hub id's pinned commit
        kwargs["revision"] = revision
    qcfg = quantization_config(quantization, torch_dtype)
    if qcfg is not None:
        kwargs["quantization_config"] = qcfg
        kwargs["device_map"] = device_map or {"": device or "cpu"}
    elif device_map is not None:
        kwargs["device_map"] = device_map
    if max_memory is not None and "device_map" in kwargs:
        kwargs["max_memory"] = max_memory
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except OSError as e:
        raise InputError(f"cannot load a causal LM from '{name_or_path}' ({str(e).splitlines()[0][:160]}); "
                         "check the path and that it holds safetensors weights") from None
    if qcfg is None and device_map is None and device is not None:
        model = model.to(device)
    if pack and qcfg is None and device_map is None:
        pack_linears(model)  # bf16 on a CPU: its linears' weights in oneDNN's layout (rounds/packed_linear.py)
    return model.eval()


def choose_draft_weights(draft_weights: str, dtype: torch.dtype, device_type: str) -> str:
    """"int8" or "dtype": what `draft_weights` means for a drafter in `dtype` on `device_type`. auto: int8 where
    bf16 runs on a CPU's bf16 units (where packed layers run; measured there), the dtype's weights elsewhere; an
    explicit int8 off a CPU is refused (the kernel is the CPU's)."""
    if draft_weights not in DRAFT_WEIGHTS:
        raise InputError(f"draft_weights {draft_weights!r} is not one of {', '.join(DRAFT_WEIGHTS)}")
    if draft_weights == "auto":
        return "int8" if can_pack(dtype, device_type) else "dtype"
    if draft_weights == "int8" and not can_quantize(dtype, device_type):
        raise InputError(f"draft_weights int8 runs on a CPU in bfloat16 or float32, not {device_type} in "
                         f"{str(dtype).removeprefix('torch.')}; use draft_weights auto or dtype")
    return draft_weights


def load_drafter(path: str | Path, dtype: str, device: str | None = None,
                 draft_weights: str = DEFAULTS.draft_weights) -> Any:
    """A drafter for inference: `load_causal_lm`, then int8 weights where `choose_draft_weights` says so. Every
    stage that runs a drafter to propose or to label what it proposes loads it here, so the heads' features, the
    cost ratio and the router's labels are the served drafter's."""
    model = load_causal_lm(path, dtype, device, pack=False)
    weight = model.get_input_embeddings().weight
    if choose_draft_weights(draft_weights, weight.dtype, weight.device.type) == "int8":
        quantize_linears(model)  # from the plain weights, before packing: no unpacked copy in passing
    pack_linears(model)  # the wrapped layers too: a wide call runs as fast as the plain drafter's
    return model


# tokenizer_config.json classes meaning "the tokenizer.json as saved": loaded as such, whatever the model
# type. AutoTokenizer would pick the model family's class (e.g. Qwen2Tokenizer beside a Qwen2 config),
# which adds that family's default special tokens: a target and a drafter of different families would
# then disagree on a tokenizer they share.
def load_tokenizer(name_or_path: str | Path, trust_remote_code: bool = False, revision: str | None = None):
    from specdraft.core.tokenizers import tokenizer_class_for

    loader = tokenizer_class_for(name_or_path)
    try:
        tok = loader.from_pretrained(str(name_or_path), trust_remote_code=trust_remote_code,
                                            **({"revision": revision} if revision is not None else {}))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot load a tokenizer from '{name_or_path}' ({str(e).splitlines()[0][:160]})") from None
    if tok.pad_token_id is None:  # batched generation needs one; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    return tok
