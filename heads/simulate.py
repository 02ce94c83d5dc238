"""Choosing a head's stopping threshold by simulating speculative decoding on dev sequences.

Cost model (SpecDec++ §3, Eq. 3.1): T = t_draft N_draft + t_target N_target. Only the
ratio c = t_draft / t_target matters for ranking policies, so costs are in units of one target
forward: cost = c N_draft + N_target, and plain autoregressive decoding of N tokens costs N.

The simulation, per dev sequence (a target response X_1..X_N with per-position acceptance
probabilities P_i = min(1, p_i(Y_i)/q_i(Y_i)) and head predictions sigma_i at the same positions):
- A round starts at position j (j tokens generated so far) and drafts K(j) tokens for positions
  j .. j+K-1. The policy fixes K(j); it never exceeds N - j (drafting stops at the end of the
  response, like the EOS rule of the paper's footnote 1).
- Token j+m is accepted with probability P_{j+m} given that the earlier ones were (the labels are
  exactly these conditional probabilities, on the target's own prefix X_<i - the same approximation
  the head is trained under). The first rejection at j+m emits the correction there, discards the
  K - m drafts from j+m on, and the next round starts at j+m+1. If all K are accepted the target's
  bonus token is emitted and the next round starts at j+K+1 (a bonus past the end is not counted in N).
- Every round costs one target forward (N_target += 1) and K drafter forwards (N_draft += K): the
  count of `decoding.rounds.lengths.draft_forwards`, the forwards the decoder spends (Lemma 3.1).
The expected N_target, N_draft, N_discarded are computed exactly by dynamic programming over the
position where each round starts (the probability that a round starts at j, pushed forward), for
many policies and sequences at once: no sampling, so no seed (a test checks it against Monte Carlo).
N is the response length. Totals are pooled over sequences (ratios of sums, i.e. the throughput of
decoding the whole dev set).

Policies:
- SpecDec++ (decoding/policies/stopping.py's SpecDecPP, paper Alg. 1): after sampling y_k the head has read
  e_1..e_{k-1} (the forward on y_{k-1} yields q_k and e_{k-1}), so y_k rides along unpredicted:
  K(j) = min{k >= 1 : 1 - prod_{i=j}^{j+k-2} sigma_i > h}, capped at k_max (= 20) and N - j; every
  uncapped round is >= 2 tokens. The decisions are SpecDecPP.stop_rows (via `decoding.policies.decide.decisions`), the rule the
  decoder runs, so the h chosen here is chosen under the cost the decoder pays (a test decodes
  teacher-forced greedy sequences and checks the counts equal).
- Fixed K: K(j) = min(K, N - j).
- Greedy oracle (Theorem 4.1): with greedy agreement indicators g_i (argmax q_i == argmax p_i on the
  target's prefix), P_i = g_i and K(j) = distance to the next disagreement (no k_max cap): every round
  stops right before a disagreement, whose token comes as the target's bonus, so N_discarded = 0 and
  N_target = |S| + 1, or |S| when the last response token is itself a disagreement (nothing is left to
  verify after it; the theorem's count is one higher there).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.defaults import DEFAULTS
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.policies.decide import decisions
from specdraft.decoding.rounds.lengths import draft_forwards, round_length

THRESHOLDS = (0.1, 0.3, 0.5, 0.7, 0.9)
K_MAX = DEFAULTS.k_max  # the decoder's SpecDec++ cap (decoding/defaults.py)


@dataclass(frozen=True)
class SimResult:
    policy: str  # "specdec++ h=0.7", "fixed K=4", "greedy oracle"
    n: float  # generated tokens (sum of response lengths)
    n_target: float  # expected target forwards
    n_draft: float  # expected draft tokens (= draft forwards)
    n_discarded: float  # expected rejected-or-later draft tokens
    cost: float  # c * n_draft + n_target, in target forwards

    @property
    def verification_rate(self) -> float:
        return self.n_target / self.n

    @property
    def discard_rate(self) -> float:
        return self.n_discarded / self.n

    @property
    def speedup(self) -> float:
        """Over autoregressive decoding with the target (cost n) under the same cost model."""
        return self.n / self.cost

    def as_dict(self) -> dict:
        return {**asdict(self), "verification_rate": self.verification_rate, "discard_rate": self.discard_rate,
                "speedup": self.speedup, "mean_accepted_per_target_call": self.n / self.n_target}


def pad(seqs: Sequence[torch.Tensor], fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """List of 1-D tensors -> ((B, T) float64 padded with `fill`, (B,) long lengths)."""
    if len(seqs) == 0:
        raise InputError("no dev sequences to simulate; the dev split is empty")
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    if int(lengths.max()) == 0:
        raise InputError("every dev sequence is empty; nothing to simulate (check the acceptance-data dev split)")
    out = torch.full((len(seqs), int(lengths.max())), fill, dtype=torch.float64)
    for b, s in enumerate(seqs):
        out[b, : len(s)] = s.detach().double().cpu()
    return out, lengths


def _cap_to_end(k: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """k (S, B, T) -> min(k, N_b - j), 0 past the end."""
    T = k.shape[-1]
    remaining = (lengths[:, None] - torch.arange(T)[None, :]).clamp(min=0)  # (B, T)
    return torch.minimum(k, remaining[None])


def specdecpp_round_lengths(
    sigma: torch.Tensor, lengths: torch.Tensor, thresholds: Sequence[float], k_max: int = K_MAX
) -> torch.Tensor:
    """(B, T) predicted acceptance probabilities -> (S, B, T) drafts per round started at j, one row per h."""
    B, T = sigma.shape
    padded = torch.cat([sigma.double(), torch.ones(B, k_max, dtype=torch.float64)], dim=1)
    windows = padded.unfold(1, k_max, 1)[:, :T]  # (B, T, k_max): sigma_j .. sigma_{j+k_max-1}
    # the decoder's own rule (SpecDecPP.stop_rows), one policy per threshold of the sweep
    fires = torch.stack([decisions(build_policy(PolicySpec("specdecpp", threshold=h, k_max=k_max)), windows) for h in thresholds])  # (S, B, T, k_max + 1)
    return _cap_to_end(round_length(fires, k_max), lengths)


def fixed_round_lengths(lengths: torch.Tensor, T: int, ks: Sequence[int]) -> torch.Tensor:
    k = torch.tensor(ks, dtype=torch.long)[:, None, None].expand(len(ks), len(lengths), T)
    return _cap_to_end(k, lengths)


def oracle_round_lengths(agree: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, T) bool greedy agreement -> (1, B, T) distance from j to the next disagreement (or the end)."""
    B, T = agree.shape
    dist = torch.zeros(B, T + 1, dtype=torch.long)
    for j in range(T - 1, -1, -1):
        dist[:, j] = torch.where(agree[:, j].bool(), dist[:, j + 1] + 1, torch.zeros_like(dist[:, j]))
    return _cap_to_end(dist[None, :, :T], lengths)


def expected_counts(accept: torch.Tensor, lengths: torch.Tensor, k: torch.Tensor) -> dict[str, torch.Tensor]:
    """Exact expected (n_target, n_draft, n_discarded) per policy and sequence, each (S, B).

    accept: (B, T) P_i; k: (S, B, T) drafts of the round that starts at j (0 for j >= N_b).
    Propagates start[j] = P(some round starts at position j) forward: a round at j moves its mass to
    j+m+1 when its first rejection is at j+m, and to j+K+1 when all K drafts are accepted. Then
    E[N_target] = sum_j start[j], E[N_draft] = sum_j start[j] K(j), and
    E[N_discarded] = sum_j start[j] E[discarded drafts | round at j] (+ the bonus token dropped after a
    round that ends on the sequence's last token, as the decoder counts it).
    """
    S, B, T = k.shape
    W = max(int(k.max()), 1)  # longest round
    p = torch.cat([accept.double(), torch.zeros(B, W, dtype=torch.float64)], dim=1)
    windows = p.unfold(1, W, 1)[:, :T]  # (B, T, W): P_j .. P_{j+W-1}
    reach = torch.cat([torch.ones(B, T, 1, dtype=torch.float64), windows.cumprod(-1)], dim=-1)  # P(first m accepted)
    m = torch.arange(W)
    start = torch.zeros(S, B, T + W + 2, dtype=torch.float64)
    start[:, :, 0] = 1.0
    active = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)  # (B, T)
    n_discarded = torch.zeros(S, B, dtype=torch.float64)
    for j in range(T):
        mass = start[:, :, j] * active[:, j]  # (S, B)
        kj = k[:, :, j]
        # (S, B, W): P(first rejection at j+m), for m inside the round
        rej = torch.where(m < kj[..., None], reach[:, j, :W] * (1 - windows[:, j]), 0.0)
        all_acc = reach[:, j].expand(S, B, W + 1).gather(-1, kj[..., None]).squeeze(-1)  # (S, B)
        start[:, :, j + 1 : j + 1 + W] += mass[..., None] * rej
        start.scatter_add_(-1, (j + kj + 1)[..., None], (mass * all_acc)[..., None])
        n_discarded += mass * (rej * (kj[..., None] - m)).sum(-1)
        # a round whose drafts all pass and reach the sequence's last token (its EOS): the target's bonus
        # token after it is dropped, and the decoder counts it as discarded (Lemma 3.1 stays exact)
        n_discarded += mass * all_acc * (j + kj == lengths[None, :]).to(torch.float64)
    rounds = start[:, :, :T] * active  # (S, B, T): P(a round starts at j)
    return {"n_target": rounds.sum(-1), "n_draft": (rounds * draft_forwards(k)).sum(-1), "n_discarded": n_discarded}


def _results(
    names: Sequence[str], counts: dict[str, torch.Tensor], lengths: torch.Tensor, cost_ratio: float
) -> list[SimResult]:
    out = []
    n = float(lengths.sum())
    for s, name in enumerate(names):
        nt, nd, nx = (float(counts[key][s].sum()) for key in ("n_target", "n_draft", "n_discarded"))
        out.append(SimResult(name, n, nt, nd, nx, cost_ratio * nd + nt))
    return out


def _check(cost_ratio: float, accept: Sequence[torch.Tensor]) -> None:
    if not cost_ratio >= 0:
        raise InputError(f"cost ratio c = t_draft / t_target must be >= 0, got {cost_ratio}")
    for b, a in enumerate(accept):
        if not (torch.isfinite(a).all() and (a >= 0).all() and (a <= 1).all()):
            raise InputError(
                f"dev sequence {b} has acceptance probabilities outside [0, 1] or NaN; rebuild acceptance-data"
            )


def simulate_specdecpp(
    accept: Sequence[torch.Tensor],
    sigma: Sequence[torch.Tensor],
    cost_ratio: float,
    thresholds: Sequence[float] = THRESHOLDS,
    k_max: int = K_MAX,
) -> list[SimResult]:
    """One SimResult per threshold h; accept[b], sigma[b]: (N_b,) P_i and the head's sigmoid outputs."""
    _check(cost_ratio, accept)
    for b, s in enumerate(sigma):
        if not (torch.isfinite(s).all() and (s >= 0).all() and (s <= 1).all()):
            raise InputError(
                f"head predictions for dev sequence {b} are not probabilities in [0, 1]; pass sigmoid(logits)"
            )
    if [len(a) for a in accept] != [len(s) for s in sigma]:
        raise InputError("acceptance labels and head predictions differ in length for some dev sequence")
    if k_max < 1:
        raise InputError(f"k_max must be >= 1, got {k_max}")
    p, lengths = pad(accept)
    sig, _ = pad(sigma, fill=1.0)
    k = specdecpp_round_lengths(sig, lengths, thresholds, k_max)
    return _results([f"specdec++ h={h:g}" for h in thresholds], expected_counts(p, lengths, k), lengths, cost_ratio)


def simulate_fixed_k(
    accept: Sequence[torch.Tensor], cost_ratio: float, ks: Sequence[int] = tuple(range(1, K_MAX + 1))
) -> list[SimResult]:
    """One SimResult per fixed candidate length K (default 1..K_MAX)."""
    _check(cost_ratio, accept)
    p, lengths = pad(accept)
    k = fixed_round_lengths(lengths, p.shape[1], ks)
    return _results([f"fixed K={kk}" for kk in ks], expected_counts(p, lengths, k), lengths, cost_ratio)


def greedy_oracle(agree: Sequence[torch.Tensor], cost_ratio: float) -> SimResult:
    """Theorem 4.1 oracle from per-position greedy agreement (bool) indicators.

    Every disagreement is the bonus token of the round that stops right before it, and the agreeing
    tail after the last one needs one more target call: N_target = |S| + 1[last token agrees],
    N_draft = N - |S|, N_discarded = 1[last token agrees] (that round's bonus token, after the sequence's
    last token, is dropped; equal to running `expected_counts` with `oracle_round_lengths`, which a test
    checks).
    """
    _check(cost_ratio, [a.double() for a in agree])
    if len(agree) == 0:
        raise InputError("no dev sequences to simulate; the dev split is empty")
    n = n_target = n_draft = n_discarded = 0.0
    for a in agree:
        a = a.bool()
        n_s = float((~a).sum())
        tail = float(len(a) > 0 and bool(a[-1]))
        n += len(a)
        n_target += n_s + tail
        n_draft += len(a) - n_s
        n_discarded += tail
    return SimResult("greedy oracle", n, n_target, n_draft, n_discarded, cost_ratio * n_draft + n_target)


def best(results: Sequence[SimResult]) -> SimResult:
    """Lowest cost (ties: the first, i.e. the smaller h or K)."""
    return min(results, key=lambda r: r.cost)
