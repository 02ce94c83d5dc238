"""Training an EAGLE drafter (EAGLE-1, Li et al. 2024, Sec. 3.2 "Training") on self-distilled data.

The network is `decoding.speculators.eagle_model.EagleDrafter` (it lives in `decoding/` because the decoder loads
it from a bundle). Per batch, the frozen target runs once (no gradients) and gives its features
f (B, T, d) (final hidden states, what its LM head reads) and its next-token distribution p. Drafter
input j is (f_j + noise, x_{j+1}), its output f^_{j+1} is regressed onto f_{j+1}, and its draft
distribution lm_head(f^_{j+1}) onto p at position j+1:

    loss = SmoothL1(f^_{j+1}, f_{j+1}) + 0.1 * KL(p_{j+1} || softmax(lm_head(f^_{j+1})))

over the positions whose next token is trained on (the batch's loss_mask at j + 1), with uniform noise
U(-0.1, 0.1) on the input features (EAGLE's data augmentation against its own feature errors at decode
time). EAGLE-1 writes the token term as the cross-entropy with the target's token; the forward KL to the
target's distribution has the same gradient in expectation and is what distillation wants here (the
target is at hand). The embedding and LM head are the target's, frozen, and stay out of the module's
state (not checkpointed, not optimised), like `CausalLMModule`'s teacher.

Where the target's signal is stored (stage teacher-data, drafters/teacher_signal.py), the batch carries it:
the features at every token (`teacher_features`) and the target's top-k distribution at every trained-on
position (`teacher_topk_*`), and the target never runs; the token loss is then the forward KL to that top-k,
renormalised over its k tokens (over those in the draft vocabulary, for a reduced one). Without one the target
runs on each batch (no gradients) and the loss reads its full distribution: with k = the vocabulary the two
are the same loss (tests/drafters/test_eagle_stored_signal.py).

EAGLE-3 (Li et al. 2025, arXiv 2503.01840, Sec. 3.1 "training-time test"), `variant="eagle3"` (vLLM's
layout, decoding/speculators/eagle_model.py) and `"eagle3-proj"` (specdraft's earlier one): the input
features are the target's low / middle / high hidden states, fused by the drafter;
the feature regression is dropped and only the token loss is kept; and the drafter is unrolled for
`ttt_steps` steps on its own predictions, as at decode time: at step s the entry for position i reads the
prediction that step s - 1 made at position i - 1 and attends to the real entries 0..i-s and to its own
chain of predicted entries (one per earlier step), never to the real entries it replaces. Step s is one
forward over the stacked entries of steps 0..s with that 4D mask (`ttt_mask`, EAGLE-3's "diagonal"
attention) and per-entry position ids; step s + 1 needs step s's outputs, so the steps run in turn. Step s is trained on the same target distribution as step 0 at the same index,
p_{i+1}, weighted 0.8^s (the decay of EAGLE-3's reference training code); no feature noise (the unrolled
steps are its augmentation).
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import lightning as L
from lightning.pytorch.callbacks import Callback
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, get_cosine_schedule_with_warmup

from specdraft.decoding.speculators.eagle_model import EagleDrafter, fused_features
from specdraft.core.errors import InputError
from specdraft.drafters import losses
from specdraft.drafters.data import TEACHER_FEATURES, TOPK_IDS, TOPK_LOGPROBS

FEATURE_NOISE = 0.1  # EAGLE-1: uniform noise U(-0.1, 0.1) on the input features
TOKEN_WEIGHT = 0.1  # EAGLE-1: w_cls = 0.1 against w_reg = 1.0
TTT_STEPS = 3  # EAGLE-3: training-time test steps (the drafter unrolled on its own predictions)
TTT_DECAY = 0.8  # EAGLE-3 reference code: step s's loss weighted 0.8 ** s


def ttt_mask(valid: torch.Tensor, steps: int) -> torch.Tensor:
    """EAGLE-3's training-time-test attention, (B, 1, S*T, S*T) bool over `steps` stacked copies of T
    entries (block s = step s). valid (B, T) marks real (non-pad) positions. The query of step s at
    position i sees step 0's entries 0..i-s (the real features) and step r's entry at i-s+r for
    r = 1..s (its own chain of predictions); queries at i < s have no chain and see only themselves."""
    B, T = valid.shape
    i = torch.arange(T)
    allowed = torch.zeros(steps, T, steps, T, dtype=torch.bool)
    for s in range(steps):
        allowed[s, :, 0, :] = i[None, :] <= (i[:, None] - s)  # real entries up to i - s
        for r in range(1, s + 1):
            j = i - s + r
            ok = j >= 0
            allowed[s, i[ok], r, j[ok]] = True
        allowed[s, i[:s], s, i[:s]] = True
    allowed = allowed.reshape(steps * T, steps * T)
    keys = valid.bool().to(allowed.device).repeat(1, steps)  # (B, S*T)
    return (allowed[None] & keys[:, None, :])[:, None] | torch.eye(steps * T, dtype=torch.bool)[None, None]


class TopK(NamedTuple):
    """A target distribution kept as its k most likely tokens (ids and log-probabilities, highest first), in the
    indices of the vocabulary the drafter is trained in; -inf marks an entry outside it."""
    ids: torch.Tensor  # (N, k)
    logprobs: torch.Tensor  # (N, k)


def in_draft_vocab(target: TopK, draft_ids: torch.Tensor | None, vocab_size: int) -> TopK:
    """`target` (target-vocabulary ids) in the draft vocabulary's indices: a reduced vocabulary (vLLM's d2t)
    learns the target renormalised over it, as `Eagle3Drafter.train_logits` does with the full distribution."""
    if draft_ids is None:
        return target
    t2d = torch.full((vocab_size,), -1, dtype=torch.long, device=target.ids.device)
    t2d[draft_ids.to(t2d.device)] = torch.arange(len(draft_ids), device=t2d.device)
    idx = t2d[target.ids]
    return TopK(idx.clamp(min=0), target.logprobs.float().masked_fill(idx < 0, float("-inf")))


def token_terms(logits: torch.Tensor, target: torch.Tensor | TopK) -> tuple[torch.Tensor, dict]:
    """The token loss at N positions: forward KL(p || q) of the drafter's q = softmax(logits (N, V')) to the
    target's p, given dense (its logits over the same V') or as a TopK. -> (loss, {"agreement": argmax match
    rate, "acceptance": mean sum_v min(p, q), i.e. 1 - TV}); a top-k row with no entry in the vocabulary counts
    as a disagreement and adds no loss."""
    if not isinstance(target, TopK):
        p = target.float().softmax(-1)
        q = logits.float().softmax(-1)
        agree = logits.argmax(-1) == target.argmax(-1)
        return losses.forward_kl(logits, p), {"agreement": agree.float().mean(),
                                              "acceptance": torch.minimum(p, q).sum(-1).mean()}
    inside = torch.isfinite(target.logprobs)
    has = inside.any(-1)
    kl = (losses.forward_kl_topk(logits[has], target.ids[has], target.logprobs[has]) if has.any()
          else logits.sum() * 0.0)
    best = target.ids.gather(-1, inside.float().argmax(-1, keepdim=True)).squeeze(-1)  # the first entry inside
    p = target.logprobs.float().softmax(-1).nan_to_num(0.0)
    q = logits.float().softmax(-1).gather(-1, target.ids)
    return kl, {"agreement": ((logits.argmax(-1) == best) & has).float().mean(),
                "acceptance": torch.minimum(p, q).sum(-1).mean()}


def trained_logits(drafter: EagleDrafter, pred: torch.Tensor) -> torch.Tensor:
    """The drafter's logits over the vocabulary it is trained in (the draft vocabulary for vLLM's eagle3)."""
    return drafter.draft_logits(pred) if drafter.variant == "eagle3" else drafter.lm_logits(pred)


def draft_vocab_target(drafter: EagleDrafter, target: TopK) -> TopK:
    ids = drafter.draft_ids if drafter.variant == "eagle3" else None
    return in_draft_vocab(target, ids, drafter.config.vocab_size)


def eagle_loss(pred: torch.Tensor, target_features: torch.Tensor, pred_logits: torch.Tensor,
               target: torch.Tensor | TopK, token_weight: float = TOKEN_WEIGHT) -> tuple[torch.Tensor, dict]:
    """EAGLE-1's loss on N gathered positions: pred / target_features (N, d), pred_logits (N, V) and the target's
    distribution (its logits (N, V) or a TopK). -> (loss, {"feature": SmoothL1, "token": forward KL,
    "agreement", "acceptance"})."""
    feature = F.smooth_l1_loss(pred.float(), target_features.float())
    token, parts = token_terms(pred_logits, target)
    return feature + token_weight * token, {"feature": feature.detach(), "token": token.detach(),
                                            **{k: v.detach() for k, v in parts.items()}}


class FrozenParts(torch.nn.Module):
    """The target's input embedding and LM head alone: all of the target that an EAGLE drafter trained on a
    stored signal reads (the target itself never runs, so it need not be on the training device)."""

    def __init__(self, target: torch.nn.Module):
        super().__init__()
        self.embed, self.head = target.get_input_embeddings(), target.get_output_embeddings()

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head

    def forward(self, *args, **kwargs):
        raise InputError("this EAGLE training has the target's embedding and head only, and a batch without the "
                         "stored signal (teacher_features); rerun stage teacher-data, or train with the target")


def ttt_predictions(drafter: EagleDrafter, features: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor,
                    steps: int) -> list[torch.Tensor]:
    """EAGLE-3's training-time test: features (B, T, 3d) the target's fused layers f_i, tokens (B, T)
    x_{i+1}, valid (B, T) non-pad. -> `steps` tensors (B, T, d): step s's prediction at index i, made from
    the real entries 0..i-s and s draft steps on the drafter's own predictions (what the decoder's s-th
    draft step computes; entries i < s are meaningless)."""
    B, T = tokens.shape
    emb = drafter.embed(tokens)
    z_steps = [drafter.layer_input(emb, features)]  # step 0: the real (fused) features
    positions = torch.arange(T, device=tokens.device)
    preds = []
    # step s needs step s - 1's outputs: one forward per step over the stack of steps 0..s (the earlier
    # entries recomputed instead of cached: the same values, and no cache to backpropagate through)
    for s in range(steps):
        z = torch.cat(z_steps, dim=1)  # (B, (s+1) T, d)
        allowed = ttt_mask(valid, s + 1).to(z.device)
        mask = torch.zeros(allowed.shape, dtype=z.dtype, device=z.device).masked_fill(~allowed, torch.finfo(z.dtype).min)
        h = drafter.body(inputs_embeds=z, attention_mask=mask, position_ids=positions.repeat(s + 1)[None].expand(B, -1),
                         use_cache=False).last_hidden_state
        pred = h[:, s * T :]  # step s's predictions: f^ at index i gives q for x_{i+2}
        preds.append(pred)
        if s + 1 < steps:  # step s + 1 at index i reads step s's prediction at i - 1
            shifted = torch.cat([torch.zeros_like(pred[:, :1]), pred[:, :-1]], dim=1)
            z_steps.append(drafter.layer_input(emb, shifted))
    return preds


class EagleModule(L.LightningModule):
    def __init__(self, drafter: EagleDrafter, target: PreTrainedModel, lr: float = 3e-4, warmup_ratio: float = 0.03,
                 weight_decay: float = 0.0, betas: tuple[float, float] = (0.9, 0.95), feature_noise: float = FEATURE_NOISE,
                 token_weight: float = TOKEN_WEIGHT, seed: int = 0, ttt_steps: int = TTT_STEPS):
        super().__init__()
        if not lr > 0:
            raise InputError(f"eagle lr must be > 0, got {lr}")
        if not 0.0 <= warmup_ratio < 1.0:
            raise InputError(f"eagle warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if feature_noise < 0:
            raise InputError(f"eagle feature_noise must be >= 0, got {feature_noise}")
        if not isinstance(ttt_steps, int) or ttt_steps < 1:
            raise InputError(f"eagle ttt_steps must be an integer >= 1, got {ttt_steps!r}")
        self.save_hyperparameters(ignore=["drafter", "target"])
        self.drafter = drafter
        # the target is frozen and kept out of the module's state (no checkpoint, no optimizer, no wrapping)
        self._target = [target.eval().requires_grad_(False)]
        drafter.attach_target(target)
        self._noise = torch.Generator().manual_seed(seed)
        self._step_start: float | None = None

    @property
    def target(self) -> PreTrainedModel:
        return self._target[0]

    def on_fit_start(self) -> None:
        self.target.to(self.device)

    def signal(self, batch: dict[str, torch.Tensor], mask: torch.Tensor):
        """The target's features (B, T, F) and its distribution at the positions j + 1 that `mask` (B, T - 1)
        marks: from the stored signal when the batch carries it, else from one forward of the target (its LM
        head only at the columns some row trains on). -> (features, at) with at(m) the target's distribution at
        the positions of m (a sub-mask of `mask`): dense logits (N, V) or a TopK (N, k), in row-major order."""
        if TEACHER_FEATURES in batch:
            ids, logprobs = batch[TOPK_IDS][:, 1:], batch[TOPK_LOGPROBS][:, 1:]
            return batch[TEACHER_FEATURES], lambda m: TopK(ids[m], logprobs[m])
        cols = mask.any(0).nonzero().squeeze(-1)  # with a large vocabulary the prompts' logits were most of the forward
        with torch.no_grad():
            out = self.target(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False,
                              output_hidden_states=True, logits_to_keep=cols + 1)
        # (B, len(cols), V): column i's is index i + 1's; m is False outside cols, so the row-major order is kept
        return fused_features(out.hidden_states, self.drafter.feature_layers), lambda m: out.logits[m[:, cols]]

    def compute_loss(self, batch: dict[str, torch.Tensor], noise: bool = True) -> tuple[torch.Tensor, dict, int]:
        if self.drafter.variant != "eagle1":
            return self.compute_loss_eagle3(batch)
        ids, attn = batch["input_ids"], batch["attention_mask"]
        mask = batch["loss_mask"][:, 1:].bool() & attn[:, 1:].bool()
        n = int(mask.sum())
        if n == 0:
            return self.drafter.fc.weight.sum() * 0.0, {}, 0
        feats, target_at = self.signal(batch, mask)  # (B, T, d): EAGLE-1 reads the final hidden state
        inputs = feats[:, :-1].to(self.drafter.fc.weight.dtype)
        if noise and self.hparams.feature_noise > 0:
            u = torch.rand(inputs.shape, generator=self._noise).to(inputs.device, inputs.dtype)
            inputs = inputs + (2 * u - 1) * self.hparams.feature_noise
        pred = self.drafter(inputs, ids[:, 1:], attention_mask=attn[:, 1:])  # (B, T-1, d) = f^_1..f^_{T-1}
        pred_n = pred[mask]
        target = target_at(mask)
        target = draft_vocab_target(self.drafter, target) if isinstance(target, TopK) else target
        loss, parts = eagle_loss(pred_n, feats[:, 1:][mask], self.drafter.lm_logits(pred_n), target,
                                 self.hparams.token_weight)
        return loss, parts, n

    def compute_loss_eagle3(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict, int]:
        """EAGLE-3: fused low / middle / high target features, token loss only (forward KL to the target),
        at each of `ttt_steps` unrolled steps (`ttt_predictions`), step s weighted TTT_DECAY ** s. parts: each
        step's token loss and agreement, and step 0's agreement and acceptance (the first draft of a round)."""
        ids, attn = batch["input_ids"], batch["attention_mask"]
        tokens, valid = ids[:, 1:], attn[:, 1:]
        mask = batch["loss_mask"][:, 1:].bool() & valid.bool()
        if int(mask.sum()) == 0:
            return self.drafter.fc.weight.sum() * 0.0, {}, 0
        feats, target_at = self.signal(batch, mask)
        preds = ttt_predictions(self.drafter, feats[:, :-1], tokens, valid, self.hparams.ttt_steps)
        total, weights, parts = 0.0, 0.0, {}
        for s, pred in enumerate(preds):
            step_mask = mask.clone()
            step_mask[:, :s] = False  # no chain of s predictions before index s
            if not step_mask.any():
                continue
            target = target_at(step_mask)
            if isinstance(target, TopK):
                token, terms = token_terms(trained_logits(self.drafter, pred[step_mask]),
                                           draft_vocab_target(self.drafter, target))
            else:  # a reduced draft vocabulary learns the target renormalised over it
                token, terms = token_terms(*self.drafter.train_logits(pred[step_mask], target))
            w = TTT_DECAY ** s
            total, weights = total + w * token, weights + w
            parts[f"token_step{s}"], parts[f"agreement_step{s}"] = token.detach(), terms["agreement"].detach()
            if s == 0:
                parts.update({k: v.detach() for k, v in terms.items()})
        return total / weights, parts, int(mask.sum())

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if self._step_start is None:
            self._step_start = time.perf_counter()

    def training_step(self, batch, batch_idx):
        loss, parts, n = self.compute_loss(batch)
        bs = batch["input_ids"].shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bs)
        for name, value in parts.items():
            self.log(f"train/{name}", value, batch_size=bs)
        self.log("train/loss_tokens", float(n), reduce_fx="sum", batch_size=bs)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        elapsed, self._step_start = now - self._step_start, now
        tokens = int(batch["attention_mask"].sum()) * self.trainer.world_size
        self.log("train/tokens_per_s", tokens / max(elapsed, 1e-9), prog_bar=True, batch_size=1)

    def validation_step(self, batch, batch_idx):
        loss, parts, n = self.compute_loss(batch, noise=False)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=max(n, 1))

    def configure_optimizers(self):
        hp = self.hparams
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": hp.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas))
        total = int(self.trainer.estimated_stepping_batches)
        sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=math.ceil(hp.warmup_ratio * total),
                                                num_training_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


class DevCurve(Callback):
    """The drafter's dev agreement and acceptance (teacher-forced: the first draft of a round, and the
    agreement at each training-time-test step) every `every` optimizer steps and at the end of the fit: what
    more training buys. Its points are checkpointed, so a resumed fit keeps the earlier ones."""

    def __init__(self, batches: list[dict[str, torch.Tensor]], every: int):
        if every < 1:
            raise InputError(f"the dev curve needs an interval >= 1 step, got {every}")
        self.batches, self.every, self.points = batches, every, []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0:
            self.measure(trainer.global_step, module)

    def on_train_end(self, trainer, module) -> None:
        self.measure(trainer.global_step, module)

    @torch.no_grad()
    def measure(self, step: int, module: EagleModule) -> None:
        if self.points and self.points[-1]["step"] == step:
            return
        training = module.training
        module.eval()
        sums: dict[str, float] = {}
        total = 0
        for batch in self.batches:
            _, parts, n = module.compute_loss({k: v.to(module.device) for k, v in batch.items()}, noise=False)
            for key, value in parts.items():  # each batch's means, weighted by its trained-on positions
                if key.startswith(("agreement", "acceptance")):
                    sums[key] = sums.get(key, 0.0) + float(value) * n
            total += n
        module.train(training)
        self.points.append({"step": step, **{k: round(v / max(total, 1), 4) for k, v in sorted(sums.items())}})

    def state_dict(self) -> dict:
        return {"points": list(self.points)}

    def load_state_dict(self, state: dict) -> None:
        self.points = list(state["points"])
