"""What a stopping rule's own work costs: the head's forward and the rule's decisions per draft step, and its
round state per round, beyond fixed K's, priced into a `CostTable`'s `rules` (`price_rules`, `price_head_rules`).
Timed apart from decodes, in a fraction of a second: on the demo pair's head (D = 4, H = 128, 1 thread) a
decision took 0.10-0.20 ms, a B = 1 eager round ~12 ms. The decoder's steps themselves are profile.py's.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Sequence

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.batched import reads_each_decision, rule_key
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.costs.model import CostTable
from specdraft.decoding.policies.decide import decide
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.rounds.shapes import HEAD_SEGMENT
from specdraft.decoding.timing import timed_call


def _rule_round(policy, hidden: torch.Tensor, drafts: int) -> None:
    """What a stopping rule adds to one eager round of `drafts` draft steps in `decoding.batched.draft`, with
    every row drafting: its round state and decision 0 (and, a rule that decides at 0, the host read of whether
    any row drafts), then per step the head's forward on e_{i-1} (from the second step: the first has no e yet),
    the decision and, a rule that can stop the batch (a head, or deciding at 0), the host read of whether any
    row drafts on, as `decoding.batched.draft_positions` makes them; a rule that decides after drafting, its
    widths."""
    rows, device = hidden.shape[0], hidden.device
    drafting = torch.ones(rows, dtype=torch.bool, device=device)
    state, _ = decide(policy, policy.round_state(rows, device), 0, drafting)
    first = getattr(policy, "decides_at_zero", False)
    if first:
        bool(drafting.any())
    for i in range(drafts):
        state, _ = decide(policy, state, i + 1, drafting, hidden=hidden if i >= 1 else None)
        if reads_each_decision(policy):
            bool(drafting.any())
    widths = getattr(policy, "widths", None)
    if widths is not None:
        int(widths(state).max())


def _rule_segment(compiler: StepCompiler, policy) -> Callable:
    """What a stopping rule adds to one compiled draft segment (`decoding.batched.compiled_segment`): per
    position its head's forward on e_i and its tensor decision, `HEAD_SEGMENT` positions as one graph;
    (state, hidden, drafting) -> (state, drafting)."""
    def segment(state, hidden, drafting):
        for i in range(HEAD_SEGMENT):
            state, stop = decide(policy, state, i + 1, drafting, hidden=hidden)
            drafting = drafting & ~stop
        return state, drafting
    return compiler.apply(segment, None, ("rule segment", rule_key(policy)))


@torch.inference_mode()
def price_rules(table: CostTable, policies: Sequence, hidden_size: int, *, repeats: int = 15,
                inner: int = 10) -> CostTable:
    """The table with each stopping rule's own work priced (`CostTable.rules`, by class name): per round and
    per draft step, what an eager round of the rule costs beyond the same round under fixed K (`_rule_round`:
    its head's forward on every draft, its tensor decisions, its host reads), at each of the table's batch
    sizes. The rules run with their heads (a policy whose head is None is priced without one) on random
    hidden states of `hidden_size` (values do not change an op's time), rounds of 0 and D = min(4, K - 1)
    drafts, each sample `inner` rounds, `repeats` samples interleaved with fixed K's, medians:
        per round = T_rule(0) - T_K(0),   per draft = ((T_rule(D) - T_rule(0)) - (T_K(D) - T_K(0))) / D
    clamped at 0. Seconds, not minutes: on the demo pair's head (D = 4, H = 128, 1 thread) a decision took
    0.10-0.20 ms, a B = 1 eager round ~12 ms. Under a compile mode the rule runs inside the compiled draft
    segments: a segment of its work (`_rule_segment`, HEAD_SEGMENT positions) compiled against the same for
    fixed K, per position, plus the host read after each segment, priced per draft (per round: 0). In decodes
    of the demo pair a rule's segment cost 0.29 / 1.0 ms more than fixed K's at B = 1 / 16."""

    if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
        raise InputError(f"hidden_size must be the drafter's hidden size, an integer >= 1, got {hidden_size!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats must be an integer >= 1, got {repeats!r}")
    priced = {name: (r, d) for name, r, d in table.rules}  # a rule priced again replaces its old costs
    compiler = StepCompiler(table.compile)  # one for every rule: fixed K's segment compiles once per batch size
    for policy in policies:
        head = getattr(policy, "head", None)
        param = next(head.parameters(), None) if isinstance(head, torch.nn.Module) else None
        device = param.device if param is not None else torch.device("cpu")
        # compiled: one segment of HEAD_SEGMENT positions and its host read; eagerly D = min(4, K - 1) drafts
        drafts = HEAD_SEGMENT if table.compile != "none" else max(1, min(4, policy.max_tokens - 1))
        baseline = build_policy(PolicySpec("fixed", k=max(policy.max_tokens, drafts)))
        per_round, per_draft = [], []
        for batch in table.batch_sizes:
            hidden = torch.randn(batch, hidden_size, generator=torch.Generator().manual_seed(batch)).to(device)
            if table.compile != "none":  # n = 0: nothing; n = HEAD_SEGMENT: one segment and its host read
                segment = {who: _rule_segment(compiler, who) for who in (policy, baseline)}
                drafting = torch.ones(batch, dtype=torch.bool, device=device)

                def compiled_round(who, n):
                    if n:  # fixed K drafts its round as one graph and reads nothing after it
                        out = segment[who](who.round_state(batch, device), hidden, drafting)
                        if who is policy:
                            bool(out[1].any())
                calls = {(who, n): (lambda who=who, n=n: [compiled_round(who, n) for _ in range(inner)])
                         for who in (policy, baseline) for n in (0, drafts)}
            else:
                calls = {(who, n): (lambda who=who, n=n: [_rule_round(who, hidden, n) for _ in range(inner)])
                         for who in (policy, baseline) for n in (0, drafts)}
            times: dict[tuple, list[float]] = {key: [] for key in calls}
            for rep in range(repeats + 1):  # pass 0 warms up
                for key, call in calls.items():
                    _, timing = timed_call(call, device)
                    if rep:
                        times[key].append(timing.time / inner)
            t = {key: statistics.median(v) for key, v in times.items()}
            per_round.append(max(0.0, t[(policy, 0)] - t[(baseline, 0)]))
            grow = (t[(policy, drafts)] - t[(policy, 0)]) - (t[(baseline, drafts)] - t[(baseline, 0)])
            per_draft.append(max(0.0, grow / drafts))
        priced[type(policy).__name__] = (tuple(per_round), tuple(per_draft))
    return dataclasses.replace(table, rules=tuple((name, r, d) for name, (r, d) in priced.items()))


def price_head_rules(table: CostTable, head: torch.nn.Module, hidden_size: int, prior, k_max: int,
                     threshold: float = 0.7) -> CostTable:
    """`price_rules` for every rule the decoder and `specdraft predict` run with a head: SpecDec++ per row and
    lockstep (at `threshold`), the batch-aware rules (with `prior`) and the global verify budget, at K_max
    `k_max` (the budget at min(4, k_max): its per-draft work hardly depends on K)."""
    k_max = min(k_max, table.max_drafts)
    specs = [PolicySpec("specdecpp", threshold=threshold, k_max=k_max, lockstep=lockstep) for lockstep in (False, True)]
    specs += [PolicySpec("batch-aware", k_max=k_max, lockstep=lockstep) for lockstep in (False, True)]
    specs += [PolicySpec("global-budget", k=min(4, k_max))]
    rules = [build_policy(spec, head=head, table=table, prior=prior) for spec in specs]
    return price_rules(table, rules, hidden_size)
