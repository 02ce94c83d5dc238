"""Device names from the config: the one place "auto" is resolved."""
from __future__ import annotations

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
