"""The SpecDec++ acceptance head (paper §4.3, §5.1).

The head reads the drafter's final hidden state e_i at draft token y_i and returns one logit;
sigmoid(logit) predicts P(y_i accepted | y_<i accepted) = min(1, p(y_i) / q(y_i)).

Architecture: a (D+1)-layer residual MLP, D residual blocks x + SiLU(W x) then Linear(H, 1).
D = 0 is a plain linear layer. The blocks are D *independent* modules: the reference code's
`[ResBlock(h)] * D` repeats one module, silently sharing weights; `tie_blocks=True` asks for that
sharing explicitly (one block applied D times).

Pure PyTorch (no Lightning): the decoder imports this module. Weights are saved as safetensors with a
JSON config beside them; nothing is ever unpickled.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdraft.core.errors import InputError
from specdraft.decoding.checkpoint import CheckpointFormat

WEIGHTS_NAME = "head.safetensors"
CONFIG_NAME = "head_config.json"
FORMAT = "specdraft-acceptance-head/1"
# Keys of head_config.json owned by the head itself; everything else comes from `meta`.
CHECKPOINT = CheckpointFormat("acceptance head", "train-heads", WEIGHTS_NAME, CONFIG_NAME, FORMAT,
                              ("format", "hidden_size", "depth", "tie_blocks"))


class ResidualBlock(nn.Module):
    """x + SiLU(W x), W: Linear(H, H)."""

    def __init__(self, hidden_size: int, zero_init: bool = False):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        if zero_init:  # the block starts as the identity
            nn.init.zeros_(self.linear.weight)
            nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class AcceptanceHead(nn.Module):
    """(..., H) hidden states -> (...,) float acceptance logits."""

    def __init__(self, hidden_size: int, depth: int, tie_blocks: bool = False, zero_init: bool = False):
        super().__init__()
        if hidden_size < 1:
            raise InputError(f"head hidden_size must be >= 1, got {hidden_size}")
        if depth < 0:
            raise InputError(f"head depth D must be >= 0 (0 is a linear head), got {depth}")
        self.hidden_size = hidden_size
        self.depth = depth
        self.tie_blocks = tie_blocks
        n_modules = min(depth, 1) if tie_blocks else depth
        self.blocks = nn.ModuleList(ResidualBlock(hidden_size, zero_init) for _ in range(n_modules))
        self.out = nn.Linear(hidden_size, 1)

    def block(self, i: int) -> ResidualBlock:
        """The module applied as the i-th of the D residual blocks."""
        return self.blocks[0 if self.tie_blocks else i]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # functional calls on the parameters read from the modules' own dicts, not through submodule calls or
        # nn.Module attribute lookups: the decoder calls the head once per draft token, and on CPU those took
        # ~30% of its time (69 -> 47 us per call measured, D = 4, H = 128, batch 1; module calls cost more still)
        mods = self._modules
        out = mods["out"]._parameters
        x = hidden.to(out["weight"].dtype)  # features are cached in fp16; the head runs in its own dtype
        blocks = list(mods["blocks"]._modules.values())
        for i in range(self.depth):
            lin = blocks[0 if self.tie_blocks else i]._modules["linear"]._parameters
            x = x + nn.functional.silu(nn.functional.linear(x, lin["weight"], lin["bias"]))
        return nn.functional.linear(x, out["weight"], out["bias"]).squeeze(-1).float()  # (...,)

    def config(self) -> dict[str, Any]:
        return {"format": FORMAT, "hidden_size": self.hidden_size, "depth": self.depth, "tie_blocks": self.tie_blocks}


def save_head(head: AcceptanceHead, out_dir: str | os.PathLike, meta: dict[str, Any] | None = None) -> Path:
    """Write `head.safetensors` and `head_config.json` into out_dir (created if needed).

    `meta` is stored verbatim beside the architecture (it must be JSON-serialisable). The stages put
    there what a decoder needs to use the head correctly: `drafter_path`, `drafter_hash` (checked by
    `load_head`), `w_rej`, `label_transform` ({temperature, top_k, top_p} the labels were made with),
    `threshold` (the chosen h), metrics. It cannot override the architecture keys.
    """
    return CHECKPOINT.save(head, head.config(), out_dir, meta)


def load_head(
    head_dir: str | os.PathLike,
    expected_hidden_size: int | None = None,
    expected_drafter_hash: str | None = None,
) -> tuple[AcceptanceHead, dict[str, Any]]:
    """Load a head saved by `save_head` -> (head in eval mode, full config dict).

    Raises InputError on a missing or corrupt file, or when the head does not fit the drafter it is
    meant for (hidden size or drafter content hash differ).
    """
    d = Path(head_dir)
    config = CHECKPOINT.read_config(d)
    hidden_size, depth, tie = CHECKPOINT.arch(d, config, hidden_size="int", depth="int", tie_blocks="bool")
    CHECKPOINT.check_format(d, config)
    if expected_hidden_size is not None and hidden_size != expected_hidden_size:
        raise InputError(
            f"acceptance head {d} reads hidden size {hidden_size} but the drafter has {expected_hidden_size}; "
            "use the head trained for this drafter"
        )
    if expected_drafter_hash is not None and config.get("drafter_hash") != expected_drafter_hash:
        raise InputError(
            f"acceptance head {d} was trained on drafter hash {config.get('drafter_hash')!r}, not "
            f"{expected_drafter_hash!r}; retrain the head (train-heads) for this drafter"
        )
    head = AcceptanceHead(hidden_size, depth, tie_blocks=tie)
    CHECKPOINT.load_weights(head, d)
    return head.eval(), config
