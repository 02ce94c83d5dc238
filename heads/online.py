"""Head training without a feature cache: the frozen drafter recomputes its hidden states every epoch.

For drafters whose cached features would not fit on disk or in memory (a 68M drafter on a large
prompt set caches H floats per response token). Each epoch walks the acceptance sequences in a seeded
order, runs the drafter on (prompt, Z) in small batches, and yields (features, labels) head batches
of the Y positions only: the same inputs the cache would hold, at the price of one draft forward per
sequence per epoch (benchmarks/training/bench_heads_online.py measures that price).
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import IterableDataset

from specdraft.core.errors import InputError
from specdraft.drafters.alignment import response_hidden
from specdraft.drafters.data import CausalLMCollator


class OnlineFeatures(IterableDataset):
    """rows: {"id", "prompt_ids", "z_ids", "from_y", "accept_prob"} per acceptance sequence."""

    def __init__(self, drafter, rows: list[dict], pad_token_id: int, batch_size: int = 32,
                 sequences_per_forward: int = 16, max_length: int | None = None, seed: int = 0):
        self.drafter, self.rows, self.batch_size = drafter.eval(), rows, batch_size
        self.per_forward, self.seed, self.epoch = sequences_per_forward, seed, 0
        self.collate = CausalLMCollator(pad_token_id=pad_token_id, max_length=max_length)
        # positions the collator keeps (long prompts lose tokens from the left, never the response)
        self.n_positions = sum(sum(r["from_y"]) for r in rows)
        if self.n_positions == 0:
            raise InputError("no Y positions in the acceptance sequences; rebuild acceptance-data")

    def __len__(self) -> int:
        return math.ceil(self.n_positions / self.batch_size)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        self.epoch += 1
        order = torch.randperm(len(self.rows), generator=g).tolist()
        feats, labels = [], []
        for start in range(0, len(order), self.per_forward):
            chunk = [self.rows[i] for i in order[start:start + self.per_forward]]
            batch = self.collate([{"prompt_ids": r["prompt_ids"], "response_ids": r["z_ids"]} for r in chunk])
            hidden = response_hidden(self.drafter, batch).split(batch["loss_mask"].sum(1).tolist())
            for r, h in zip(chunk, hidden):
                from_y = torch.tensor(r["from_y"][: len(h)], dtype=torch.bool)
                if not torch.isfinite(h).all():
                    raise InputError(f"drafter hidden states are NaN/inf on example {r['id']}; check the drafter")
                feats.append(h[from_y])
                labels.append(torch.tensor(r["accept_prob"][: len(h)], dtype=torch.float32)[from_y])
            f, y = torch.cat(feats), torch.cat(labels)
            while len(f) >= self.batch_size:
                yield f[: self.batch_size], y[: self.batch_size]
                f, y = f[self.batch_size:], y[self.batch_size:]
            feats, labels = [f], [y]
        f, y = torch.cat(feats), torch.cat(labels)
        if len(f):
            yield f, y


@torch.no_grad()
def compute_features(drafter, rows: list[dict], pad_token_id: int, max_length: int | None = None,
                     sequences_per_forward: int = 16) -> torch.Tensor:
    """Hidden states at the Y positions of `rows`, in row order: what acceptance-data would cache, (M, H)."""
    collate = CausalLMCollator(pad_token_id=pad_token_id, max_length=max_length)
    out = []
    for start in range(0, len(rows), sequences_per_forward):
        chunk = rows[start:start + sequences_per_forward]
        batch = collate([{"prompt_ids": r["prompt_ids"], "response_ids": r["z_ids"]} for r in chunk])
        for r, h in zip(chunk, response_hidden(drafter, batch).split(batch["loss_mask"].sum(1).tolist())):
            out.append(h[torch.tensor(r["from_y"][: len(h)], dtype=torch.bool)])
    return torch.cat(out)
