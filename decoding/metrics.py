"""Counters and timings that come out of every generation (SpecDec++ §3, §5).

N            tokens generated (after EOS truncation)
N_target     target forward passes (one per speculative round; one per token when autoregressive)
N_draft      draft forward passes, catch-up prefills included
N_discarded  drafted tokens rejected by verification
MAT          N / N_target, mean tokens per target call, the bonus/correction token counted

Aggregation sums counters and times, so rates over a set of generations are ratios of totals (a long
generation weighs more than a short one). Per-generation rates stay available on each item.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class GenerationMetrics:
    n_generated: int = 0
    n_target: int = 0
    n_draft: int = 0
    n_discarded: int = 0
    drafted: list[int] = field(default_factory=list)  # tokens drafted per round
    accepted: list[int] = field(default_factory=list)  # of those, accepted per round
    time_draft: float = 0.0  # seconds in the speculator (drafting, catch-up, stopping head)
    time_target: float = 0.0  # seconds in target forwards (incl. turning logits into p)
    time_total: float = 0.0  # wall time of the whole call
    # CPU seconds of this process over the whole call (0 when the caller did not time it: the loop itself
    # reads only the wall clock; pipelines/evaluate.py times whole calls with decoding.timing)
    time_cpu: float = 0.0

    @property
    def n_rounds(self) -> int:
        return len(self.drafted)

    @property
    def time_other(self) -> float:
        """Verification, cache rollback and loop overhead."""
        return max(0.0, self.time_total - self.time_draft - self.time_target)

    @property
    def tokens_per_s(self) -> float:
        return self.n_generated / self.time_total if self.time_total > 0 else 0.0

    @property
    def mat(self) -> float:
        return self.n_generated / self.n_target if self.n_target else 0.0

    @property
    def discard_rate(self) -> float:
        return self.n_discarded / self.n_generated if self.n_generated else 0.0

    @property
    def verification_rate(self) -> float:
        return self.n_target / self.n_generated if self.n_generated else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (not the i.i.d. `a` of the analytic model; see decoding.costs.model)."""
        drafted = sum(self.drafted)
        return sum(self.accepted) / drafted if drafted else 0.0

    def summary(self) -> dict[str, float]:
        """Flat numbers for reports and manifests."""
        return {
            "N": self.n_generated,
            "N_target": self.n_target,
            "N_draft": self.n_draft,
            "N_discarded": self.n_discarded,
            "rounds": self.n_rounds,
            "MAT": self.mat,
            "discard_rate": self.discard_rate,
            "verification_rate": self.verification_rate,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_s": self.tokens_per_s,
            "time_total_s": self.time_total,
            "time_draft_s": self.time_draft,
            "time_target_s": self.time_target,
            "time_other_s": self.time_other,
            "time_cpu_s": self.time_cpu,
        }


def aggregate(items: Iterable[GenerationMetrics]) -> GenerationMetrics:
    """Sum of several generations' counters, per-round lists concatenated and times added."""
    total = GenerationMetrics()
    for m in items:
        total.n_generated += m.n_generated
        total.n_target += m.n_target
        total.n_draft += m.n_draft
        total.n_discarded += m.n_discarded
        total.drafted += m.drafted
        total.accepted += m.accepted
        total.time_draft += m.time_draft
        total.time_target += m.time_target
        total.time_total += m.time_total
        total.time_cpu += m.time_cpu
    return total


@dataclass
class GenerationResult:
    tokens: list[int]  # the generated token ids (prompt excluded), EOS included when it was emitted
    metrics: GenerationMetrics
