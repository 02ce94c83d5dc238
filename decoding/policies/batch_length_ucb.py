"""UCBSpec over speculation lengths, one bandit per batch row, kept on the model's device
(BanditSpec Alg. 4 / Eq. 6, the same index as `decoding.bandits.selectors.UCBSpec`).

Arms are draft lengths gamma in `lengths` (0 = a plain target step), L = max(lengths). Each row
round-robins over the arms first, then picks argmax mu_i + cr_i with

    cr_i = (L / 2) sqrt( (1 + n_i) / n_i^2 * (1 + 2 ln(A t^2 sqrt(1 + n_i) / delta)) )

and observes the round's throughput (n_acc + 1) / (1 + c k) mapped onto [1, L + 1]
(`decoding.bandits.rewards.throughput_reward` / `throughput_bounds`): with c = 0 that is exactly BanditSpec's
accepted length Y = n_acc + 1. Selection and update are tensor ops over all rows: no host round trip.
Exact ties are broken uniformly at random through the decode's device generator (as the CPU selectors do
with their own stream), by adding noise far below any reward difference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.bandits.rewards import throughput_bounds


@dataclass(frozen=True)
class LengthUCB:
    """Policy for `decoding.batched.generate_batch`: per-row UCBSpec over draft lengths."""

    lengths: tuple[int, ...] = (0, 1, 2, 3, 4)
    delta: float = 0.5
    cost_ratio: float = 0.0  # c = t_draft / t_target; 0 rewards the accepted length Y itself

    def __post_init__(self):
        if not self.lengths or any(not isinstance(g, int) or g < 0 for g in self.lengths):
            raise InputError(f"speculation lengths must be integers >= 0, got {self.lengths!r}; e.g. (0, 1, 2, 3, 4)")
        if len(set(self.lengths)) != len(self.lengths) or max(self.lengths) < 1:
            raise InputError(f"speculation lengths must be distinct with at least one >= 1, got {self.lengths!r}")
        if not (0.0 < self.delta < 1.0):
            raise InputError(f"delta (UCBSpec confidence) must be in (0, 1), got {self.delta}; the paper's bound uses 0.5")
        if not (0.0 <= self.cost_ratio < math.inf):
            raise InputError(f"cost ratio c = t_draft / t_target must be a finite number >= 0, got {self.cost_ratio}")

    @property
    def max_tokens(self) -> int:
        return max(self.lengths)

    # the length rule (`decoding.policies.stopping.LengthRule`): each row's arm is its cap, chosen before the
    # round (`RowBandits.select`); within the round nothing stops a row early
    needs_hidden = False
    head = None

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return ()

    def stop_rows(self, state, k: int, sigma, drafting: torch.Tensor):
        return state, torch.zeros_like(drafting)


class RowBandits:
    """Pull counts and reward sums (B, A) of one LengthUCB per row, on `device`."""

    def __init__(self, policy: LengthUCB, batch: int, device: torch.device):
        self.policy = policy
        self.arms = torch.tensor(policy.lengths, dtype=torch.long, device=device)
        self.counts = torch.zeros(batch, len(policy.lengths), dtype=torch.float64, device=device)
        self.sums = torch.zeros_like(self.counts)
        self.t = torch.zeros(batch, dtype=torch.float64, device=device)
        self.low, self.high = throughput_bounds(policy.max_tokens, [policy.cost_ratio])
        self.choice = torch.zeros(batch, dtype=torch.long, device=device)

    def select(self, generator: torch.Generator | None) -> torch.Tensor:
        """(B,) long: the draft length each row uses this round."""
        A, L = self.arms.numel(), self.policy.max_tokens
        n = self.counts.clamp_min(1.0)
        log_term = torch.log(A * self.t[:, None].clamp_min(1.0) ** 2 * torch.sqrt(1 + n) / self.policy.delta)
        radius = (L / 2) * torch.sqrt((1 + n) / n**2 * (1 + 2 * log_term))
        index = self.sums / n + radius
        unpulled = self.counts == 0
        index = torch.where(unpulled, math.inf, index)
        # round-robin: the first unpulled arm wins outright (its +inf beats the tie noise)
        first = torch.where(unpulled, -torch.arange(A, device=index.device, dtype=index.dtype), -math.inf)
        noise = torch.rand(index.shape, generator=generator, device=index.device, dtype=index.dtype) * 1e-9
        score = torch.where(unpulled.any(1, keepdim=True), first, index + noise)
        self.choice = score.argmax(1)
        return self.arms[self.choice]

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` (finished rows dropped from the batch)."""
        self.counts, self.sums = self.counts[keep], self.sums[keep]
        self.t, self.choice = self.t[keep], self.choice[keep]

    def update(self, n_accepted: torch.Tensor, n_drafted: torch.Tensor, active: torch.Tensor) -> None:
        """Record each active row's round: reward = throughput mapped onto [1, L + 1]."""
        L = self.policy.max_tokens
        throughput = (n_accepted + 1).double() / (1.0 + self.policy.cost_ratio * n_drafted.double())
        reward = 1.0 + L * (throughput - self.low) / (self.high - self.low)
        pulled = torch.nn.functional.one_hot(self.choice, self.arms.numel()).double() * active[:, None].double()
        self.counts += pulled
        self.sums += pulled * reward[:, None]
        self.t += active.double()
