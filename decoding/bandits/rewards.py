"""Bandit rewards for one speculative-decoding round (MetaSD Eq. 4 and §2.3; BanditSpec §3).

A round drafts n <= N_max tokens, the target scores them in one forward, and n_acc of them are
accepted (0 <= n_acc <= n). The rewards below summarise that round for an arm selector:

- block divergence r_BD (MetaSD Eq. 4): the mean of 1 - TV(p, q) over the drafted positions. Its
  expectation is the drafter's per-token acceptance rate alpha_i (MetaSD Lemma 6), it is never zero and
  its variance is at most 1 / (4 n).
- block efficiency r_BE = n_acc / N_max (MetaSD §2.3), in [0, 1]; zero whenever the first token fails.
- accepted length Y = n_acc + 1 in [1, L + 1] (BanditSpec: the bonus/correction token counts).
- throughput (n_acc + 1) / (1 + c n) (BanditSpec §6.2): tokens per unit of cost, with c the cost of
  one drafted token in target forwards (t_draft / t_target): arms of different cost (speculation
  lengths, drafters of different size, model-free arms with c ~ 0) compare by speed, not by length.

The rewards take tensors and return tensors so that the caller decides when to synchronise with the
device (one `.item()` per round); the selectors take Python floats.
"""
from __future__ import annotations

import torch

from specdraft.core.errors import InputError


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance 1/2 ||p - q||_1 along the last (vocabulary) axis: (..., V) -> (...)."""
    return 0.5 * (p.float() - q.float()).abs().sum(-1)


def block_divergence_reward(
    p: torch.Tensor, q: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """MetaSD block-divergence reward: mean over drafted positions of 1 - TV(p_j, q_j).

    p: (..., n, V) the target's distributions at the n drafted positions (not the bonus position that
       the target also scores); q: (..., n, V) the drafter's distributions it sampled those tokens from.
       Both must come out of the same sampling transform (`decoding.rounds.sampling.probs`) as verification,
       so that 1 - TV is the per-token acceptance probability of speculative sampling. Under greedy
       decoding `probs` gives one-hots and r_BD becomes the fraction of argmax agreements (sparse, like
       BE); MetaSD runs greedy yet reports BD "always nonzero" (Table 2), i.e. it compares the models'
       softmax distributions. To get that, pass `probs(logits, SamplingConfig(temperature=1.0))` here.
    mask: optional (..., n) bool, True on positions that were really drafted (for padded batches).
    Returns (...) float in [0, 1].

    Normaliser: Eq. 4 divides by N_max because MetaSD always drafts N_max tokens. When a round drafts
    fewer (EOS, length limit, a SpecDec++ head stopping early) we divide by the number actually drafted:
    that keeps r_BD the empirical mean of the per-position acceptance rates, with expectation alpha_i
    as in Lemma 6, instead of charging an arm for positions it never drafted. Positions after the first
    rejection still count: the target scored them in the same forward, and they are alignment evidence.
    """
    if p.shape != q.shape:
        raise InputError(
            f"block divergence needs p and q of the same shape, got {tuple(p.shape)} and {tuple(q.shape)};"
            " pass the target's distributions at the drafted positions only (drop the bonus position)"
        )
    if p.dim() < 2 or p.shape[-2] == 0:
        raise InputError(
            f"block divergence needs (..., n, V) with n >= 1 drafted positions, got shape {tuple(p.shape)}"
        )
    alignment = 1.0 - tv_distance(p, q)  # (..., n)
    if mask is None:
        return alignment.mean(-1)
    if mask.shape != alignment.shape:
        raise InputError(f"mask shape {tuple(mask.shape)} must be p.shape[:-1] = {tuple(alignment.shape)}")
    n_drafted = mask.sum(-1)
    if bool((n_drafted == 0).any()):
        raise InputError("block divergence mask has a row with no drafted position; every round drafts >= 1")
    return (alignment * mask).sum(-1) / n_drafted


def block_efficiency_reward(n_accepted: int | torch.Tensor, n_max: int) -> float | torch.Tensor:
    """MetaSD block-efficiency reward N_acc / N_max in [0, 1] (accepted draft tokens, bonus excluded).

    N_max is the configured maximum draft length, fixed across rounds as in the paper, so a round cut
    short by EOS is not rescaled.
    """
    if n_max < 1:
        raise InputError(f"n_max (maximum draft length) must be >= 1, got {n_max}")
    _check_accepted(n_accepted, n_max, "n_max")
    return n_accepted / n_max


def accepted_length_reward(n_accepted: int | torch.Tensor, max_len: int) -> int | torch.Tensor:
    """BanditSpec reward Y = N_acc + 1 in [1, L + 1]: tokens the round emits, bonus/correction included."""
    if max_len < 0:
        raise InputError(f"max_len (L, the maximum speculation length) must be >= 0, got {max_len}")
    _check_accepted(n_accepted, max_len, "max_len")
    return n_accepted + 1


def _check_accepted(n_accepted, limit: int, limit_name: str) -> None:
    low, high = (
        (int(n_accepted.min()), int(n_accepted.max()))
        if isinstance(n_accepted, torch.Tensor)
        else (n_accepted, n_accepted)
    )
    if low < 0 or high > limit:
        raise InputError(f"accepted draft tokens must be in [0, {limit_name}={limit}], got {n_accepted}")


def throughput_reward(n_accepted: int, n_drafted: int, cost_ratio: float) -> float:
    """BanditSpec §6.2 reward: the round's throughput, tokens emitted per unit of cost,
    (n_acc + 1) / (1 + c k), counting the target forward as 1 and each of the round's k drafted tokens
    as c = t_draft / t_target (a drafter's forward per token; ~0 for a model-free speculator).

    An arm's mean reward is then its expected throughput E[N_acc + 1] / (1 + c k): the speed the bandit
    should maximise. The accepted length Y = N_acc + 1 instead ignores what drafting costs, so over arms
    of different cost it prefers long or expensive drafts even where cheap ones are faster.
    """
    if not (cost_ratio >= 0 and cost_ratio < float("inf")):
        raise InputError(f"cost ratio c = t_draft / t_target must be a finite number >= 0, got {cost_ratio}")
    if n_drafted < 0 or not 0 <= n_accepted <= n_drafted:
        raise InputError(f"need 0 <= accepted <= drafted, got accepted={n_accepted}, drafted={n_drafted}")
    return (n_accepted + 1) / (1.0 + cost_ratio * n_drafted)


def throughput_bounds(max_len: int, cost_ratios: list[float]) -> tuple[float, float]:
    """(lowest, highest) round throughput over arms with these costs drafting at most max_len = L
    tokens: an L-round of the costliest arm all rejected, and the best of a plain step (1) and an
    L-round of the cheapest arm all accepted ((k + 1) / (1 + c k) is monotone in k)."""
    if max_len < 1:
        raise InputError(f"max_len (L, the maximum speculation length) must be >= 1, got {max_len}")
    if not cost_ratios:
        raise InputError("throughput bounds need at least one arm's cost ratio")
    low = 1.0 / (1.0 + max(cost_ratios) * max_len)
    return low, max(1.0, (max_len + 1) / (1.0 + min(cost_ratios) * max_len))


def throughput_range(max_len: int, cost_ratio: float) -> tuple[float, float]:
    """`throughput_bounds` for arms that all cost c per drafted token (speculation-length arms)."""
    return throughput_bounds(max_len, [cost_ratio])


def normalized_throughput(n_accepted: int, n_drafted: int, max_len: int, cost_ratio: float,
                          bounds: tuple[float, float] | None = None) -> float:
    """`throughput_reward` mapped affinely onto [0, 1] by the bounds over every arm's cost (default: all
    arms cost `cost_ratio`): the order of the arms' means is unchanged, and the selectors get rewards in
    the range their confidence radii assume ([0, 1]; UCBSpec / EXP3Spec take 1 + L times this)."""
    low, high = bounds if bounds is not None else throughput_range(max_len, cost_ratio)
    if n_drafted > max_len:
        raise InputError(f"a round drafted {n_drafted} tokens, more than max_len = {max_len}")
    return (throughput_reward(n_accepted, n_drafted, cost_ratio) - low) / (high - low)
