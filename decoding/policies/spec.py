"""How a drafter decides its round length, as data, and the one function that turns it into a policy.

A `PolicySpec` is frozen and checked when it is made: a kind the decoder knows, each value in its range,
and only the values that kind reads (fixed K takes no threshold, SpecDec++ no K, and so on), so a
combination of options that cannot mean one thing is refused in one line instead of one of them being
silently dropped. `build_policy` is the only constructor the rest of the project calls: the generate
command, `generate_text`, evaluate's plan and the throughput prediction all describe what they want as a
spec and hand over the objects a rule reads at run time (a head, a cost table and its prior, a reference).

Lockstep belongs to the spec: a batch whose rows stop drafting together is a different rule from one whose
rows stop alone (decoding/policies/stopping.py, batch_aware.py), and at batch 1 the two take the same
decisions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from specdraft.core.errors import InputError
from specdraft.decoding.compat import check_k, check_threshold
from specdraft.decoding.policies.batch_aware import (BatchAwareSpecDec, GlobalVerifyBudget, KPerBatchSize,
                                                     LockstepBatchAwareSpecDec)
from specdraft.decoding.policies.batch_length_ucb import LengthUCB
from specdraft.decoding.policies.stopping import FixedK, HindsightOracle, LockstepSpecDecPP, SpecDecPP

# kind -> the values it reads (the others must be left out); lockstep is allowed where LOCKSTEP names it
READS = {
    "fixed": ("k",),  # draft K every round
    "specdecpp": ("threshold", "k_max"),  # SpecDec++: stop when the predicted rejection risk passes h
    "batch-aware": ("k_max",),  # the cost-priced rule (a cost table and its prior at run time)
    "global-budget": ("k",),  # every row drafts K, the verify widths chosen by the budget (vLLM #47808)
    "length-ucb": ("k", "delta", "cost_ratio"),  # UCBSpec over the lengths 0..K per row
    "k-per-batch-size": ("ks",),  # a fixed K per batch size, vLLM's schedule (batch size, K) pairs
    "oracle": (),  # greedy hindsight: the lower bound on target calls (a reference at run time)
}
LOCKSTEP = ("specdecpp", "batch-aware")
MEANING = {"k": "a fixed draft length K", "threshold": "SpecDec++'s h", "k_max": "the cap K_max",
           "delta": "UCBSpec's confidence delta", "cost_ratio": "the bandit's cost ratio c",
           "lockstep": "the batch stopping together", "ks": "a K per batch size"}


@dataclass(frozen=True)
class PolicySpec:
    """One stopping policy, validated: `kind` (READS' keys) and the values that kind reads."""

    kind: str
    k: int | None = None
    threshold: float | None = None
    k_max: int | None = None
    lockstep: bool = False
    delta: float | None = None
    cost_ratio: float | None = None
    ks: tuple[tuple[int, int], ...] | None = None  # (batch size, K): a batch of B rows drafts the largest size's <= B

    def __post_init__(self):
        if self.kind not in READS:
            raise InputError(f"unknown stopping policy {self.kind!r}; use one of {', '.join(READS)}")
        reads = READS[self.kind]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "kind" or value is None or value is False:
                continue
            if f.name not in reads and not (f.name == "lockstep" and self.kind in LOCKSTEP):
                raise InputError(f"{MEANING[f.name]} does not apply to {self.kind} drafting, which reads "
                                 f"{', '.join(MEANING[r] for r in reads) or 'nothing else'}; leave it out or choose "
                                 "the policy that reads it")
        missing = [r for r in reads if getattr(self, r) is None]
        if missing:
            raise InputError(f"{self.kind} drafting needs {', '.join(MEANING[r] for r in missing)}; give it")
        if self.k is not None:
            check_k(self.k)
        if self.k_max is not None:
            check_k(self.k_max, "K_max")
        if self.threshold is not None:
            check_threshold(self.threshold)
        if self.delta is not None and not (isinstance(self.delta, (int, float)) and 0.0 < self.delta < 1.0):
            raise InputError(f"delta (UCBSpec confidence) must be a number in (0, 1), got {self.delta!r}")
        if self.ks is not None and not (self.ks and all(
                isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                   for v in pair) and pair[0] >= 1 and pair[1] >= 0
                for pair in self.ks)):
            raise InputError(f"a K per batch size needs (batch size >= 1, K >= 0) pairs, got {self.ks!r}")
        if self.cost_ratio is not None and not (isinstance(self.cost_ratio, (int, float))
                                                and 0.0 <= self.cost_ratio < math.inf):
            raise InputError(f"cost ratio c = t_draft / t_target must be a finite number >= 0, got {self.cost_ratio!r}")


def build_policy(spec: PolicySpec, *, head=None, table=None, prior=None, reference: list[int] | None = None):
    """A fresh stopping policy for `spec` (policies keep per-decode state: build one per decode). head: the
    SpecDec++ head module the head rules read (None for the offline simulator, which brings its own sigmas);
    table and prior: the cost table and `Prior` the batch-aware rules price with; reference: prompt + the
    target's greedy tokens, the oracle's hindsight."""
    if spec.kind in ("batch-aware", "global-budget") and (table is None or prior is None):
        raise InputError(f"{spec.kind} drafting prices rounds with a cost table and a prior; give both")
    if spec.kind == "fixed":
        return FixedK(spec.k)
    if spec.kind == "specdecpp":
        return (LockstepSpecDecPP if spec.lockstep else SpecDecPP)(head, spec.threshold, spec.k_max)
    if spec.kind == "batch-aware":
        return (LockstepBatchAwareSpecDec if spec.lockstep else BatchAwareSpecDec)(head, table, prior, spec.k_max)
    if spec.kind == "global-budget":
        return GlobalVerifyBudget(head, table, prior, spec.k)
    if spec.kind == "length-ucb":
        return LengthUCB(tuple(range(spec.k + 1)), delta=spec.delta, cost_ratio=spec.cost_ratio)
    if spec.kind == "k-per-batch-size":
        return KPerBatchSize(dict(spec.ks))
    if reference is None:
        raise InputError("the hindsight oracle needs its reference (prompt + the target's greedy tokens)")
    return HindsightOracle(reference)
