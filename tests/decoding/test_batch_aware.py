"""Batch-aware length policies (decoding/policies/batch_aware.py) on hand-made cost tables: exact small
decisions computed by hand, the regime where the rule is SpecDec++'s fixed-h rule, lockstep at batch 1,
and the engines' two baselines (global verify budget, K per batch size)."""
import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.policies.batch_aware import (BatchAwareSpecDec, GlobalVerifyBudget, KPerBatchSize,
                                                     LockstepBatchAwareSpecDec, Prior, budget_widths,
                                                     expected_round_tokens, k_per_batch_size)
from specdraft.heads.losses import weighted_bce_terms
from specdraft.decoding.costs.model import CostTable
from specdraft.decoding.policies.stopping import SpecDecPP
from specdraft.decoding.policies.decide import decide_round, decisions
from specdraft.decoding.rounds.lengths import round_length


def table(verify, draft, catchup=None, batch_sizes=(1, 256), k_max=4, compile="none") -> CostTable:
    """A CostTable from functions: verify(B, w), draft(B), catchup(B) (default: draft)."""
    catchup = catchup or draft
    widths = tuple(range(1, k_max + 2))
    return CostTable(batch_sizes=tuple(batch_sizes), widths=widths,
                     verify=tuple(tuple(float(verify(b, w)) for w in widths) for b in batch_sizes),
                     draft=tuple(float(draft(b)) for b in batch_sizes), catchup=tuple(float(catchup(b)) for b in batch_sizes),
                     device="test", torch_version="test", compile=compile, target_id="t", drafter_id="d")


def run_round(policy, sigma: torch.Tensor, cap: int | None = None) -> torch.Tensor:
    """Drafts per row of one round, the policy driven as the batched loop drives it (decide_round)."""
    return decide_round(policy, sigma.double(), cap)[0]


FLAT = dict(verify=lambda b, w: 1.0, draft=lambda b: 0.1)  # memory-bound verify, drafts at c = 0.1


def test_a_huge_cost_per_verified_position_gives_a_plain_target_step():
    steep = table(verify=lambda b, w: 1.0 + 100.0 * (w - 1), draft=lambda b: 0.01)
    for cls in (BatchAwareSpecDec, LockstepBatchAwareSpecDec):
        k = run_round(cls(None, steep, prior=0.99), torch.full((3, 4), 0.99))
        assert k.tolist() == [0, 0, 0]
    # the same rows at a flat verify draft: the decision really reads the cost
    assert run_round(BatchAwareSpecDec(None, table(**FLAT), prior=0.99), torch.full((3, 4), 0.99)).tolist() == [4, 4, 4]


def test_the_rule_prices_its_own_work_per_draft():
    """A table that prices the rule's own work (`CostTable.rules`, by class name) makes each draft dearer for that
    rule alone: at a per-draft cost beyond what a draft earns the lockstep rule drafts nothing, while the same
    table prices the per-row rule (not listed) as before."""
    import dataclasses

    flat = table(**FLAT)
    priced = dataclasses.replace(flat, rules=(("LockstepBatchAwareSpecDec", (0.0, 0.0), (5.0, 5.0)),))
    assert priced.round_cost(1, 3, "LockstepBatchAwareSpecDec") == pytest.approx(flat.round_cost(1, 3) + 15.0)
    assert priced.round_cost(1, 3, "BatchAwareSpecDec") == flat.round_cost(1, 3)
    sigma = torch.full((2, 4), 0.99)
    assert run_round(LockstepBatchAwareSpecDec(None, priced, prior=0.99), sigma).tolist() == [0, 0]
    assert run_round(BatchAwareSpecDec(None, priced, prior=0.99), sigma).tolist() == [4, 4]


def test_hand_computed_decisions():
    # C(k) = 1 + 0.5 k (verify flat 1.0, catch-up = draft = 0.5), prior 0.8, K_max = 4.
    t = table(verify=lambda b, w: 1.0, draft=lambda b: 0.5)
    policy = BatchAwareSpecDec(None, t, prior=0.8, reference_rate=None)  # lam = the round's own rate
    # decision 0: T = 1, rate 1/1; k' = 1: gain 0.8 - 0.5 = 0.3 > 0 -> draft
    state = policy.round_state(1, torch.device("cpu"))
    state, stop = policy.stop_rows(state, 0, None, torch.ones(1, dtype=torch.bool))
    assert not stop.item()
    # decision 1: T = 1.8, C = 1.5, rate 1.2; k' = 2: 0.64 - 0.6 = 0.04 > 0 -> draft
    state, stop = policy.stop_rows(state, 1, None, torch.ones(1, dtype=torch.bool))
    assert not stop.item()
    assert state[2].item() == pytest.approx(1.8)
    # decision 2 with sigma_1 = 0.5: s_1 = 0.5, T = 1 + 0.5 + 0.5 * 0.8 = 1.9, C = 2, rate 0.95;
    # k' = 3: s_3 ~ 0.5 * 0.64 = 0.32 < 0.95 * 0.5 and every longer round less -> stop
    state, stop = policy.stop_rows(state, 2, torch.tensor([0.5], dtype=torch.float64), torch.ones(1, dtype=torch.bool))
    assert stop.item() and state[2].item() == pytest.approx(1.9)
    # with sigma_1 = 0.99 instead: T = 2.782, rate 1.391; k' = 3: 0.99 * 0.64 = 0.6336 - 0.6955 < 0 as well,
    # but k' = 4 adds 0.99 (0.64 + 0.512) = 1.14 against 1.391 * 1.0: 1.14 - 1.391 < 0 -> stop too
    state = policy.round_state(1, torch.device("cpu"))
    for k, s in ((0, None), (1, None), (2, torch.tensor([0.99], dtype=torch.float64))):
        state, stop = policy.stop_rows(state, k, s, torch.ones(1, dtype=torch.bool))
    assert stop.item()
    # the default lam, the best fixed K's rate: E[T(K)] / C(K) = 1, 1.2, 1.22, 1.181, 1.12 for K = 0..4 -> 1.22.
    # The round that goes well draws on (k' = 3: 0.99 * 0.64 - 1.22 * 0.5 = +0.024), the one that goes badly
    # stops (0.5 * 0.64 - 0.61 < 0, 0.5 * 1.152 - 1.22 < 0), where the round's own rate stopped both
    best = BatchAwareSpecDec(None, t, prior=0.8)
    assert best.row_rate(1) == pytest.approx(2.44 / 2)
    for s1, stops in ((0.99, False), (0.5, True)):
        state = best.round_state(1, torch.device("cpu"))
        for k, s in ((0, None), (1, None), (2, torch.tensor([s1], dtype=torch.float64))):
            state, stop = best.stop_rows(state, k, s, torch.ones(1, dtype=torch.bool))
            assert stop.item() == (stops and k == 2)
    # a cheaper drafter (0.1 per step) at the same sigmas goes on
    cheap = BatchAwareSpecDec(None, table(**FLAT), prior=0.8)
    assert run_round(cheap, torch.tensor([[0.99, 0.99, 0.99, 0.99]])).item() == 4


def test_one_comparison_per_decision_is_the_rules_max_over_longer_rounds():
    """The rule's decision (`_stops`: s_{k-1} < rate * theta_k) against its definition, computed here by brute
    force: stop iff T(k') - T(k) - rate (C(k') - C(k)) < 0 for every k' = k + 1..K_max, with T from the prior's
    curve. Random priors (some with a zero), costs that fall as well as rise with k, random survivals and
    rates: every decision agrees, both per row and lockstep."""
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for trial in range(200):
        k_max = int(torch.randint(1, 7, (1,), generator=gen))
        a = torch.rand(k_max, generator=gen).double()
        if trial % 7 == 0:
            a[int(torch.randint(0, k_max, (1,), generator=gen))] = 0.0
        verify = torch.rand(k_max + 1, generator=gen).double() * 3 + 1  # not monotone in the width
        cost = table(verify=lambda b, w: float(verify[w - 1]), draft=lambda b: float(torch.rand(1, generator=gen)) + 0.01,
                     batch_sizes=(1, 8), k_max=k_max)
        rate = float(torch.rand(1, generator=gen)) * 2 + 0.01
        policy = BatchAwareSpecDec(None, cost, Prior(tuple(float(x) for x in a)), k_max, reference_rate=rate)
        costs = policy.costs(4)
        for k in range(k_max):
            s_prev = torch.rand(16, generator=gen).double()
            gains = []
            first = k - 1 if k >= 1 else 0  # s_j / s_{k-1} = a_k .. a_j (at k = 0: s_j = a_1 .. a_j)
            for k2 in range(k + 1, k_max + 1):  # T(k2) - T(k) per unit of s_{k-1}: sum over j in (k, k2]
                more = sum(float(torch.prod(a[first:j])) for j in range(k + 1, k2 + 1))
                gains.append(s_prev * more - rate * (costs[k2] - costs[k]))
            brute = torch.stack(gains).amax(0) < 0
            assert torch.equal(policy._stops(k, 4, torch.ones(16, dtype=torch.float64), s_prev), brute)
            checked += 1
    assert checked > 500


def test_decision_zero_known_to_the_host_is_the_rules_own():
    """`zero_stop(B)`, which a compiled decode uses instead of computing and reading decision 0, equals what
    `stop_rows` decides at k = 0 for every row, per row and lockstep, with a fixed rate, the best fixed K's and
    the own rate, over random priors and tables where drafting pays and where it does not (both outcomes
    occur); lockstep with the own rate depends on the rows and says so (None)."""
    gen = torch.Generator().manual_seed(1)
    outcomes = set()
    for trial in range(120):
        k_max = int(torch.randint(1, 7, (1,), generator=gen))
        a = tuple(float(x) for x in torch.rand(k_max, generator=gen))
        d = float(torch.rand(1, generator=gen)) * 2  # from cheap drafts to ones that never pay
        cost = table(verify=lambda b, w: 1.0 + 0.05 * b * (w - 1), draft=lambda b: d + 0.01, batch_sizes=(1, 8),
                     k_max=k_max)
        for cls in (BatchAwareSpecDec, LockstepBatchAwareSpecDec):
            for reference in ("best-k", float(torch.rand(1, generator=gen)) * 2 + 0.01, None):
                kwargs = {} if reference == "best-k" else {"reference_rate": reference}
                policy = cls(None, cost, Prior(a), k_max, **kwargs)
                for rows in (1, 3, 8):
                    known = policy.zero_stop(rows)
                    if reference is None and cls is LockstepBatchAwareSpecDec:
                        assert known is None
                        continue
                    drafting = torch.ones(rows, dtype=torch.bool)
                    _, stop = policy.stop_rows(policy.round_state(rows, torch.device("cpu")), 0, None, drafting)
                    assert torch.equal(stop, torch.full((rows,), known)), (trial, cls.__name__, reference, rows)
                    outcomes.add(known)
    assert outcomes == {True, False}
    ks = KPerBatchSize({1: 3, 4: 0})
    assert (ks.zero_stop(1), ks.zero_stop(5)) == (False, True)


def test_calibration_undoes_the_weighted_bce_optimum():
    """A head trained with w_rej = r predicts the minimiser of the weighted loss; Prior(odds=r).calibrate maps
    it back to the acceptance P it was trained on."""
    P = torch.tensor([0.05, 0.3, 0.5, 0.8, 0.97], dtype=torch.float64)
    for r in (1.0, 3.0, 6.0):
        logit = torch.zeros_like(P, requires_grad=True)
        opt = torch.optim.LBFGS([logit], max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-14)

        def closure():
            opt.zero_grad()
            loss = weighted_bce_terms(logit, P, r).sum()
            loss.backward()
            return loss
        opt.step(closure)
        sigma = torch.sigmoid(logit.detach())
        assert torch.allclose(Prior((0.5,), odds=r).calibrate(sigma), P, atol=1e-6), r
        assert r == 1.0 or bool((sigma < P).all())  # the weighted head is biased low, as the rule must undo


def test_a_rising_acceptance_curve_prices_unread_drafts_above_its_first_value():
    """A curve whose later drafts are likelier (accepted runs predict more acceptance) earns a longer round
    than its first value alone. Hand-computed at C(k) = 1 + 0.3 k, a_1 = 0.5: decision 0 drafts either way
    (gain 0.5 - 1 x 0.3 > 0); at decision 1, T = 1.5, rate 1.5 / 1.3 = 1.154, one more draft earns
    a_1 a_2 against 1.154 x 0.3 = 0.346: 0.25 with a_2 = 0.5 stops, 0.475 with a_2 = 0.95 goes on."""
    t = table(verify=lambda b, w: 1.0, draft=lambda b: 0.3)
    sigma = torch.full((1, 4), 0.95)
    assert run_round(BatchAwareSpecDec(None, t, Prior((0.5,))), sigma).item() == 1
    assert run_round(BatchAwareSpecDec(None, t, Prior((0.5, 0.95))), sigma).item() > 2
    with pytest.raises(InputError, match="odds"):
        Prior((0.5,), odds=0.0)
    with pytest.raises(InputError, match="acceptance"):
        Prior(())


def test_compiled_costs_are_the_draft_graphs_staircase():
    """Compiled, a rule with a head drafts in whole segments (`round_feeds`: 1..4 drafts of 8 pay 4 feeds, 5..8 pay
    7) and verifies at a padded width (3 and 4 drafts: 5 positions), so its C_B(k) is a staircase and a draft
    inside a segment already paid for costs nothing more: the rule's rounds end only where the cost steps
    (0, 1, 2, 4 or 8 drafts). The same table eager prices k - 1 feeds, and the same sigmas end rounds in between."""
    import dataclasses

    eager_table = table(verify=lambda b, w: 1.0 + 0.15 * w, draft=lambda b: 0.1, k_max=8)
    compiled_table = dataclasses.replace(eager_table, compile="default")
    for cls in (BatchAwareSpecDec, LockstepBatchAwareSpecDec):
        eager, compiled = cls(None, eager_table, prior=0.7), cls(None, compiled_table, prior=0.7)
        assert eager.costs(1) == [eager_table.round_cost(1, k) for k in range(9)]
        assert compiled.costs(1) == [compiled_table.round_cost(1, k, feeds=f)
                                     for k, f in enumerate((0, 4, 4, 4, 4, 7, 7, 7, 7))]
        gen = torch.Generator().manual_seed(0)
        ends = {"eager": set(), "compiled": set()}
        for _ in range(200):
            sigma = torch.rand(1 if cls.lockstep else 3, 8, generator=gen).double() ** 0.3
            ends["eager"] |= set(run_round(eager, sigma).tolist())
            ends["compiled"] |= set(run_round(compiled, sigma).tolist())
        assert ends["compiled"] <= {0, 1, 2, 4, 8} and len(ends["compiled"]) >= 2
        assert ends["eager"] & {3, 5, 6, 7} and len(ends["compiled"]) >= 3, ends


@pytest.mark.slow
def test_the_rules_first_decision_inside_a_draft_graph_breaks_no_graph():
    """A rule's costs and bars are Python floats computed on first use, which may be while dynamo traces a
    compiled draft graph (a price_rules segment calls the rule before any eager decision): they must fold into
    constants there. A keyed max() among them (tried for a segment plan) broke the graph, and the priced per-draft
    work of the batch-aware rules came out 0.09-0.10 ms at B = 1 against 0.03."""
    from specdraft.decoding.compilation import StepCompiler
    from specdraft.decoding.costs.rules import _rule_segment
    from tests.decoding.test_greedy_equivalence import random_head

    head = random_head(32, 0)
    for cls in (BatchAwareSpecDec, LockstepBatchAwareSpecDec):
        rule = cls(head, table(**FLAT, k_max=8, compile="default"), 0.7, 8)
        torch._dynamo.utils.counters.clear()
        with torch.inference_mode():
            _rule_segment(StepCompiler("default"), rule)(rule.round_state(3, "cpu"), torch.randn(3, 32),
                                                        torch.ones(3, dtype=torch.bool))
        assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])


def test_linear_costs_and_a_fixed_rate_give_specdecpp_with_its_threshold():
    """Regime (docs/predict.md): verify flat in w, every drafter forward t_d, a fixed reference rate lam:
    stop iff s_{k-1} prior^2 < lam t_d, i.e. SpecDec++'s 1 - p_hat > h with h = 1 - lam t_d / prior^2."""
    gen = torch.Generator().manual_seed(0)
    t_d, prior, k_max = 0.1, 0.8, 6
    t = table(verify=lambda b, w: 1.0, draft=lambda b: t_d, k_max=k_max)
    sigma = torch.rand(200, k_max, generator=gen, dtype=torch.float64) * 0.5 + 0.5
    for h in (0.3, 0.5, 0.7, 0.9):
        lam = (1 - h) * prior**2 / t_d
        ours = run_round(BatchAwareSpecDec(None, t, prior, reference_rate=lam), sigma)
        paper = round_length(decisions(SpecDecPP(None, h, k_max=sigma.shape[-1]), sigma), k_max)
        assert torch.equal(ours, paper), h
        assert len(set(paper.tolist())) > 1  # the case is not trivial: rounds of several lengths


def test_lockstep_at_batch_one_is_the_per_row_rule_and_differs_in_a_batch():
    gen = torch.Generator().manual_seed(1)
    t = table(verify=lambda b, w: 1.0 + 0.05 * b * w, draft=lambda b: 0.05 + 0.01 * b, batch_sizes=(1, 256), k_max=6)
    sigma = torch.rand(300, 6, generator=gen, dtype=torch.float64)
    for prior in (0.3, 0.6, 0.9):
        per_row, lockstep = BatchAwareSpecDec(None, t, prior), LockstepBatchAwareSpecDec(None, t, prior)
        one = [run_round(per_row, s[None]).item() for s in sigma]
        assert one == [run_round(lockstep, s[None]).item() for s in sigma]
    # in a batch of 4 the lockstep rows stop together: one length per batch
    k = run_round(LockstepBatchAwareSpecDec(None, t, 0.6), sigma[:4])
    assert len(set(k.tolist())) == 1


def test_a_larger_batch_drafts_less_where_the_verify_grows_with_it():
    t = table(verify=lambda b, w: 1.0 + 0.02 * b * (w - 1), draft=lambda b: 0.05, batch_sizes=(1, 256), k_max=8)
    sigma = torch.full((64, 8), 0.85, dtype=torch.float64)
    k1 = run_round(BatchAwareSpecDec(None, t, 0.85), sigma[:1]).item()
    k64 = run_round(BatchAwareSpecDec(None, t, 0.85), sigma).tolist()
    assert k1 > k64[0] == min(k64) == max(k64)


def test_budget_widths_by_hand():
    # 2 rows, 2 drafts each; verify at batch 2 costs 1.0 + 0.5 per draft position of the widest row,
    # the two drafting steps 0.1 + 0.1 (sunk, but in the cost). Survival sorted: 0.9, 0.5, 0.2, 0.1
    # N = 0: 2 / 1.2 = 1.667;  N = 1 (w 1): 2.9 / 1.7 = 1.706;  N = 2 (w 2): 3.4 / 2.2 = 1.545;
    # N = 3 (w 2): 3.6 / 2.2;  N = 4: 3.7 / 2.2 -> N = 1: row 0 verifies 1 draft, row 1 none
    t = table(verify=lambda b, w: 1.0 + 0.5 * (w - 1), draft=lambda b: 0.1, batch_sizes=(1, 256), k_max=2)
    s = torch.tensor([[0.9, 0.5], [0.2, 0.1]])
    assert budget_widths(s, t).tolist() == [1, 0]
    # a cheaper verify position (0.05): N = 4 (3.7 / 1.25) beats N = 2 (3.4 / 1.25), both widths 2
    cheap = table(verify=lambda b, w: 1.0 + 0.05 * (w - 1), draft=lambda b: 0.1, batch_sizes=(1, 256), k_max=2)
    assert budget_widths(s, cheap).tolist() == [2, 2]
    # ties keep prefixes: equal survival everywhere picks the earlier positions first
    k = budget_widths(torch.full((3, 2), 0.5), cheap)
    assert (k <= 2).all() and k.max() - k.min() <= 1


def test_global_budget_policy_drafts_to_the_cap_and_tracks_survival():
    t = table(verify=lambda b, w: 1.0 + 0.5 * (w - 1), draft=lambda b: 0.1, batch_sizes=(1, 256), k_max=2)
    policy = GlobalVerifyBudget(None, t, prior=0.9)
    sigma = torch.tensor([[0.5, 0.7], [0.2, 0.7]], dtype=torch.float64)
    state = policy.round_state(2, torch.device("cpu"))
    drafting = torch.ones(2, dtype=torch.bool)
    for k in range(3):
        state, stop = policy.stop_rows(state, k, sigma[:, k - 2] if k >= 2 else None, drafting)
        assert not stop.any()
    # s_1 = sigma_1 exact, s_2 = sigma_1 * prior (sigma_2 is never read: the lag)
    assert torch.allclose(state[1], torch.tensor([[0.5, 0.45], [0.2, 0.18]], dtype=torch.float64))
    assert policy.widths(state).tolist() == budget_widths(state[1], t).tolist()


def test_k_per_batch_size_from_the_cost_model():
    t = table(verify=lambda b, w: 1.0 + 0.02 * b * (w - 1), draft=lambda b: 0.05, batch_sizes=(1, 8, 64, 256), k_max=8)
    ks = k_per_batch_size(t, [0.8])
    assert ks[1] > ks[8] > ks[64] == 0  # cheaper verification at small B: longer rounds; none at 64
    # the K chosen is the argmax of expected tokens per second (checked against every other K)
    for b, k in ks.items():
        rates = [expected_round_tokens([0.8], j) / t.round_cost(b, j) for j in range(9)]
        assert rates[k] == max(rates)
    policy = KPerBatchSize(ks)
    assert [policy.k_for(b) for b in (1, 7, 8, 63, 64, 200)] == [ks[1], ks[1], ks[8], ks[8], ks[64], ks[64]]
    assert run_round(policy, torch.zeros(8, 8)).tolist() == [ks[8]] * 8
    assert run_round(policy, torch.zeros(64, 8)).tolist() == [0] * 64


@pytest.mark.parametrize("build", [
    lambda t: BatchAwareSpecDec(None, t, prior=1.5),
    lambda t: BatchAwareSpecDec(None, t, prior=0.5, k_max=9),
    lambda t: BatchAwareSpecDec(None, "table", prior=0.5),
    lambda t: BatchAwareSpecDec(None, t, prior=0.5, reference_rate=-1.0),
    lambda t: KPerBatchSize({0: 2}),
    lambda t: k_per_batch_size(t, []),
    lambda t: budget_widths(torch.zeros(3), t),
])
def test_bad_input_is_one_line(build):
    with pytest.raises(InputError) as e:
        build(table(**FLAT))
    assert "\n" not in str(e.value)
