"""Where a stop decision is made. Every caller that asks a length policy whether to stop goes through here:
the batched loop (one decision per drafted position), the one-prompt loop (`OnePromptRule.stop`, a batch of
one), the throughput prediction (`decide_round`, a round from the acceptance summary's sigmas), the heads'
threshold simulator (`decisions`, every decision of every round start) and the cost profiler (the rule's
work priced on its own).

A decision is the policy's tensor rule, `stop_rows` (decoding/policies/stopping.py `LengthRule`), fed the
head's prediction on the drafter's last hidden state when the rule reads one (`head_sigma`). Decision k is
taken with y_1..y_k drafted and reads sigma of e_{k-1}: none exists before e_1 (SpecDec++'s one-token lag).
"""
from __future__ import annotations

import torch


def head_sigma(head, hidden: torch.Tensor) -> torch.Tensor:
    """sigmoid(head(e)) per row, (rows,) float64 on `hidden`'s device: the predicted acceptance a rule reads.
    The hidden state moves to the head's device and dtype first (a head may sit apart from the drafter)."""
    param = next(head.parameters(), None) if isinstance(head, torch.nn.Module) else None
    if param is not None:
        hidden = hidden.to(device=param.device, dtype=param.dtype)
    rows = hidden.shape[0] if hidden.dim() > 1 else 1
    return torch.sigmoid(head(hidden).float()).reshape(rows).to(hidden.device).double()


def decide(policy, state: tuple, k: int, drafting: torch.Tensor, *, hidden: torch.Tensor | None = None,
           sigma: torch.Tensor | None = None) -> tuple[tuple, torch.Tensor]:
    """Decision k of `policy` for every row -> (state, stop (rows,) bool). The rule reads `sigma` when given,
    else the head's prediction on `hidden` (e_{k-1}, the drafter's last fed token; None before e_1) when it
    reads a head at all. drafting: the rows still drafting, their caps and EOS applied."""
    if sigma is None and hidden is not None and policy.needs_hidden:
        sigma = head_sigma(policy.head, hidden)
    return policy.stop_rows(state, k, sigma, drafting)


def decide_round(policy, sigma: torch.Tensor, cap: torch.Tensor | int | None = None):
    """One round's decisions by `policy`, driven as the batched loop drives them: sigma (rows, W >= K_max)
    float64, sigma[:, j - 1] = sigmoid(head(e_j)); decision k reads e_{k-1}; cap: drafts each row may make at
    most (its remaining room). Returns ((rows,) drafts, final state, steps: the drafter steps the lockstep
    batch ran)."""
    rows = sigma.shape[0]
    cap = torch.as_tensor(policy.max_tokens if cap is None else cap, device=sigma.device).expand(rows)
    state = policy.round_state(rows, sigma.device)
    drafting = torch.ones(rows, dtype=torch.bool, device=sigma.device)
    k_rows = torch.zeros(rows, dtype=torch.long, device=sigma.device)
    steps = 0
    for k in range(policy.max_tokens + 1):
        drafting = drafting & (k < cap)
        state, stop = decide(policy, state, k, drafting, sigma=sigma[:, k - 2] if k >= 2 else None)
        drafting = drafting & ~stop
        if not bool(drafting.any()):  # the batched loop ends the round here too
            break
        k_rows += drafting  # the row drafts y_{k+1}
        steps = k + 1
    return k_rows, state, steps


def decisions(policy, sigma: torch.Tensor) -> torch.Tensor:
    """A length policy's decisions over whole rounds, from its own tensor rule (the one the decoders run).
    sigma (..., W): sigmoid(f(e_i)) at the round's draft tokens y_1..y_W in order. Returns (..., W + 1) bool,
    decision k at index k: decision k reads sigma_1..sigma_{k-1} (e_k is not computed yet when y_k is
    drafted). Every row is taken as drafting throughout: the caps (K_max, EOS, the length limit) are
    `decoding.rounds.lengths.round_length`'s."""
    lead, W = sigma.shape[:-1], sigma.shape[-1]
    flat = sigma.reshape(-1, W).double()
    drafting = torch.ones(flat.shape[0], dtype=torch.bool, device=sigma.device)
    state = policy.round_state(flat.shape[0], sigma.device)
    fires = []
    for k in range(W + 1):
        state, stop = decide(policy, state, k, drafting, sigma=flat[:, k - 2] if k >= 2 else None)
        fires.append(stop)
    return torch.stack(fires, dim=-1).reshape(*lead, W + 1)
