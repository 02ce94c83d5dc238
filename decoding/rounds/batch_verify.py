"""Speculative-sampling verification of a whole batch as tensor operations on the model's device
(the batched twin of `decoding.rounds.verify.verify`; SpecDec++ App. C, Alg. 2).

Row b drafted k[b] <= W tokens (the draft tensor is padded to the round's width W). Accept y_i with
probability min(1, p_i(y_i) / q_i(y_i)) in order; the accepted prefix is the number of leading
acceptances; at the first rejection sample norm((p - q)_+), after k[b] acceptances the bonus from
p_{k+1}. Greedy: accept while y_i == argmax p_i, the extra token is argmax p at the first mismatch.
No Python loop over rows or positions and no host synchronisation.
"""
from __future__ import annotations

import torch


def accepted_prefix(accepted: torch.Tensor) -> torch.Tensor:
    """(B, W) bool -> (B,) long: the number of leading True entries per row."""
    return accepted.long().cumprod(-1).sum(-1)


def draft_valid(k: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) bool: position i < k[b] was really drafted in row b."""
    return torch.arange(width, device=k.device)[None, :] < k[:, None]


def verify_greedy(target_logits: torch.Tensor, draft: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """target_logits (B, W + 1, V), draft (B, W), k (B,) -> (n_accepted (B,), extra token (B,))."""
    W = draft.shape[1]
    best = target_logits.argmax(-1)  # (B, W + 1)
    n = accepted_prefix((draft == best[:, :W]) & draft_valid(k, W))
    return n, best.gather(1, n[:, None]).squeeze(1)


def residual_or_bonus(p_at: torch.Tensor, q_at: torch.Tensor) -> torch.Tensor:
    """norm((p - q)_+) per row, (B, V); q_at is zero where every draft was accepted (then the bonus
    distribution p itself). Falls back to p where the positive part is empty (p == q up to rounding,
    where a rejection was numerically impossible anyway)."""
    r = (p_at - q_at).clamp_min(0.0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p_at)


def verify_sampled(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, k: torch.Tensor,
                   generator: torch.Generator | None, r: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """p (B, W + 1, V) target probabilities, q (B, W, V) the distributions the drafts were sampled
    from, draft (B, W), k (B,) -> (n_accepted (B,), extra token (B,)), all on p's device. r: the
    acceptance uniforms (B, >= W) when the caller draws them (a padded verify then draws as an unpadded one)."""
    B, W = draft.shape
    r = torch.rand(B, W, generator=generator, device=p.device) if r is None else r[:, :W]
    p_draft = p[:, :W].gather(2, draft[..., None]).squeeze(-1)
    q_draft = q.gather(2, draft[..., None]).squeeze(-1)
    n = accepted_prefix((r * q_draft < p_draft) & draft_valid(k, W))  # r q < p avoids the division
    q_padded = torch.cat([q, q.new_zeros(B, 1, q.shape[-1])], dim=1)  # (B, W + 1, V): no q after the last draft
    rejected = (n < k)[:, None]
    index = n[:, None, None].expand(-1, 1, p.shape[-1])
    p_at = p.gather(1, index).squeeze(1)
    q_at = torch.where(rejected, q_padded.gather(1, index).squeeze(1), 0.0)
    dist = residual_or_bonus(p_at, q_at)
    return n, torch.multinomial(dist, 1, generator=generator).squeeze(1)
