"""SpecTr token-level draft selection: k-sequential selection (k-Seq), SpecTr Alg. 2, as pure functions.

The paper writes p for the draft and q for the target; here, as everywhere in `decoding/`, p is the
target's (verification) distribution and q the drafter's. With k i.i.d. draft tokens X_1..X_k ~ q:

    beta(rho)  = sum_x min(q(x), p(x) / rho)
    p_acc      = 1 - (1 - beta)^k                       probability that some X_i is accepted
    accept X_i with probability min(1, p(X_i) / (rho q(X_i))), i = 1..k in order (first accepted wins)
    otherwise  Y ~ p_res(x) = (p(x) - min(q(x), p(x)/rho) p_acc / beta) / (1 - p_acc)

Y ~ p exactly whenever p_acc <= rho beta (p_res >= 0), i.e. for rho >= rho*, the root of
1 - (1 - beta(rho))^k = rho beta(rho) on [1, k] (SpecTr Thm. 1, Lemma 4). Acceptance falls as rho grows,
so rho* is the best valid choice; it guarantees (1 - 1/e) of the optimal transport plan's acceptance.
With k = 1, rho* = 1 and the rule is exactly speculative sampling's (accept min(1, p/q), residual
norm((p - q)_+)).

`kseq_select` and `recursive_rejection_select` share one signature (a `NodeRule`), so the tree verifier
in `decoding.rounds.tree` can verify i.i.d. draft sets (SpecTr) and general draft trees (SpecInfer / EAGLE's
multi-candidate residual rule of SpecInfer / EAGLE) with the same walk.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from specdraft.decoding.rounds.sampling import sample
from specdraft.decoding.rounds.verify import residual

# Bisection stops when the bracket around rho* is narrower than this (absolute, in units of rho); we return
# the upper end of the bracket, which always satisfies p_acc <= rho beta, so the plan stays valid.
RHO_TOL = 1e-6


def beta(p: torch.Tensor, q: torch.Tensor, rho: float) -> torch.Tensor:
    """beta(rho) = sum_x min(q(x), p(x)/rho): the per-draft acceptance probability. Scalar tensor."""
    return torch.minimum(q, p / rho).sum()


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, k: int, rho: float) -> torch.Tensor:
    """p_acc = 1 - (1 - beta(rho))^k: the probability that one of k i.i.d. drafts is accepted."""
    return 1.0 - (1.0 - beta(p, q, rho)).clamp(0.0, 1.0) ** k


def optimal_rho(p: torch.Tensor, q: torch.Tensor, k: int, tol: float = RHO_TOL) -> float:
    """rho* in [1, k]: the smallest rho with 1 - (1 - beta(rho))^k <= rho beta(rho), by bisection.

    g(rho) = p_acc(rho) - rho beta(rho) is non-increasing (p_acc falls with rho, rho beta(rho) =
    sum min(rho q, p) rises), g(1) >= 0 and g(k) <= 0 (Bernoulli's inequality), so bisection keeps a
    bracket [lo, hi] with g(hi) <= 0 and returns hi: at most `tol` above rho*, never below it.
    O(|V| log((k - 1) / tol)).
    """
    if k <= 1:
        return 1.0
    # only tokens where both are positive contribute to beta; at T = 1 that is the whole vocabulary,
    # under top-k / top-p a handful, so the ~log2((k-1)/tol) evaluations below stay cheap
    both = (p > 0) & (q > 0)
    p, q = p[both].double(), q[both].double()

    def g(rho: float) -> float:
        b = float(torch.minimum(q, p / rho).sum())
        return 1.0 - (1.0 - min(b, 1.0)) ** k - rho * b

    if g(1.0) <= 0.0:
        return 1.0
    lo, hi = 1.0, float(k)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if g(mid) <= 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def kseq_residual(p: torch.Tensor, q: torch.Tensor, k: int, rho: float) -> torch.Tensor:
    """p_res (V,), SpecTr Alg. 2 eq. (5) in our letters. When p_acc == 1 a rejection cannot happen and p
    is returned. Tiny negative entries (rounding around rho*) are clipped before normalising."""
    p64, q64 = p.double(), q.double()
    b = beta(p64, q64, rho)
    p_acc = acceptance_probability(p64, q64, k, rho)
    if float(1.0 - p_acc) <= 1e-12 or float(b) <= 0.0:
        return p  # no rejection possible (p_acc == 1), or nothing is ever accepted (beta == 0: p_res = p)
    res = (p64 - torch.minimum(q64, p64 / rho) * (p_acc / b)) / (1.0 - p_acc)
    res = res.clamp_min(0.0)
    total = res.sum()
    return (res / total).to(p.dtype) if total > 0 else p


# (p (V,), q (V,), candidates in trial order, generator) -> (index of the accepted candidate or -1, token)
NodeRule = Callable[[torch.Tensor, torch.Tensor, Sequence[int], "torch.Generator | None"], tuple[int, int]]


def kseq_select(
    p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int], generator: torch.Generator | None = None
) -> tuple[int, int]:
    """SpecTr Alg. 2: `candidates` are k i.i.d. draws from q, in the order they were drawn (or any order
    independent of their values). Returns (i, X_i) for the first accepted draft, else (-1, Y ~ p_res)."""
    k = len(candidates)
    if k == 0:
        return -1, int(sample(p, generator))
    rho = optimal_rho(p, q, k)
    eta = torch.rand(k, generator=generator)
    for i, x in enumerate(candidates):
        # eta <= min(1, p / (rho q))  <=>  eta rho q <= p (no division; q(x) > 0 since x was drawn from q)
        if float(eta[i]) * rho * float(q[x]) <= float(p[x]):
            return i, int(x)
    return -1, int(sample(kseq_residual(p, q, k, rho), generator))


def recursive_rejection_select(
    p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int], generator: torch.Generator | None = None
) -> tuple[int, int]:
    """The multi-candidate residual rule (SpecInfer's multi-step speculative sampling; EAGLE's tree
    sampling): try candidates in order, accepting x with probability min(1, p(x)/q(x)); on a rejection
    p <- norm((p - q)_+) and the next candidate is tried against the updated p. Lossless for candidates
    drawn i.i.d. from q; with one candidate it is speculative sampling's rule."""
    cur = p
    eta = torch.rand(len(candidates), generator=generator)
    for i, x in enumerate(candidates):
        if float(eta[i]) * float(q[x]) < float(cur[x]):
            return i, int(x)
        cur = residual(cur, q)
    return -1, int(sample(cur, generator))


def greedy_select(
    p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int], generator: torch.Generator | None = None
) -> tuple[int, int]:
    """T = 0: accept the candidate that is the target's argmax, else emit that argmax."""
    best = int(p.argmax())
    for i, x in enumerate(candidates):
        if int(x) == best:
            return i, best
    return -1, best


NODE_RULES: dict[str, NodeRule] = {"kseq": kseq_select, "recursive": recursive_rejection_select}
