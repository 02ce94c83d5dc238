"""Batches for causal-LM training: collation with a precise loss mask, and a resumable data order.

Batch layout (right padding), all (B, T):
    input_ids       token ids, pad_token_id after the end
    attention_mask  1 on real tokens
    loss_mask       1 at position t when token t+1 is a token we train on. Position t's logits
                    predict token t+1, so for prompt P and response R (lengths p, r) the mask covers
                    positions p-1 .. p+r-2: the last prompt token predicts the first response token,
                    and the last response token predicts nothing (nothing follows it in the example).
and, when the examples carry a cached teacher top-k (one row per trained-on token, in order),
    teacher_topk_ids, teacher_topk_logprobs   (B, T, k), rows placed at the loss_mask positions;
or, when they carry the teacher's cached logits (drafters.lit_lm.teacher_logits_per_example),
    teacher_logits  (N, V): every example's rows stacked in loss_mask order (row-major over (b, t)),
                    the order in which `losses.gather_positions` reads a live teacher's logits;
and, from a stored teacher signal (drafters/teacher_signal.py),
    ce_targets      (B, T) the token ce trains on at each loss_mask position (0 elsewhere);
    teacher_features (B, T, F) the target's hidden states an EAGLE drafter reads, one row per token (0 on pads).

Exact resume: Lightning 2.x saves `state_dict()` of any train DataLoader that has `state_dict` /
`load_state_dict` (fit_loop "combined_loader" state) and, on restart, adds the restored batch count to
its fetch counter, expecting the loader to yield only the remaining batches of the epoch. Because the
loader has a length, Lightning does not prefetch, so "batches yielded" equals "batches trained on"
when a checkpoint is written. `ResumableDataLoader` implements exactly that contract.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler

from specdraft.core.errors import InputError

TOPK_IDS, TOPK_LOGPROBS = "teacher_topk_ids", "teacher_topk_logprobs"
TEACHER_LOGITS = "teacher_logits"
CE_TARGETS, TEACHER_FEATURES = "ce_targets", "teacher_features"


def fit_to_length(prompt: Sequence[int], response: Sequence[int], max_length: int) -> tuple[list, list, int]:
    """Fit prompt + response into max_length tokens. Long prompts lose tokens from the left (the
    context nearest the response is kept); a response that alone does not fit keeps one prompt token
    to predict its first token and is cut on the right. Returns (prompt, response, prompt tokens dropped)."""
    prompt, response = list(prompt), list(response)
    if max_length < 2:
        raise InputError(f"max_length must be >= 2, got {max_length}")
    overflow = len(prompt) + len(response) - max_length
    if overflow <= 0:
        return prompt, response, 0
    keep = max(max_length - len(response), min(1, len(prompt)))
    dropped = len(prompt) - keep
    prompt = prompt[dropped:]
    response = response[: max_length - len(prompt)]
    return prompt, response, dropped


@dataclass
class CausalLMCollator:
    """Turns examples into a right-padded batch (see the module docstring for the layout).

    An example is either {"prompt_ids", "response_ids"} (loss on the response only) or {"input_ids"}
    (plain LM pretraining, loss on every next token; cut on the right at max_length).
    """

    pad_token_id: int
    max_length: int | None = None

    def _layout(self, ex: dict) -> tuple[list[int], int, int]:
        """-> (ids, first loss position, number of loss positions)."""
        if "prompt_ids" in ex:
            prompt, response = ex["prompt_ids"], ex["response_ids"]
            if self.max_length is not None:
                prompt, response, _ = fit_to_length(prompt, response, self.max_length)
            ids = list(prompt) + list(response)
            # with an empty prompt the first response token has no predicting position
            start = max(len(prompt) - 1, 0)
            n = len(response) - (1 if len(prompt) == 0 and len(response) else 0)
            return ids, start, n
        if "input_ids" in ex:
            ids = list(ex["input_ids"])[: self.max_length]
            return ids, 0, max(len(ids) - 1, 0)
        raise InputError(
            f"example has keys {sorted(ex)}; it needs prompt_ids + response_ids, or input_ids"
        )

    def positions(self, ex: dict) -> int:
        """How many positions of `ex` are trained on (its loss-mask ones), after fitting to max_length."""
        return self._layout(ex)[2]

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        layouts = [self._layout(ex) for ex in examples]
        B, T = len(examples), max(max(len(ids) for ids, _, _ in layouts), 1)
        input_ids = torch.full((B, T), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros(B, T, dtype=torch.long)
        loss_mask = torch.zeros(B, T, dtype=torch.long)
        for b, (ids, start, n) in enumerate(layouts):
            input_ids[b, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[b, : len(ids)] = 1
            loss_mask[b, start : start + n] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
        if TOPK_IDS in examples[0]:
            batch.update(self._topk(examples, layouts, T))
        if CE_TARGETS in examples[0]:
            batch[CE_TARGETS] = self._at_loss_positions(examples, layouts, T, CE_TARGETS)
        if TEACHER_FEATURES in examples[0]:
            batch[TEACHER_FEATURES] = self._features(examples, layouts, T)
        if TEACHER_LOGITS in examples[0]:
            for ex, (_, _, n) in zip(examples, layouts):
                if len(ex[TEACHER_LOGITS]) != n:
                    raise InputError(f"example has {len(ex[TEACHER_LOGITS])} cached teacher logit rows for {n} "
                                     "trained-on tokens; cache them with the collator's max_length")
            batch[TEACHER_LOGITS] = torch.cat([ex[TEACHER_LOGITS] for ex in examples])
        return batch

    def _topk(self, examples, layouts, T) -> dict[str, torch.Tensor]:
        return {TOPK_IDS: self._at_loss_positions(examples, layouts, T, TOPK_IDS, torch.long),
                TOPK_LOGPROBS: self._at_loss_positions(examples, layouts, T, TOPK_LOGPROBS, torch.float)}

    NAMES = {TOPK_IDS: "teacher top-k", TOPK_LOGPROBS: "teacher top-k", CE_TARGETS: "ce target"}

    @classmethod
    def _at_loss_positions(cls, examples, layouts, T, key: str, dtype=torch.long) -> torch.Tensor:
        """Per-example rows of `key` (one per trained-on token, in order) placed at the loss_mask positions."""
        first = torch.as_tensor(examples[0][key])
        out = torch.zeros(len(examples), T, *first.shape[1:], dtype=dtype)
        for b, (ex, (_, start, n)) in enumerate(zip(examples, layouts)):
            # rows are per trained-on token; an empty prompt has no position for the first one
            skip = 1 if "prompt_ids" in ex and len(ex["prompt_ids"]) == 0 else 0
            rows = torch.as_tensor(ex[key])[skip : skip + n]
            if len(rows) != n:
                raise InputError(f"example has {len(ex[key])} {cls.NAMES[key]} rows for {n + skip} trained-on tokens; "
                                 "cache one row per response token")
            out[b, start : start + n] = rows.to(dtype)
        return out

    @staticmethod
    def _features(examples, layouts, T) -> torch.Tensor:
        first = examples[0][TEACHER_FEATURES]
        out = torch.zeros(len(examples), T, first.shape[-1], dtype=first.dtype)
        for b, (ex, (ids, _, _)) in enumerate(zip(examples, layouts)):
            if len(ex[TEACHER_FEATURES]) != len(ids):
                raise InputError(f"example has {len(ex[TEACHER_FEATURES])} stored feature rows for {len(ids)} tokens; "
                                 "rerun stage teacher-data with the training max_length")
            out[b, : len(ids)] = ex[TEACHER_FEATURES]
        return out


class ResumableBatchSampler(Sampler[list[int]]):
    """Seeded, per-epoch shuffled batches of one rank's share of the data, resumable mid-epoch.

    Like DistributedSampler, the epoch's permutation is padded (wrapping around) to a multiple of
    world_size and rank r takes every world_size-th index from r, so every rank has the same number of
    batches. The permutation depends only on (seed, epoch), so a resumed run sees the same order.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ):
        if n < 1:
            raise InputError("training dataset is empty; check the data path and filters")
        if batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {batch_size}")
        self.n, self.batch_size, self.seed, self.shuffle, self.drop_last = n, batch_size, seed, shuffle, drop_last
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.start = 0  # batches of this epoch to skip (already trained on before a resume)
        # Lightning calls set_epoch on `loader.sampler` and `loader.batch_sampler.sampler` only
        self.sampler = self

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:  # Lightning calls this again for the epoch we resumed into
            self.epoch, self.start = epoch, 0

    def _per_rank(self) -> int:
        return math.ceil(self.n / self.world_size)

    def __len__(self) -> int:
        m = self._per_rank()
        return m // self.batch_size if self.drop_last else math.ceil(m / self.batch_size)

    def epoch_indices(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        total = self._per_rank() * self.world_size
        order = (order * math.ceil(total / self.n))[:total]
        return order[self.rank :: self.world_size]

    def __iter__(self):
        idx = self.epoch_indices()
        for b in range(self.start, len(self)):
            yield idx[b * self.batch_size : (b + 1) * self.batch_size]


class ResumableDataLoader(DataLoader):
    """A DataLoader over a ResumableBatchSampler whose position Lightning checkpoints (see module doc)."""

    def __init__(self, dataset, batch_sampler: ResumableBatchSampler, **kwargs):
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self._done = 0  # batches of the current epoch handed out

    def __iter__(self):
        sampler: ResumableBatchSampler = self.batch_sampler
        self._done = sampler.start
        for batch in super().__iter__():
            self._done += 1
            yield batch
        sampler.start = 0  # a finished epoch is not resumed into again

    def state_dict(self) -> dict[str, Any]:
        s: ResumableBatchSampler = self.batch_sampler
        return {"epoch": s.epoch, "batches_done": self._done, "seed": s.seed, "world_size": s.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        s: ResumableBatchSampler = self.batch_sampler
        if state["world_size"] != s.world_size:
            raise InputError(
                f"checkpoint was written with {state['world_size']} data-parallel ranks, now {s.world_size}; "
                "resume with the same devices x num_nodes, or start without resume"
            )
        s.epoch, s.start, s.seed = state["epoch"], state["batches_done"], state["seed"]
        self._done = s.start


class CausalLMDataModule(L.LightningDataModule):
    """Train (and optional validation) loaders over a `datasets.Dataset` or a list of example dicts.

    Needs `Trainer(use_distributed_sampler=False)` (as `training.trainer.build_trainer` sets): the
    batch sampler shards over ranks itself, so its position can be checkpointed.
    """

    def __init__(
        self,
        train,
        collate: CausalLMCollator,
        batch_size: int = 8,
        val=None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        num_workers: int = 0,
    ):
        super().__init__()
        self.train_data, self.val_data, self.collate = train, val, collate
        self.batch_size, self.seed, self.shuffle, self.drop_last = batch_size, seed, shuffle, drop_last
        self.num_workers = num_workers

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer  # None when used outside a Trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> ResumableDataLoader:
        rank, world = self._rank_world()
        sampler = ResumableBatchSampler(
            len(self.train_data), self.batch_size, self.seed, self.shuffle, self.drop_last, rank, world
        )
        return ResumableDataLoader(
            self.train_data, sampler, collate_fn=self.collate, num_workers=self.num_workers
        )

    def val_dataloader(self):
        if self.val_data is None:
            return []
        rank, world = self._rank_world()
        sampler = ResumableBatchSampler(len(self.val_data), self.batch_size, shuffle=False, rank=rank, world_size=world)
        return DataLoader(self.val_data, batch_sampler=sampler, collate_fn=self.collate, num_workers=self.num_workers)
