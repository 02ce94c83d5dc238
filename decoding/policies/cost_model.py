"""The SpecDec++ cost model (§3, §5.2, Eq. 3.1 and 5.1) and the fixed-K analytic speedup.

T_total = t_draft N_draft + t_target N_target                                  (3.1)
latency per token = t_draft (1 + N_discarded/N) + (t_target - t_draft) N_target/N (5.1)
fixed-K speedup over the target alone, per-token acceptance a, cost ratio c = t_draft / t_target:
    (1 - a^(K+1)) / ((1 - a)(K c + 1))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.metrics import GenerationMetrics


@dataclass(frozen=True)
class CostFit:
    t_draft: float  # seconds per draft forward
    t_target: float  # seconds per target forward
    r2: float  # coefficient of determination of the fit on T_total
    n_rows: int
    r2_within: float | None = None  # with groups: the counts' R^2 on the variation within groups alone

    @property
    def cost_ratio(self) -> float:
        return self.t_draft / self.t_target if self.t_target > 0 else float("inf")

    def predict_total(self, n_draft: float, n_target: float) -> float:
        """Eq. 3.1."""
        return self.t_draft * n_draft + self.t_target * n_target

    def predict_latency(self, discard_rate: float, verification_rate: float) -> float:
        """Eq. 5.1: seconds per generated token from the two hardware-independent rates."""
        return self.t_draft + self.t_draft * discard_rate + (self.t_target - self.t_draft) * verification_rate


def _nnls2(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Non-negative least squares with two unknowns, exact by cases: the unconstrained fit if both are
    >= 0, else the better of the two one-variable fits (each clamped at 0)."""
    coef = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
    if bool((coef < 0).any()):
        candidates = []
        for j in range(2):  # only column j free, the other at 0
            x = X[:, j]
            c = torch.zeros(2, dtype=torch.float64)
            denom = float(x @ x)
            c[j] = max(0.0, float(x @ y) / denom) if denom > 0 else 0.0
            candidates.append(c)
        coef = min(candidates, key=lambda c: float(((y - X @ c) ** 2).sum()))
    return coef


def fit_costs(rows: Iterable[tuple[float, float, float]], groups: Sequence[Hashable] | None = None) -> CostFit:
    """Non-negative least squares T_total ~ t_draft N_draft + t_target N_target, no intercept (Eq. 3.1),
    over (N_draft, N_target, T_total) rows, e.g. one per generation. R^2 is about the mean of T_total.
    A forward never takes negative time, but noisy times with correlated counts can pull plain least
    squares there, hence NNLS.

    groups (one label per row, e.g. the run's prompt): each group also gets its own constant,
    T_total ~ t_draft N_draft + t_target N_target + a_prompt. Eq. 3.1 counts the decode's forwards; what
    every method pays alike on a prompt (the prefill of both models over a prompt of its own length, the
    context its forwards attend over) is the prompt's constant. The fit is made within groups (every row
    minus its group's mean), `r2` is the whole model's on T_total and `r2_within` the counts' share of the
    variation within prompts, the stricter number."""
    data = torch.tensor(list(rows), dtype=torch.float64)
    if data.dim() != 2 or data.shape[0] < 2 or data.shape[1] != 3:
        raise InputError("fit_costs needs at least two (N_draft, N_target, T_total) rows")
    if groups is not None and len(groups) != data.shape[0]:
        raise InputError(f"fit_costs got {len(groups)} group labels for {data.shape[0]} rows")
    X, y = data[:, :2], data[:, 2]
    Xw, yw = X, y
    if groups is not None:
        index = {g: i for i, g in enumerate(dict.fromkeys(groups))}
        g = torch.tensor([index[x] for x in groups])
        counts = torch.bincount(g, minlength=len(index)).to(torch.float64)[:, None]
        means = torch.zeros(len(index), 3, dtype=torch.float64).index_add_(0, g, data) / counts
        Xw, yw = X - means[g, :2], y - means[g, 2]
    coef = _nnls2(Xw, yw)
    ss_res = float(((yw - Xw @ coef) ** 2).sum())  # the group constants fit the group means exactly
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    r2_within = None
    if groups is not None:
        ss_within = float((yw**2).sum())
        r2_within = 1.0 - ss_res / ss_within if ss_within > 0 else 1.0
    return CostFit(t_draft=float(coef[0]), t_target=float(coef[1]), r2=r2, n_rows=data.shape[0],
                   r2_within=r2_within)


def fit_from_metrics(items: Iterable[GenerationMetrics]) -> CostFit:
    return fit_costs((m.n_draft, m.n_target, m.time_total) for m in items)


def expected_tokens_per_round(a: float, k: int) -> float:
    """E[tokens per round] with i.i.d. per-token acceptance a: (1 - a^(K+1)) / (1 - a)."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def analytic_speedup(a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Fixed-K speedup over autoregressive decoding of the target (Leviathan et al. Thm 3.8).

    verify_cost: the target's (K+1)-token forward in units of its single-token forward. The textbook
    model (SpecDec++ §3) takes 1; on hardware that is not memory-bound at batch 1 (a CPU, a tiny model)
    it is measurably more, and passing the measured value separates that from decoder overhead."""
    return expected_tokens_per_round(a, k) / (k * c + verify_cost)


def acceptance_from_mat(mat: float, k: int) -> float:
    """The i.i.d. acceptance a whose expected tokens per round equals a measured MAT (fixed K).

    Measured this way the analytic speedup uses exactly the measured tokens per target call, so the
    implementation efficiency isolates time overheads from acceptance modelling error."""
    if not (1.0 <= mat <= k + 1):
        raise InputError(f"MAT must be in [1, K+1] = [1, {k + 1}], got {mat}")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection; expected_tokens_per_round is increasing in a
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_round(mid, k) < mat else (lo, mid)
    return (lo + hi) / 2


def implementation_efficiency(measured_speedup: float, a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Measured speedup / analytic speedup: 1.0 means no overhead beyond the cost model."""
    return measured_speedup / analytic_speedup(a, k, c, verify_cost)
