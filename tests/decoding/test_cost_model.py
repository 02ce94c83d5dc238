"""Cost-model fit (SpecDec++ §5.2), Eq. 5.1, the fixed-K analytic speedup and metric aggregation."""
import pytest
import torch

from specdraft.decoding.costs.model import (
    acceptance_from_mat,
    analytic_speedup,
    expected_tokens_per_round,
    fit_costs,
    fit_from_metrics,
    implementation_efficiency,
)
from specdraft.core.errors import InputError
from specdraft.decoding.metrics import GenerationMetrics, aggregate


def test_fit_recovers_forward_times_from_noisy_rows():
    gen = torch.Generator().manual_seed(0)
    t_draft, t_target = 0.002, 0.010
    rows = []
    for _ in range(50):
        n_draft, n_target = int(torch.randint(20, 200, (1,), generator=gen)), int(torch.randint(5, 60, (1,), generator=gen))
        noise = 1 + 0.01 * float(torch.randn(1, generator=gen))
        rows.append((n_draft, n_target, (t_draft * n_draft + t_target * n_target) * noise))
    fit = fit_costs(rows)
    assert fit.t_draft == pytest.approx(t_draft, rel=0.05)
    assert fit.t_target == pytest.approx(t_target, rel=0.05)
    assert 0.98 < fit.r2 <= 1.0
    assert fit.cost_ratio == pytest.approx(0.2, rel=0.1)
    # a time that ignores the counts cannot be explained: R^2 collapses
    shuffled = [(d, t, rows[(i + 7) % 50][2]) for i, (d, t, _) in enumerate(rows)]
    assert fit_costs(shuffled).r2 < 0.5


def test_fit_never_reports_a_negative_time():
    # times that fall as N_target grows: plain least squares gives t_target < 0 here
    rows = [(10, 1, 1.0), (20, 2, 1.9), (30, 5, 2.6), (40, 9, 3.2)]
    coef = torch.linalg.lstsq(torch.tensor([r[:2] for r in rows], dtype=torch.float64),
                              torch.tensor([[r[2]] for r in rows], dtype=torch.float64)).solution[:, 0]
    assert float(coef[1]) < 0  # the case is real
    fit = fit_costs(rows)
    assert fit.t_draft > 0 and fit.t_target == 0.0
    # the constrained optimum: t_draft alone, by least squares through the origin
    assert fit.t_draft == pytest.approx(sum(d * t for d, _, t in rows) / sum(d * d for d, _, _ in rows))


def test_per_prompt_constants_are_fitted_within_prompts():
    # each prompt adds its own prefill cost to every run on it: the plain fit mistakes it for forwards
    gen = torch.Generator().manual_seed(1)
    t_draft, t_target = 0.002, 0.010
    rows, groups = [], []
    for prompt, prefill in enumerate([0.05, 0.4, 0.9, 0.2]):
        for _ in range(20):
            n_draft, n_target = int(torch.randint(20, 200, (1,), generator=gen)), int(torch.randint(5, 60, (1,), generator=gen))
            noise = 1 + 0.01 * float(torch.randn(1, generator=gen))
            rows.append((n_draft, n_target, (t_draft * n_draft + t_target * n_target) * noise + prefill))
            groups.append(f"p{prompt}")
    plain, grouped = fit_costs(rows), fit_costs(rows, groups)
    assert grouped.t_draft == pytest.approx(t_draft, rel=0.05) and grouped.t_target == pytest.approx(t_target, rel=0.05)
    assert grouped.r2 > 0.99 and grouped.r2_within > 0.95 and plain.r2 < 0.6 and plain.r2_within is None
    # the within-prompt R^2 is what the counts explain: times unrelated to them within each prompt score low
    shuffled = [(d, t, rows[i - i % 20 + (i + 7) % 20][2]) for i, (d, t, _) in enumerate(rows)]
    assert fit_costs(shuffled, groups).r2_within < 0.5
    with pytest.raises(InputError, match="group labels"):
        fit_costs(rows, groups[:-1])


def test_eq_5_1_is_eq_3_1_per_token():
    fit = fit_costs([(10, 2, 0.1 * 10 + 1.0 * 2), (30, 3, 0.1 * 30 + 1.0 * 3)])
    n, n_draft, n_target = 25, 30, 8
    n_discarded = n_draft + n_target - n  # Lemma 3.1 bookkeeping: N_draft + N_target = N + N_discarded
    per_token = fit.predict_latency(n_discarded / n, n_target / n)
    assert per_token * n == pytest.approx(fit.predict_total(n_draft, n_target))


def test_fit_from_metrics_and_bad_rows():
    items = [GenerationMetrics(n_draft=d, n_target=t, time_total=0.5 * d + 2 * t) for d, t in [(4, 1), (9, 5), (2, 7)]]
    fit = fit_from_metrics(items)
    assert (fit.t_draft, fit.t_target) == (pytest.approx(0.5), pytest.approx(2.0))
    with pytest.raises(InputError):
        fit_costs([(1, 1, 1.0)])


def test_analytic_speedup_by_hand():
    # a = 0.5, K = 2: E[tokens] = 1 + 0.5 + 0.25 = 1.75; c = 0.1 -> 1.75 / 1.2
    assert expected_tokens_per_round(0.5, 2) == pytest.approx(1.75)
    assert analytic_speedup(0.5, 2, 0.1) == pytest.approx(1.75 / 1.2)
    assert analytic_speedup(1.0, 4, 0.0) == 5.0  # the a -> 1 limit
    assert analytic_speedup(0.0, 4, 0.25) == 0.5  # nothing accepted: pure overhead
    assert analytic_speedup(0.5, 2, 0.1, verify_cost=1.3) == pytest.approx(1.75 / 1.5)  # a dearer (K+1)-token forward
    assert implementation_efficiency(1.75 / 1.2 * 0.9, 0.5, 2, 0.1) == pytest.approx(0.9)


def test_acceptance_from_mat_inverts_expected_tokens():
    for a in (0.0, 0.3, 0.8, 0.99):
        assert acceptance_from_mat(expected_tokens_per_round(a, 4), 4) == pytest.approx(a, abs=1e-6)
    with pytest.raises(InputError):
        acceptance_from_mat(6.0, 4)


def test_aggregate_sums_counters_and_rates_are_ratios_of_totals():
    a = GenerationMetrics(n_generated=10, n_target=4, n_draft=12, n_discarded=6, drafted=[3] * 4, accepted=[1, 2, 0, 3])
    a.time_total, a.time_draft, a.time_target = 1.0, 0.3, 0.5
    b = GenerationMetrics(n_generated=30, n_target=6, n_draft=18, n_discarded=0, drafted=[4] * 6, accepted=[4] * 6)
    b.time_total, b.time_draft, b.time_target = 2.0, 0.5, 1.0
    total = aggregate([a, b])
    assert (total.n_generated, total.n_target, total.n_draft, total.n_discarded) == (40, 10, 30, 6)
    assert total.mat == 4.0 and total.discard_rate == pytest.approx(0.15) and total.verification_rate == 0.25
    assert total.drafted == a.drafted + b.drafted and total.n_rounds == 10
    assert total.tokens_per_s == pytest.approx(40 / 3) and total.time_other == pytest.approx(0.7)
    assert total.summary()["MAT"] == 4.0
