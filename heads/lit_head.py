"""Training SpecDec++ acceptance heads on cached drafter features with Lightning.

The drafter is frozen, so its final hidden states at the Y positions are computed once (the
`acceptance-data` stage caches them, fp16) and the heads train on (features (M, H), labels (M,)).
Paper recipe (SpecDec++ §5.1): Adam, cosine schedule, lr 5e-5, 3 epochs, batch 32.

The paper's grid D x w_rej is 20 heads that read the same features. `AcceptanceHeadsModule` trains
any number of them in one Lightning run (built by the shared `training.trainer.build_trainer`): heads
of equal depth are stacked into one `StackedHeads`, the one `AcceptanceHead` definition vmapped over
stacked parameters, so a training step costs a handful of batched kernels instead of ~60 small ones.
The heads share no parameters, the loss is the sum of the per-head losses and Adam acts per element,
so this is exactly separate training runs that see the same batch order (a test checks it). On the
2-core CPU box stacked heads trained 4.5-6x faster than 20 separate runs (benchmarks/training/bench_heads.py,
measured with the earlier hand-written batched matmuls); tiny matmuls also run faster on one thread
than on two contended ones, hence `HeadTrainConfig.cpu_threads`.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Sequence

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset

from specdraft.core.errors import InputError
from specdraft.training.trainer import TrainerConfig, build_trainer
from specdraft.decoding.policies.acceptance_head import AcceptanceHead
from specdraft.heads.losses import weighted_bce_terms
from specdraft.heads.metrics import binary_kl_terms, head_metrics

DEPTHS = (0, 1, 2, 3, 4)
W_REJS = (1.0, 3.0, 6.0, 12.0)


@dataclass
class HeadTrainConfig:
    lr: float = 5e-5
    epochs: int = 3
    batch_size: int = 32
    eval_batch_size: int = 8192
    w_acc: float = 1.0
    tie_blocks: bool = False
    zero_init: bool = False
    seed: int = 0  # head initialisation and batch order
    cpu_threads: int | None = 1  # torch threads while training on CPU (None: leave as is); small heads run best on 1
    # extra lightning.Trainer kwargs (accelerator, devices, logger, ...), applied over the defaults
    trainer: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HeadSpec:
    depth: int
    w_rej: float

    @property
    def name(self) -> str:
        return f"D{self.depth}_w{self.w_rej:g}"


def check_finite(features: torch.Tensor, labels: torch.Tensor, what: str = "features") -> None:
    """InputError naming the first example with NaN/inf features or a label outside [0, 1]."""
    if features.ndim != 2 or labels.shape != features.shape[:1]:
        raise InputError(
            f"{what}: expected features (M, H) and labels (M,), got {tuple(features.shape)} and {tuple(labels.shape)}"
        )
    bad_f = ~torch.isfinite(features).all(-1)
    bad_l = ~(torch.isfinite(labels) & (labels >= 0) & (labels <= 1))
    for bad, kind in ((bad_f, "NaN/inf in the cached features"), (bad_l, "a NaN/inf or out-of-[0, 1] label")):
        if bad.any():
            idx = int(bad.nonzero()[0])
            raise InputError(
                f"{what}: example {idx} has {kind} ({int(bad.sum())} such examples); rebuild acceptance-data"
            )


@contextmanager
def cpu_threads(n: int | None):
    """Temporarily run torch CPU ops on n threads (None: unchanged). The heads' matmuls are tiny, and
    on a shared 2-core box two contending threads made them ~5-10x slower than one (measured)."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _cosine(total_steps: int):
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(total_steps, 1)))


class StackedHeads(nn.Module):
    """G independent AcceptanceHeads of one architecture, run together: (B, H) -> (G, B) logits.

    One head definition (`AcceptanceHead`), its parameters stacked along a leading G axis
    (`torch.func.stack_module_state`) and the head's own forward vmapped over them
    (`torch.func.functional_call`): the layers become batched matmuls, a handful of kernels per step
    instead of ~60 small ones. `export` turns row g back into a plain AcceptanceHead.
    """

    def __init__(self, heads: Sequence[AcceptanceHead]):
        super().__init__()
        first = heads[0]
        self.hidden_size, self.depth, self.tie_blocks = first.hidden_size, first.depth, first.tie_blocks
        assert all((h.hidden_size, h.depth, h.tie_blocks) == (self.hidden_size, self.depth, self.tie_blocks)
                   for h in heads)
        params, _ = torch.func.stack_module_state(list(heads))
        self.names = list(params)  # "blocks.0.linear.weight", ...: ParameterDict keys cannot hold dots
        self.stacked = nn.ParameterList(nn.Parameter(params[n].detach().clone()) for n in self.names)
        # the definition the stacked parameters are called through (its own parameters are never used)
        self._definition = [AcceptanceHead(self.hidden_size, self.depth, self.tie_blocks).to("meta")]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        definition = self._definition[0]

        def one_head(params: tuple[torch.Tensor, ...], x: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(definition, dict(zip(self.names, params)), (x,))

        features = features.to(self.stacked[0].dtype)  # once, not once per head (cached features are fp16)
        return torch.vmap(one_head, in_dims=(0, None))(tuple(self.stacked), features)  # (G, B)

    @torch.no_grad()
    def export(self) -> list[AcceptanceHead]:
        heads = []
        for g in range(len(self.stacked[0])):
            head = AcceptanceHead(self.hidden_size, self.depth, tie_blocks=self.tie_blocks)
            head.load_state_dict({n: p[g].detach().clone() for n, p in zip(self.names, self.stacked)})
            heads.append(head.eval())
        return heads


class AcceptanceHeadsModule(pl.LightningModule):
    """One or more independent AcceptanceHeads trained with weighted BCE on the same batches.

    Batches are (features (B, H) any float dtype, labels (B,)); all rows are Y positions.
    Logs per epoch train/loss (mean over steps of the sum over heads) and, per head, eval/kl/<name>
    (unweighted binary KL on the validation data) and train/kl/<name> (over the epoch's training
    batches, with the weights of the moment).
    """

    def __init__(self, hidden_size: int, specs: Sequence[HeadSpec], cfg: HeadTrainConfig = HeadTrainConfig()):
        super().__init__()
        if not specs:
            raise InputError("no heads to train: give at least one (depth, w_rej)")
        for s in specs:
            if s.w_rej <= 0:
                raise InputError(f"w_rej must be > 0, got {s.w_rej}")
        self.specs, self.cfg = list(specs), cfg
        depths = sorted({s.depth for s in self.specs})
        groups = [[i for i, s in enumerate(self.specs) if s.depth == d] for d in depths]
        self.groups = nn.ModuleList(
            StackedHeads([AcceptanceHead(hidden_size, d, cfg.tie_blocks, cfg.zero_init) for _ in g])
            for d, g in zip(depths, groups)
        )
        order = [i for g in groups for i in g]  # spec index of each stacked row
        self.register_buffer("to_spec_order", torch.argsort(torch.tensor(order)), persistent=False)
        self.register_buffer("w_rej", torch.tensor([self.specs[i].w_rej for i in order])[:, None], persistent=False)
        self._sums: dict[str, torch.Tensor] = {}

    def stacked_logits(self, features: torch.Tensor) -> torch.Tensor:
        """(B, H) -> (n_heads, B), rows in group order (matching self.w_rej)."""
        return torch.cat([g(features) for g in self.groups])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(B, H) -> (n_heads, B) logits, rows in the order of `specs`."""
        return self.stacked_logits(features)[self.to_spec_order]

    def export_heads(self) -> list[AcceptanceHead]:
        """Trained heads as plain AcceptanceHeads, in the order of `specs`."""
        stacked = [h for g in self.groups for h in g.export()]
        return [stacked[int(i)] for i in self.to_spec_order]

    def _accumulate(self, prefix: str, logits: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.no_grad():  # summed binary KL per head; logits in group order
            kl = binary_kl_terms(logits, labels).sum(-1)  # (n_heads,)
            self._sums[prefix] = self._sums.get(prefix, 0) + kl
            self._sums[prefix + "_n"] = self._sums.get(prefix + "_n", 0) + labels.numel()

    def _log_epoch(self, prefix: str) -> None:
        if prefix not in self._sums:
            return
        kl = (self._sums.pop(prefix) / self._sums.pop(prefix + "_n"))[self.to_spec_order]
        for s, v in zip(self.specs, kl.tolist()):
            self.log(f"{prefix}/kl/{s.name}", v)

    def training_step(self, batch, batch_idx):
        features, labels = batch
        logits = self.stacked_logits(features)  # (n_heads, B)
        # sum over heads of each head's own mean weighted BCE: the heads' gradients do not mix
        loss = weighted_bce_terms(logits, labels, self.w_rej, self.cfg.w_acc).mean(-1).sum()
        self._accumulate("train", logits, labels)  # logged once per epoch: per-step self.log costs as much as the step
        self._sums["loss"] = self._sums.get("loss", 0) + loss.detach()
        self._sums["steps"] = self._sums.get("steps", 0) + 1
        return loss

    def on_train_epoch_end(self):
        self._log_epoch("train")
        if "loss" in self._sums:
            self.log("train/loss", self._sums.pop("loss") / self._sums.pop("steps"))

    def validation_step(self, batch, batch_idx):
        features, labels = batch
        self._accumulate("eval", self.stacked_logits(features), labels)

    def on_validation_epoch_end(self):
        self._log_epoch("eval")

    def configure_optimizers(self):
        # fused Adam: the same update in one kernel per step (measured ~1.5x faster per step on CPU here)
        opt = torch.optim.Adam(self.parameters(), lr=self.cfg.lr, fused=True)
        total = int(self.trainer.estimated_stepping_batches)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _cosine(total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def feature_loader(
    features: torch.Tensor, labels: torch.Tensor, batch_size: int, shuffle: bool, seed: int = 0
) -> DataLoader:
    """Whole batches indexed straight out of the tensors (no per-example collate)."""
    ds = TensorDataset(features, labels)
    base = RandomSampler(ds, generator=torch.Generator().manual_seed(seed)) if shuffle else SequentialSampler(ds)
    return DataLoader(ds, sampler=BatchSampler(base, batch_size, drop_last=False), batch_size=None)


@dataclass
class TrainedHead:
    spec: HeadSpec
    head: AcceptanceHead
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float]


@torch.no_grad()
def predict_logits(head: AcceptanceHead, features: torch.Tensor, batch_size: int = 8192) -> torch.Tensor:
    """(M, H) -> (M,) logits, in chunks so that large feature caches do not need a second copy in fp32."""
    head.eval()
    chunks = [head(features[i : i + batch_size]) for i in range(0, len(features), batch_size)]
    return torch.cat(chunks) if chunks else torch.zeros(0)


def train_heads(
    train_data: tuple[torch.Tensor, torch.Tensor],
    eval_data: tuple[torch.Tensor, torch.Tensor] | None,
    specs: Sequence[HeadSpec],
    cfg: HeadTrainConfig = HeadTrainConfig(),
    train_loader: DataLoader | None = None,
) -> AcceptanceHeadsModule:
    """Fit the heads in `specs` together in one Lightning run; returns the trained module (on CPU).

    train_loader: batches of (features, labels) computed online (heads/online.py) instead of
    `train_data` tensors, for drafters whose features are too big to cache; eval_data is required then."""
    if train_loader is None:
        f_train, y_train = train_data
        check_finite(f_train, y_train, "train features")
        if len(f_train) == 0:
            raise InputError("no training positions for the acceptance heads; the acceptance data is empty")
        hidden_size = f_train.shape[1]
        train_loader = feature_loader(f_train, y_train, cfg.batch_size, shuffle=True, seed=cfg.seed)
    elif eval_data is None:
        raise InputError("online head training needs eval features to know the hidden size and score the heads")
    else:
        hidden_size = eval_data[0].shape[1]
    if eval_data is not None:
        check_finite(*eval_data, what="eval features")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        module = AcceptanceHeadsModule(hidden_size, specs, cfg)
    # the shared builder, in-memory: the 20-head grid trains in seconds and is redone rather than resumed;
    # no gradient clipping (SpecDec++ §5.1 trains with plain Adam)
    accelerator = cfg.trainer.get("accelerator", "cpu")
    trainer = build_trainer(TrainerConfig(max_epochs=cfg.epochs, precision="32", accelerator="cpu", devices=1,
                                          gradient_clip_val=None, seed=cfg.seed), None, **cfg.trainer)
    val = feature_loader(*eval_data, cfg.eval_batch_size, shuffle=False) if eval_data is not None else None
    with cpu_threads(cfg.cpu_threads if accelerator == "cpu" else None):
        trainer.fit(module, train_loader, val)
    return module.cpu().eval()


def train_head_grid(
    train_data: tuple[torch.Tensor, torch.Tensor],
    eval_data: tuple[torch.Tensor, torch.Tensor],
    depths: Sequence[int] = DEPTHS,
    w_rejs: Sequence[float] = W_REJS,
    cfg: HeadTrainConfig = HeadTrainConfig(),
    heads_per_run: int | None = None,
    train_loader: DataLoader | None = None,
) -> list[TrainedHead]:
    """Train the D x w_rej grid (20 heads by default) and score each on train and eval.

    heads_per_run: heads trained together per Lightning run (default: all of them in one run).
    Returns one TrainedHead per (D, w_rej), in grid order, with `head_metrics` on both splits.
    """
    specs = [HeadSpec(d, float(w)) for d in depths for w in w_rejs]
    group = heads_per_run or len(specs)
    out: list[TrainedHead] = []
    for start in range(0, len(specs), group):
        module = train_heads(train_data, eval_data, specs[start : start + group], cfg, train_loader)
        with cpu_threads(cfg.cpu_threads):  # the metrics run on CPU whatever trained the heads
            heads = module.export_heads()
            if train_loader is None:
                train_scores = [head_metrics(predict_logits(h, train_data[0]), train_data[1]) for h in heads]
            else:  # one more online pass: every head scored on the same recomputed features
                logits, labels = [[] for _ in heads], []
                for features, y in train_loader:
                    labels.append(y)
                    for i, h in enumerate(heads):
                        logits[i].append(predict_logits(h, features))
                y_all = torch.cat(labels)
                train_scores = [head_metrics(torch.cat(lg), y_all) for lg in logits]
            for spec, head, train_score in zip(module.specs, heads, train_scores):
                out.append(TrainedHead(spec, head, train_score,
                                       head_metrics(predict_logits(head, eval_data[0]), eval_data[1])))
    return out

