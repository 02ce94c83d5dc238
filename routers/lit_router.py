"""Training the prompt-classifier router with Lightning (cross-entropy, Adam).

The target's embedding table is frozen, so each prompt's pooled embedding is computed once
(`routers.router.mean_pooled`) and the classifier trains on (features (N, H), labels (N,)), where a
label is an index into the router's drafter list. The Trainer comes from `training.trainer`
(`build_trainer` + `fit`), like every other training stage: checkpoints, resume, loggers, Slurm.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from specdraft.core.errors import InputError
from specdraft.drafters.data import ResumableBatchSampler, ResumableDataLoader
from specdraft.heads.lit_head import cpu_threads
from specdraft.routers.router import PromptClassifierRouter
from specdraft.training.trainer import TrainerConfig, build_trainer, fit


class PooledPromptData(L.LightningDataModule):
    """Seeded, resumable batches of (pooled embedding (B, H), label (B,)); optional validation set."""

    def __init__(self, train: tuple[torch.Tensor, torch.Tensor], val: tuple[torch.Tensor, torch.Tensor] | None = None,
                 batch_size: int = 32, seed: int = 0):
        super().__init__()
        self.train_set = TensorDataset(*train)
        self.val_set = TensorDataset(*val) if val is not None and len(val[0]) else None
        self.batch_size, self.seed = batch_size, seed

    def _rank_world(self) -> tuple[int, int]:
        t = self.trainer
        return (t.global_rank, t.world_size) if t is not None else (0, 1)

    def train_dataloader(self) -> ResumableDataLoader:
        rank, world = self._rank_world()
        sampler = ResumableBatchSampler(len(self.train_set), self.batch_size, self.seed, True, False, rank, world)
        return ResumableDataLoader(self.train_set, sampler)

    def val_dataloader(self):
        if self.val_set is None:
            return []
        rank, world = self._rank_world()
        sampler = ResumableBatchSampler(len(self.val_set), self.batch_size, shuffle=False, rank=rank, world_size=world)
        return torch.utils.data.DataLoader(self.val_set, batch_sampler=sampler)


class RouterModule(L.LightningModule):
    """Cross-entropy on drafter labels. Logs train/loss per step, val/loss and val/accuracy per epoch."""

    def __init__(self, router: PromptClassifierRouter, lr: float = 1e-3):
        super().__init__()
        if not lr > 0:
            raise InputError(f"router lr must be > 0, got {lr}")
        self.router, self.lr = router, lr

    def training_step(self, batch, batch_idx):
        features, labels = batch
        loss = F.cross_entropy(self.router(features), labels)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        logits = self.router(features)
        n = len(labels)
        self.log("val/loss", F.cross_entropy(logits, labels), batch_size=n)
        self.log("val/accuracy", (logits.argmax(-1) == labels).float().mean(), batch_size=n, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.router.parameters(), lr=self.lr)


def train_classifier(
    features: torch.Tensor,
    labels: torch.Tensor,
    drafters: Sequence[str],
    out_dir: str | Path,
    train: TrainerConfig,
    hidden: int = 128,
    lr: float = 1e-3,
    val: tuple[torch.Tensor, torch.Tensor] | None = None,
    seed: int = 0,
) -> tuple[PromptClassifierRouter, dict]:
    """Fit a PromptClassifierRouter on pooled features (N, H) and labels (N,) in 0..len(drafters)-1.

    Returns the trained router (CPU, eval mode) and {"steps", "train_loss", "train_accuracy"}.
    """
    if features.ndim != 2 or labels.shape != features.shape[:1] or len(labels) == 0:
        raise InputError(f"router training needs features (N, H) and labels (N,) with N >= 1, got "
                         f"{tuple(features.shape)} and {tuple(labels.shape)}")
    if int(labels.min()) < 0 or int(labels.max()) >= len(drafters):
        raise InputError(f"router labels must lie in 0..{len(drafters) - 1} (one per drafter), got {labels.unique().tolist()}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        router = PromptClassifierRouter(features.shape[1], drafters, hidden).standardize_with(features)
    module = RouterModule(router, lr)
    cfg = dataclasses.replace(train, seed=seed)
    data = PooledPromptData((features.float(), labels.long()), val and (val[0].float(), val[1].long()),
                            cfg.batch_size, seed)
    trainer = build_trainer(cfg, out_dir)
    on_cpu = cfg.accelerator == "cpu" or not torch.cuda.is_available()
    with cpu_threads(1 if on_cpu else None):  # a small MLP runs fastest on one uncontended thread
        fit(trainer, module, data, cfg)
    router = module.router.cpu().eval()
    with torch.no_grad():
        logits = router(features.float())
        stats = {"steps": trainer.global_step,
                 "train_loss": round(float(F.cross_entropy(logits, labels.long())), 4),
                 "train_accuracy": round(float((logits.argmax(-1) == labels).float().mean()), 4)}
    return router, stats
