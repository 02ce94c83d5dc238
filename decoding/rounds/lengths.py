"""Round lengths and forward counts of a stopping policy: the one definition that the decoder
(`decoding.speculators.drafter.DrafterSpeculator` with a `decoding.policies.stopping` policy) and the offline simulator
that picks a head's threshold (`heads/simulate.py`) share; `decoding.policies.decide.decisions` runs a
policy's own rule over whole rounds.

A round is a sequence of per-position decisions (SpecDec++ §4.2, Alg. 1). Decision k (k = 0, 1, ...)
is taken once k candidates y_1..y_k are drafted: stop and verify y_1..y_k, or draft y_{k+1}.
`fires[..., k]` is True where the policy stops there; the round's length is the first k at which a
decision fires, capped by the policy's K / K_max, EOS and the length limit:

    round_length(fires, cap) = min(first k with fires[k], cap)

Decision 0 is taken before any drafter forward (only the hindsight oracle ever stops there: a plain
target step). Under SpecDec++ decision k >= 1 is taken after sampling y_k ~ q_k and reads the head on
e_1..e_{k-1}: the drafter forward on y_{k-1} is the one that yields both q_k and e_{k-1}, and a stop
submits y_k with the others (Alg. 1: sample y_i, then update p_hat with sigmoid(f(e_{i-1})), then
break). So the first candidate always goes out unpredicted and y_k rides along unpredicted: the
paper's own one-token lag, the price of wasting no forward.

Forward counts (Lemma 3.1, N_draft + N_target = N + N_discarded): a round of k >= 1 candidates costs
exactly k drafter forwards, the first of which also feeds every committed token the drafter has not
seen (the last round's correction/bonus token, the prompt, tokens a bandit committed while this
drafter sat out) and yields q_1; the forwards on y_1..y_{k-1} yield q_2..q_k; y_k is never fed in
its own round. A round of 0 candidates costs no drafter forward. Every round costs one target forward
and emits n_accepted + 1 tokens, except at an accepted drafted EOS, after which the target's bonus token
is dropped; the decoder counts that token as discarded, so the identity is exact (`lemma_3_1_gap` = 0).
Model-free drafters (prompt lookup) and Draft-All (which runs every drafter) are outside it.
"""
from __future__ import annotations

import torch


def draft_forwards(k: int | torch.Tensor) -> int | torch.Tensor:
    """Drafter forwards a round of k candidates costs (see the module docstring): k, catch-up included."""
    return k


def round_length(fires: torch.Tensor, cap: int | torch.Tensor) -> torch.Tensor:
    """fires (..., W + 1) bool, decision k at index k -> (...) long: the first k that fires, else W,
    then capped by `cap` (an int or a tensor broadcasting against the result)."""
    W = fires.shape[-1] - 1
    first = fires.to(torch.int8).argmax(-1)
    k = torch.where(fires.any(-1), first, torch.full_like(first, W))
    return torch.minimum(k, torch.as_tensor(cap, dtype=k.dtype))


def lemma_3_1_gap(n_draft: int, n_target: int, n_generated: int, n_discarded: int) -> int:
    """N_draft + N_target - (N + N_discarded): 0 for every generation of a stopping policy or bandit
    (a bonus token dropped after an accepted drafted EOS is counted as discarded)."""
    return n_draft + n_target - n_generated - n_discarded
