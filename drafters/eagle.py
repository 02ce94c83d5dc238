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

Features are recomputed online by the target in every step, not cached: on this project's CPU demo the
target forward costs about as much as reading fp16 features of the same batch from disk would save,
and a cache of d floats per token (T x d x 2 bytes per sequence) would exceed the run's other artifacts
combined for a real target (4096-d features: 8 KiB per token). The heads' online path makes the same
trade. A disk cache would pay off only for many epochs over a large target, on GPUs.

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

import lightning as L
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, get_cosine_schedule_with_warmup

from specdraft.decoding.speculators.eagle_model import EagleDrafter, fused_features
from specdraft.core.errors import InputError
from specdraft.drafters import losses

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


def eagle_loss(pred: torch.Tensor, target_features: torch.Tensor, pred_logits: torch.Tensor,
               target_logits: torch.Tensor, token_weight: float = TOKEN_WEIGHT) -> tuple[torch.Tensor, dict]:
    """EAGLE-1's loss on N gathered positions: pred / target_features (N, d), pred_logits / target_logits
    (N, V). -> (loss, {"feature": SmoothL1, "token": forward KL, "agreement": argmax match rate})."""
    feature = F.smooth_l1_loss(pred.float(), target_features.float())
    token = losses.forward_kl(pred_logits, target_logits.float().softmax(-1))
    agree = (pred_logits.argmax(-1) == target_logits.argmax(-1)).float().mean()
    return feature + token_weight * token, {"feature": feature.detach(), "token": token.detach(),
                                            "agreement": agree.detach()}


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

    def compute_loss(self, batch: dict[str, torch.Tensor], noise: bool = True) -> tuple[torch.Tensor, dict, int]:
        if self.drafter.variant != "eagle1":
            return self.compute_loss_eagle3(batch)
        ids, attn = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad():
            out = self.target(input_ids=ids, attention_mask=attn, use_cache=False, output_hidden_states=True)
            feats = out.hidden_states[-1]  # (B, T, d)
        inputs = feats[:, :-1]
        if noise and self.hparams.feature_noise > 0:
            u = torch.rand(inputs.shape, generator=self._noise).to(inputs.device, inputs.dtype)
            inputs = inputs + (2 * u - 1) * self.hparams.feature_noise
        pred = self.drafter(inputs, ids[:, 1:], attention_mask=attn[:, 1:])  # (B, T-1, d) = f^_1..f^_{T-1}
        mask = batch["loss_mask"][:, 1:].bool() & attn[:, 1:].bool()
        n = int(mask.sum())
        if n == 0:
            return pred.sum() * 0.0, {}, 0
        pred_n = pred[mask]
        loss, parts = eagle_loss(pred_n, feats[:, 1:][mask], self.drafter.lm_logits(pred_n), out.logits[:, 1:][mask],
                                 self.hparams.token_weight)
        return loss, parts, n

    def compute_loss_eagle3(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict, int]:
        """EAGLE-3: fused low / middle / high target features, token loss only (forward KL to the target),
        at each of `ttt_steps` unrolled steps (`ttt_predictions`), step s weighted TTT_DECAY ** s."""
        ids, attn = batch["input_ids"], batch["attention_mask"]
        S = self.hparams.ttt_steps
        tokens, valid = ids[:, 1:], attn[:, 1:]
        mask = batch["loss_mask"][:, 1:].bool() & valid.bool()
        if int(mask.sum()) == 0:
            return self.drafter.fc.weight.sum() * 0.0, {}, 0
        # the target's LM head only at the columns some row trains on (the prompts' logits are never read; with a
        # large vocabulary they were most of the target's forward)
        cols = mask.any(0).nonzero().squeeze(-1)
        with torch.no_grad():
            out = self.target(input_ids=ids, attention_mask=attn, use_cache=False, output_hidden_states=True,
                              logits_to_keep=cols + 1)
            feats = fused_features(out.hidden_states, self.drafter.feature_layers)  # (B, T, 3d)
        target_logits = out.logits  # (B, len(cols), V): index i + 1 of column i's
        preds = ttt_predictions(self.drafter, feats[:, :-1], tokens, valid, S)
        total, weights, parts = 0.0, 0.0, {}
        n = int(mask.sum())
        for s, pred in enumerate(preds):
            step_mask = mask.clone()
            step_mask[:, :s] = False  # no chain of s predictions before index s
            if not step_mask.any():
                continue
            at = step_mask[:, cols]  # the same positions, in the kept columns (row-major order is kept)
            # a reduced draft vocabulary (vLLM's eagle3 layout) learns the target renormalised over it
            logits, wanted = self.drafter.train_logits(pred[:, cols][at], target_logits[at])
            token = losses.forward_kl(logits, wanted.float().softmax(-1))
            w = TTT_DECAY ** s
            total, weights = total + w * token, weights + w
            parts[f"token_step{s}"] = token.detach()
            if s == 0:
                parts["agreement"] = (logits.argmax(-1) == wanted.argmax(-1)).float().mean().detach()
        return total / weights, parts, n

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
