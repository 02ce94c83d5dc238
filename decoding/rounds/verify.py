"""One verification step of speculative sampling (SpecDec++ App. C, Alg. 2), as a pure function.

`verify` takes the *verification distribution* as an argument: the target's p for lossless speculative
sampling, or a cascade / lossy target pi = T(q, p) (Narasimhan et al., Faster Cascades via Speculative Decoding), which the same rule turns into
"accept when q(x) <= pi(x), else with probability pi(x)/q(x); on rejection sample norm((pi - q)_+)".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.decoding.rounds.sampling import sample


@dataclass(frozen=True)
class Verification:
    n_accepted: int  # leading draft tokens kept, 0..K
    token: int  # the extra token: a correction if n_accepted < n_drafted, else the bonus
    n_drafted: int

    @property
    def bonus(self) -> bool:
        return self.n_accepted == self.n_drafted

    @property
    def n_emitted(self) -> int:
        return self.n_accepted + 1


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm((p - q)_+), (V,). Falls back to p when the positive part is empty, which only happens when
    p == q up to rounding and a rejection was (numerically) impossible anyway."""
    r = (p - q).clamp_min(0.0)
    total = r.sum()
    return r / total if total > 0 else p


def verify(
    p: torch.Tensor,
    q: torch.Tensor,
    draft: torch.Tensor,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> Verification:
    """Accept a prefix of `draft` and pick the extra token.

    p: (K+1, V) verification distribution at each draft position plus the bonus position.
    q: (K, V) the distributions the draft tokens were sampled from.
    draft: (K,) long draft tokens. K may be 0 (a plain target step).
    greedy: exact match with argmax p, extra token = argmax p (the target's own greedy token).
    """
    K = draft.shape[0]
    assert p.shape[0] == K + 1 and q.shape[0] == K, (p.shape, q.shape, draft.shape)
    rows = torch.arange(K)
    if greedy:
        accepted = draft == p[:K].argmax(-1)  # (K,)
    else:
        # accept y_i with probability min(1, p_i(y_i) / q_i(y_i)); r * q < p avoids the division
        r = torch.rand(K, generator=generator)
        accepted = r * q[rows, draft] < p[rows, draft]  # (K,)
    n = K if bool(accepted.all()) else int((~accepted).int().argmax())  # first rejection
    if greedy:
        token = int(p[n].argmax())  # the target's own token, whatever q looked like
    else:
        dist = p[K] if n == K else residual(p[n], q[n])  # bonus from p_{K+1}, else the residual
        token = int(sample(dist, generator))
    return Verification(n_accepted=n, token=token, n_drafted=K)
