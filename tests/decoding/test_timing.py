"""decoding.timing: the timer's fields, and the statistics every reported speed carries."""
import statistics

import pytest

from specdraft.decoding.timing import Spread, bootstrap_median, bootstrap_rate_ratio, bootstrap_ratio, iqr, quantile, timed_call, verdict


def test_timed_call_returns_the_result_and_cpu_time_of_work():
    def work():
        return sum(i * i for i in range(200_000))

    out, t = timed_call(work)
    assert out == sum(i * i for i in range(200_000))
    assert t.time == t.cpu > 0 and t.wall > 0  # on CPU the robust time is the process's CPU time
    assert set(t.as_dict()) == {"time_s", "wall_s", "cpu_s"}


def test_sleeping_costs_wall_time_not_cpu_time():
    import time

    _, t = timed_call(lambda: time.sleep(0.05))
    assert t.wall >= 0.05 and t.cpu < 0.02  # what a busy neighbour does to the wall clock, not to our CPU time


def test_quantiles_match_numpy_linear():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(xs, 0.0) == 1.0 and quantile(xs, 1.0) == 5.0 and quantile(xs, 0.5) == 3.0
    assert quantile([1.0, 2.0], 0.25) == pytest.approx(1.25)
    assert iqr(xs) == Spread(3.0, 2.0, 4.0)


def test_bootstrap_median_interval_contains_the_median_and_narrows_with_more_items():
    import random

    rng = random.Random(1)
    few = [rng.gauss(1.0, 0.2) for _ in range(8)]
    many = [rng.gauss(1.0, 0.2) for _ in range(200)]
    a, b = bootstrap_median(few, seed=0), bootstrap_median(many, seed=0)
    assert a.lo <= a.median <= a.hi and b.lo <= b.median <= b.hi
    assert a.median == statistics.median(few)
    assert (b.hi - b.lo) < (a.hi - a.lo)
    assert b.lo < 1.0 < b.hi  # the true median is inside the 90% interval here
    assert bootstrap_median([2.0], seed=0) == Spread(2.0, 2.0, 2.0)
    assert bootstrap_median(few, seed=3) == bootstrap_median(few, seed=3)  # seeded


def test_bootstrap_ratio_and_verdict():
    same = [(1.0, 1.0), (2.0, 2.1), (3.0, 2.9), (1.5, 1.5)]
    s = bootstrap_ratio(same, seed=0)
    assert s.median == pytest.approx(7.5 / 7.5) and verdict(s, 1.0) == "within noise"
    faster = [(2.0 + 0.1 * i, 1.0) for i in range(10)]  # a is about twice b on every item
    s = bootstrap_ratio(faster, seed=0)
    assert s.median == pytest.approx(sum(a for a, _ in faster) / 10) and verdict(s, 1.0) == "above"
    assert verdict(bootstrap_ratio([(b, a) for a, b in faster], seed=0), 1.0) == "below"


def test_bootstrap_rate_ratio_pools_before_dividing():
    # per prompt (a's calls, a's tokens, b's calls, b's tokens): b is a method at MAT 4 on three prompts;
    # a is a baseline whose sampled generation on prompt 2 ended after 1 token (1 call)
    items = [(12, 48, 12, 48), (12, 48, 6, 24), (1, 1, 10, 40)]
    s = bootstrap_rate_ratio(items, seed=0)
    # the ratio of the pooled MATs: b's 112 / 28 = 4 over a's 97 / 25
    assert s.median == pytest.approx((112 / 28) / (97 / 25))
    per_prompt = sum(a / ta for a, ta, _, _ in items) / sum(b / tb for _, _, b, tb in items)
    assert per_prompt > 1.5 * s.median  # normalising per prompt lets the 1-token generation weigh a whole prompt
    assert s.lo <= s.median <= s.hi
    pairs = [(2.0, 1.0), (3.0, 1.5), (1.0, 1.1)]  # unit rates: the plain ratio of totals
    assert bootstrap_rate_ratio([(a, 1, b, 1) for a, b in pairs], seed=4) == bootstrap_ratio(pairs, seed=4)
