"""SpecDec++ acceptance labels and token mixing (paper §4.4).

Pure tensor functions for the `acceptance-data` stage. Per response position i (teacher-forced on the
target response X):
    p_i = probs(target logits), q_i = probs(draft logits)   -- the SAME sampling transform for both,
                                                              the one the decoder will serve with
    Y_i ~ q_i,   P_i = min(1, p_i(Y_i) / q_i(Y_i))           -- the head's training target
    1 - TV(p_i, q_i) = sum_v min(p_i(v), q_i(v))             -- the lower-variance label (E_Y[P_i])
    argmax p_i == argmax q_i                                  -- greedy agreement, for the Thm 4.1 oracle
Greedy (temperature 0) makes p and q one-hot, so Y_i = argmax q_i and P_i = 1{argmax p_i == argmax q_i}.

All functions accept any leading shape (N,) or a padded batch (B, T); rows at padded positions give
finite values that the caller must mask out.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.rounds.sampling import SamplingConfig, probs, sample_inverse


@dataclass
class AcceptanceLabels:
    draft_tokens: torch.Tensor  # (...,) long, Y_i ~ q_i
    accept_prob: torch.Tensor  # (...,) float32 in [0, 1], P_i = min(1, p_i(Y_i) / q_i(Y_i))
    one_minus_tv: torch.Tensor  # (...,) float32 in [0, 1], 1 - TV(p_i, q_i)
    greedy_agree: torch.Tensor  # (...,) bool, argmax p_i == argmax q_i


def acceptance_labels(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    cfg: SamplingConfig,
    generator: torch.Generator,
) -> AcceptanceLabels:
    """Labels from teacher-forced logits at the response positions.

    target_logits, draft_logits: (..., V), position i holding the next-token logits given X_<i
    (so logits[..., i, :] of a causal LM run on (prompt, X) shifted by one, response part only).
    `generator` draws Y and must live on the logits' device.
    """
    if target_logits.shape != draft_logits.shape:
        raise InputError(
            f"target logits {tuple(target_logits.shape)} and draft logits {tuple(draft_logits.shape)} differ; "
            "the drafter must share the target's vocabulary and positions"
        )
    p = probs(target_logits, cfg)  # (..., V)
    q = probs(draft_logits, cfg)
    # by the inverse CDF: torch.multinomial over a 49152-token vocabulary was 20% of the stage on a real target
    y = sample_inverse(q, torch.rand(q.shape[:-1], generator=generator, device=q.device))  # (...,)
    p_y = p.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    q_y = q.gather(-1, y.unsqueeze(-1)).squeeze(-1)  # > 0: y was drawn from q
    accept = torch.clamp(p_y / q_y, max=1.0)
    overlap = torch.minimum(p, q).sum(-1).clamp(0.0, 1.0)  # 1 - TV; clamp only absorbs float rounding
    agree = target_logits.argmax(-1) == draft_logits.argmax(-1)
    assert torch.isfinite(accept).all() and (accept >= 0).all() and (accept <= 1).all(), "label outside [0, 1]"
    return AcceptanceLabels(draft_tokens=y, accept_prob=accept, one_minus_tv=overlap, greedy_agree=agree)


def mix_tokens(
    target_tokens: torch.Tensor,
    draft_tokens: torch.Tensor,
    generator: torch.Generator,
    r: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token mixing: Z_i = X_i with probability r, else Y_i -> (Z, from_y) with from_y: bool, same shape.

    The head trains only on positions where from_y is True (the paper's loss mask).
    """
    if not 0.0 <= r <= 1.0:
        raise InputError(f"token mixing rate r must be in [0, 1], got {r}; the paper uses 0.15")
    if target_tokens.shape != draft_tokens.shape:
        raise InputError(
            f"target tokens {tuple(target_tokens.shape)} and draft tokens {tuple(draft_tokens.shape)} differ"
        )
    take_x = torch.rand(target_tokens.shape, generator=generator, device=target_tokens.device) < r
    return torch.where(take_x, target_tokens, draft_tokens), ~take_x
