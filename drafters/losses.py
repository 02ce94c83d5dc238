"""Distillation losses for drafters, as pure functions over the positions that carry loss.

Every function takes the student's logits already gathered at the N positions where loss_mask is 1,
shape (N, V), and returns a scalar: the mean over those positions. The three objectives (MetaSD App. F
trains with `ce`; DistillSpec-style `fkl` and `tvd` are the alternatives):

- ce:  next-token cross-entropy on tokens the target sampled (sequence-level KD).
- fkl: forward KL(p || q), target p to drafter q, per position.
- tvd: total variation TV(p, q) = 1/2 sum_v |p(v) - q(v)|. For speculative sampling the per-token
       acceptance rate is sum_v min(p, q) = 1 - TV(p, q) (SpecDec++ Eq. in App. C), so minimising TV
       maximises the expected acceptance directly.

The target distribution comes either dense, (N, V) probabilities, or as a cached top-k: token ids and
log-probabilities (N, k). A top-k teacher is renormalised over its k tokens (mass outside them is 0),
and the formulas below are exact for that renormalised p.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_positions(x: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) values at the positions where loss_mask (B, T) is nonzero -> (N, ...)."""
    return x[loss_mask.bool()]


def next_token_targets(input_ids: torch.Tensor) -> torch.Tensor:
    """Position t predicts token t+1: (B, T) -> (B, T), the last column is a dummy 0 (never in the mask)."""
    return F.pad(input_ids[:, 1:], (0, 1), value=0)


def cross_entropy(student_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token CE. student_logits (N, V), targets (N,) token ids."""
    return F.cross_entropy(student_logits.float(), targets)


def forward_kl(student_logits: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) with p = teacher_probs (N, V) and q = softmax(student_logits) (N, V)."""
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    p = teacher_probs.float()
    # p log p - p log q, with 0 log 0 = 0 (top-k / top-p teachers have exact zeros)
    kl = torch.xlogy(p, p) - p * log_q
    return kl.sum(-1).mean()


def total_variation(student_logits: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """Mean TV(p, q) = 1/2 sum |p - q| = 1 - acceptance rate. Shapes as in forward_kl."""
    q = F.softmax(student_logits.float(), dim=-1)
    return 0.5 * (teacher_probs.float() - q).abs().sum(-1).mean()


def _topk_teacher(topk_logprobs: torch.Tensor) -> torch.Tensor:
    """Renormalised teacher probabilities over its cached k tokens, (N, k)."""
    return F.softmax(topk_logprobs.float(), dim=-1)


def forward_kl_topk(
    student_logits: torch.Tensor, topk_ids: torch.Tensor, topk_logprobs: torch.Tensor
) -> torch.Tensor:
    """KL(p_k || q) for a teacher cached as top-k ids (N, k) and log-probs (N, k).

    p_k is zero outside the k tokens, so only those k terms of the sum survive; q is the student's
    full softmax (its mass outside the k tokens still enters through the normaliser of log q).
    """
    p = _topk_teacher(topk_logprobs)
    log_q = F.log_softmax(student_logits.float(), dim=-1).gather(-1, topk_ids)
    return (torch.xlogy(p, p) - p * log_q).sum(-1).mean()


def total_variation_topk(
    student_logits: torch.Tensor, topk_ids: torch.Tensor, topk_logprobs: torch.Tensor
) -> torch.Tensor:
    """TV(p_k, q) for a top-k teacher: 1/2 (sum_{top-k} |p - q| + q(outside top-k))."""
    p = _topk_teacher(topk_logprobs)
    q_topk = F.softmax(student_logits.float(), dim=-1).gather(-1, topk_ids)
    q_outside = 1.0 - q_topk.sum(-1)
    return 0.5 * ((p - q_topk).abs().sum(-1) + q_outside).mean()


def topk_of(teacher_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache format from dense teacher logits (N, V): (ids (N, k), log-probs (N, k))."""
    logprobs = F.log_softmax(teacher_logits.float(), dim=-1)
    values, ids = logprobs.topk(k, dim=-1)
    return ids, values


LOSSES = ("ce", "fkl", "tvd")
