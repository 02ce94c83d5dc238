"""The LightningModule that trains a causal LM: drafters (ce / fkl / tvd distillation) and the demo target.

Loss is taken only where the batch's loss_mask is 1 (see drafters/data.py for the shift). The target's
distribution for fkl / tvd comes from the batch when it carries it (a cached top-k, `teacher_topk_ids` /
`teacher_topk_logprobs`, as a stored teacher signal holds it, or the teacher's full logits cached by
`teacher_logits_per_example`), else from a frozen teacher model run on the same batch. ce trains on the batch's
`ce_targets` where it has them (a stored signal: the target's greedy token on text it did not write), else on
the next token.
Optimisation follows MetaSD App. F.2: AdamW, lr 2e-5, cosine schedule with linear warmup over 3% of
the optimizer steps, no weight decay by default.
"""
from __future__ import annotations

import math
import time

import lightning as L
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, get_cosine_schedule_with_warmup

from specdraft.core.errors import InputError
from specdraft.core.tokenizers import check_same_vocabulary
from specdraft.drafters import losses
from specdraft.drafters.alignment import response_logits
from specdraft.drafters.data import CE_TARGETS, TEACHER_LOGITS, TOPK_IDS, TOPK_LOGPROBS, CausalLMCollator

OPTIMIZERS = ("adamw", "adamw8bit")


class CausalLMModule(L.LightningModule):
    def __init__(
        self,
        model: PreTrainedModel | LlamaConfig,
        loss: str = "ce",
        lr: float = 2e-5,
        warmup_ratio: float = 0.03,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        optimizer: str = "adamw",
        teacher: PreTrainedModel | None = None,
        teacher_topk: int | None = None,
        grad_checkpointing: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        if loss not in losses.LOSSES:
            raise InputError(f"unknown loss {loss!r}; choose one of {list(losses.LOSSES)}")
        if optimizer not in OPTIMIZERS:
            raise InputError(f"unknown optimizer {optimizer!r}; choose one of {list(OPTIMIZERS)}")
        if not 0.0 <= warmup_ratio < 1.0:
            raise InputError(f"warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if teacher_topk is not None and teacher_topk < 1:
            raise InputError(f"teacher_topk must be >= 1 or null, got {teacher_topk}")
        self.save_hyperparameters(ignore=["model", "teacher"])
        if isinstance(model, LlamaConfig):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = LlamaForCausalLM(model)
        self.model = model
        if grad_checkpointing:
            self.model.gradient_checkpointing_enable()
            self.model.config.use_cache = False
        # The teacher is frozen and is kept out of the module's state: not saved in checkpoints, not
        # seen by the optimizer or by FSDP/DeepSpeed wrapping. It is moved to our device at fit start.
        self._teacher = [teacher.eval().requires_grad_(False)] if teacher is not None else []
        if teacher is not None:  # the teacher is the target: the student drafts in its vocabulary
            check_same_vocabulary(model.config.vocab_size, teacher.config.vocab_size, name="student")
        self._step_start: float | None = None

    @property
    def teacher(self) -> PreTrainedModel | None:
        return self._teacher[0] if self._teacher else None

    def on_fit_start(self) -> None:
        if self.teacher is not None:
            self.teacher.to(self.device)

    # ---- loss ---------------------------------------------------------------------------------------
    def compute_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """-> (mean loss over loss-mask positions, number of those positions)."""
        mask = batch["loss_mask"]
        n = int(mask.sum())
        if n == 0:  # nothing to learn from in this batch (e.g. all responses empty); keep the graph
            out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
            return out.logits.sum() * 0.0, 0
        # the LM head runs only at the loss positions, flattened in row-major order (N, V): with a large vocabulary
        # the prompt positions' logits would be most of a step's work and are never read
        student = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False,
                             logits_to_keep=mask.bool()).logits
        name = self.hparams.loss
        if name == "ce":
            targets = batch[CE_TARGETS] if CE_TARGETS in batch else losses.next_token_targets(batch["input_ids"])
            return losses.cross_entropy(student, losses.gather_positions(targets, mask)), n
        if TOPK_IDS in batch:
            ids = losses.gather_positions(batch[TOPK_IDS], mask)
            logprobs = losses.gather_positions(batch[TOPK_LOGPROBS], mask)
            return self._topk_loss(student, ids, logprobs), n
        if TEACHER_LOGITS in batch:
            t_logits = batch[TEACHER_LOGITS].float()  # (N, V), already in loss-mask order
        elif self.teacher is None:
            raise InputError(
                f"loss {name!r} needs the target's distribution: pass teacher=<target model> "
                f"or cache {TOPK_IDS}/{TOPK_LOGPROBS} or {TEACHER_LOGITS} in the data"
            )
        else:
            with torch.no_grad():
                t_logits = self.teacher(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
                ).logits
                t_logits = losses.gather_positions(t_logits, mask).float()  # (N, V)
        if self.hparams.teacher_topk:
            ids, logprobs = losses.topk_of(t_logits, self.hparams.teacher_topk)
            return self._topk_loss(student, ids, logprobs), n
        p = t_logits.softmax(-1)
        fn = losses.forward_kl if name == "fkl" else losses.total_variation
        return fn(student, p), n

    def _topk_loss(self, student, ids, logprobs) -> torch.Tensor:
        if self.hparams.loss == "fkl":
            return losses.forward_kl_topk(student, ids, logprobs)
        return losses.total_variation_topk(student, ids, logprobs)

    # ---- steps --------------------------------------------------------------------------------------
    def on_train_batch_start(self, batch, batch_idx) -> None:
        if self._step_start is None:
            self._step_start = time.perf_counter()

    def training_step(self, batch, batch_idx):
        loss, n = self.compute_loss(batch)
        bs = batch["input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        self.log("train/loss_tokens", float(n), reduce_fx="sum", batch_size=bs)
        # the rate this batch's update uses (the scheduler steps after the optimizer)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=bs)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        # throughput over the whole step (data, forward, backward, optimizer), all ranks together
        now = time.perf_counter()
        elapsed = now - self._step_start
        self._step_start = now
        tokens = int(batch["attention_mask"].sum()) * self.trainer.world_size
        self.log("train/tokens_per_s", tokens / max(elapsed, 1e-9), prog_bar=True, batch_size=1)

    def validation_step(self, batch, batch_idx):
        loss, n = self.compute_loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=max(n, 1))

    # ---- optimisation -------------------------------------------------------------------------------
    def configure_optimizers(self):
        hp = self.hparams
        # no decay on norms and biases (nanoGPT): only matrices (>= 2-D) are decayed
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": hp.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        if hp.optimizer == "adamw8bit":
            try:
                import bitsandbytes as bnb
            except ImportError as e:
                raise InputError("optimizer adamw8bit needs bitsandbytes; install it or use optimizer: adamw") from e
            opt = bnb.optim.AdamW8bit(groups, lr=hp.lr, betas=tuple(hp.betas))
        else:
            opt = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas))
        total = int(self.trainer.estimated_stepping_batches)
        warmup = math.ceil(hp.warmup_ratio * total)
        sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=warmup, num_training_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


def teacher_logits_per_example(teacher, examples: list[dict], collate: CausalLMCollator, batch_size: int = 32
                               ) -> list[torch.Tensor]:
    """The teacher's logits at each example's trained-on positions, (n_i, V) float32 on CPU per example, for
    the examples' `teacher_logits` key. With right padding an example's logits do not depend on its
    batch-mates, so these are what compute_loss would get from the live teacher in any training batch; the
    target then runs once per example instead of once per epoch and per drafter trained on it."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["prompt_ids"]) + len(examples[i]["response_ids"]))
    out: list[torch.Tensor | None] = [None] * len(examples)
    for start in range(0, len(order), batch_size):  # length-sorted batches: little padding
        idx = order[start:start + batch_size]
        batch = collate([examples[i] for i in idx])
        rows = response_logits(teacher, batch).split(batch["loss_mask"].sum(1).tolist())  # per example, in batch order
        for i, r in zip(idx, rows):
            out[i] = r.clone()  # its own storage: a drafter's subset need not keep whole batches alive
    return out
