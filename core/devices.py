"""Device names from the config: the one place "auto" is resolved."""
from __future__ import annotations

import torch


def resolve_device(name: str) -> str:
    """"auto" is "cuda" when a GPU is visible, else "cpu"; any other name is returned as given."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name
