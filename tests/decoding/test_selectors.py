"""Arm selectors against hand-computed values, on simulated bandits, and on bad input.

Expected values are written as the paper's formulas with the numbers filled in, not copied from output.
"""
import math
import random

import pytest

from specdraft.core.errors import InputError
from specdraft.decoding.bandits.selectors import (
    EXP3,
    SELECTORS,
    EXP3Spec,
    FixedArm,
    MetaSDUCB,
    OnePassOracle,
    OracleFixedArm,
    SequentialHalving,
    UCBSpec,
    UniformRandom,
    make_selector,
)


def play(selector, rewards):
    """Run scripted rounds; rewards: list of (expected arm, reward)."""
    for expected, reward in rewards:
        arm = selector.select()
        assert arm == expected
        selector.update(arm, reward)


# ---------------------------------------------------------------- MetaSD-UCB (MetaSD Alg. 2)
def test_metasd_ucb_round_robin_then_index_by_hand():
    ucb = MetaSDUCB(3, beta=0.01)
    play(ucb, [(0, 0.5), (1, 0.7), (2, 0.2)])  # one round-robin pass in arm order
    assert ucb.t == 3 and ucb.counts == [1, 1, 1]
    bonus = 0.01 * math.sqrt(2 * math.log(3) / 1)
    assert ucb.index() == pytest.approx([0.5 + bonus, 0.7 + bonus, 0.2 + bonus])
    play(ucb, [(1, 0.1)])  # argmax mean
    assert ucb.means == pytest.approx([0.5, (0.7 + 0.1) / 2, 0.2])
    # t = 4: arm 0 has 0.5 + 0.01 sqrt(2 ln 4), arm 1 has 0.4 + 0.01 sqrt(2 ln 4 / 2)
    assert ucb.index()[0] == pytest.approx(0.5 + 0.01 * math.sqrt(2 * math.log(4)))
    assert ucb.index()[1] == pytest.approx(0.4 + 0.01 * math.sqrt(2 * math.log(4) / 2))
    assert ucb.select() == 0


def test_metasd_ucb_exploration_bonus_can_overturn_the_mean():
    ucb = MetaSDUCB(2, beta=0.5)
    play(ucb, [(0, 0.6), (1, 0.5)])
    # t = 2: 0.6 + 0.5 sqrt(2 ln 2) > 0.5 + 0.5 sqrt(2 ln 2)
    play(ucb, [(0, 0.6)])
    # t = 3: arm 0 = 0.6 + 0.5 sqrt(2 ln 3 / 2) = 1.124..., arm 1 = 0.5 + 0.5 sqrt(2 ln 3) = 1.241...
    assert 0.6 + 0.5 * math.sqrt(2 * math.log(3) / 2) < 0.5 + 0.5 * math.sqrt(2 * math.log(3))
    assert ucb.select() == 1


# ---------------------------------------------------------------- MetaSD-EXP3 (MetaSD Alg. 7)
def test_exp3_probabilities_by_hand():
    exp3 = EXP3(2, gamma=0.4, seed=3)
    assert exp3.probabilities() == pytest.approx([0.6 * 0.5 + 0.4 / 2] * 2)  # = 0.5 each
    a = exp3.select()
    exp3.update(a, 0.8)
    # w_a = exp(gamma * (0.8 / 0.5) / K) = exp(0.32), w_other = 1
    w_a = math.exp(0.4 * (0.8 / 0.5) / 2)
    p_a = 0.6 * w_a / (w_a + 1) + 0.4 / 2
    p = exp3.probabilities()
    assert p[a] == pytest.approx(p_a) and p[1 - a] == pytest.approx(1 - p_a)
    b = exp3.select()
    exp3.update(b, 1.0)
    p_b = p[b]
    w = [w_a if i == a else 1.0 for i in range(2)]
    w[b] *= math.exp(0.4 * (1.0 / p_b) / 2)
    expected = [0.6 * wi / sum(w) + 0.2 for wi in w]
    assert exp3.probabilities() == pytest.approx(expected)


def test_exp3_samples_from_its_probabilities():
    exp3 = EXP3(3, gamma=0.4, seed=0)
    exp3.log_weights = [0.0, 1.0, 2.0]
    p = exp3.probabilities()
    n = 3000
    freq = [0] * 3
    for _ in range(n):
        freq[exp3.select()] += 1
    for f, pi in zip(freq, p):
        assert abs(f / n - pi) < 4 * math.sqrt(pi * (1 - pi) / n)


# ---------------------------------------------------------------- Sequential Halving (MetaSD Alg. 5)
def test_sequential_halving_period_one_schedule_by_hand():
    sh = SequentialHalving(5, period=1)
    assert sh.n_phases == 3  # ceil(log2 5): 5 -> 3 -> 2 -> 1
    play(sh, [(0, 0.1), (1, 0.9), (2, 0.5), (3, 0.7), (4, 0.3)])
    assert sh.survivors == [1, 2, 3]  # best ceil(5/2) = 3 of this phase
    # ranking uses this phase's rewards only: arm 1 had 0.9 before, 0.2 now
    play(sh, [(1, 0.2), (2, 0.6), (3, 0.4)])
    assert sh.survivors == [2, 3]
    play(sh, [(2, 0.3), (3, 0.35)])
    assert sh.survivors == [3]
    play(sh, [(3, 0.0)] * 4)  # committed for the rest of the query
    assert sh.t == 5 + 3 + 2 + 4


def test_sequential_halving_budget_schedule():
    sh = SequentialHalving(4, budget=16)
    # n_0 = floor(16 / (4 * 2)) = 2 pulls of each of 4 arms; keep 2
    assert sh.pulls_per_arm() == 2
    play(sh, [(0, 0.1), (1, 0.2), (2, 0.9), (3, 0.4), (0, 0.1), (1, 0.2), (2, 0.9), (3, 0.4)])
    assert sh.survivors == [2, 3]
    # n_1 = floor(16 / (2 * 2)) = 4
    assert sh.pulls_per_arm() == 4
    play(sh, [(2, 0.5), (3, 0.6)] * 4)
    assert sh.survivors == [3]


def test_sequential_halving_breaks_ties_with_its_seed():
    survivors = set()
    for seed in range(20):
        sh = SequentialHalving(2, seed=seed)
        play(sh, [(0, 0.0), (1, 0.0)])  # BE rewards are often exactly 0
        survivors.add(sh.survivors[0])
        again = SequentialHalving(2, seed=seed)
        play(again, [(0, 0.0), (1, 0.0)])
        assert again.survivors == sh.survivors  # same seed, same choice
    assert survivors == {0, 1}


# ---------------------------------------------------------------- UCBSpec (BanditSpec Alg. 4, Eq. 6)
def cr(L, K, t, n, delta):
    """Eq. 6 written out: (L/2) sqrt( (1+n)/n^2 (1 + 2 ln(K t^2 (1+n)^(1/2) / delta)) )."""
    return (L / 2) * math.sqrt((1 + n) / n**2 * (1 + 2 * math.log(K * t**2 * (1 + n) ** 0.5 / delta)))


def test_ucbspec_radius_and_choices_by_hand():
    ucb = UCBSpec(2, max_len=4, delta=0.5)
    play(ucb, [(0, 3), (1, 2)])  # round-robin for the first K rounds
    # t = 2, n = 1 for both: cr = 2 sqrt(2 (1 + 2 ln(2 * 4 * sqrt 2 / 0.5)))
    r = 2 * math.sqrt(2 * (1 + 2 * math.log(2 * 4 * math.sqrt(2) / 0.5)))
    assert ucb.radius() == pytest.approx([r, r])
    assert ucb.radius()[0] == pytest.approx(cr(4, 2, 2, 1, 0.5))
    play(ucb, [(0, 1)])  # means 3 > 2, same radius
    assert ucb.means == pytest.approx([2.0, 2.0])
    # t = 3: arm 0 (n = 2) has the smaller radius, arm 1 (n = 1) the larger -> arm 1
    r0 = 2 * math.sqrt(3 / 4 * (1 + 2 * math.log(2 * 9 * math.sqrt(3) / 0.5)))
    r1 = 2 * math.sqrt(2 / 1 * (1 + 2 * math.log(2 * 9 * math.sqrt(2) / 0.5)))
    assert ucb.radius() == pytest.approx([r0, r1])
    assert ucb.index() == pytest.approx([2.0 + r0, 2.0 + r1])
    assert ucb.select() == 1


def test_ucbspec_uses_each_arms_own_count():
    # the released code uses the total count in the radius; the paper uses n_i
    ucb = UCBSpec(3, max_len=4, delta=0.1)
    for _ in range(12):
        arm = ucb.select()
        ucb.update(arm, 5 if arm == 0 else 1)
    assert len(set(ucb.counts)) > 1  # arms were pulled unequally, so n_i and the total differ
    assert ucb.radius() == pytest.approx([cr(4, 3, 12, n, 0.1) for n in ucb.counts])
    assert ucb.means == pytest.approx([5.0, 1.0, 1.0])


# ---------------------------------------------------------------- EXP3Spec (BanditSpec Alg. 5, Eq. 13-14)
def test_exp3spec_losses_and_probabilities_by_hand():
    L, K = 4, 2
    exp3 = EXP3Spec(K, max_len=L, seed=1)
    assert exp3.eta == pytest.approx(math.sqrt(math.log(2) / (1 * 2)))  # eta_1
    assert exp3.probabilities() == pytest.approx([0.5, 0.5])
    a = exp3.select()
    exp3.update(a, 5)  # Y = L + 1: Z = (L + 1 - 5) / (L p) = 0
    assert exp3.cum_loss == [0.0, 0.0]
    b = exp3.select()
    exp3.update(b, 1)  # Y = 1: Z = (5 - 1) / (4 * 0.5) = 2
    assert exp3.cum_loss[b] == pytest.approx(2.0) and exp3.cum_loss[1 - b] == 0.0
    eta3 = math.sqrt(math.log(2) / (3 * 2))
    p_b = math.exp(-eta3 * 2.0) / (math.exp(-eta3 * 2.0) + math.exp(0.0))
    p = exp3.probabilities()
    assert p[b] == pytest.approx(p_b) and p[1 - b] == pytest.approx(1 - p_b)
    c = exp3.select()
    exp3.update(c, 3)  # Z = (5 - 3) / (4 p_c), with p_c the probability it was drawn with
    expected = [0.0, 0.0]
    expected[b] += 2.0
    expected[c] += (5 - 3) / (4 * p[c])
    assert exp3.cum_loss == pytest.approx(expected)


def test_exp3spec_is_stable_with_huge_losses():
    exp3 = EXP3Spec(3, max_len=4)
    exp3.cum_loss = [1e9, 1e9 + 1e7, 5e8]
    p = exp3.probabilities()
    assert all(math.isfinite(x) for x in p) and sum(p) == pytest.approx(1.0)
    assert p[2] == pytest.approx(1.0)
    assert EXP3Spec(1, max_len=4).probabilities() == [1.0]  # ln 1 = 0: eta = 0


# ---------------------------------------------------------------- static baselines
def test_fixed_random_oracle():
    fixed = FixedArm(3, arm=2)
    play(fixed, [(2, 0.1)] * 3)
    rnd = UniformRandom(4, seed=7)
    picks = []
    for _ in range(400):
        picks.append(rnd.select())
        rnd.update(picks[-1], 0.5)
    assert set(picks) == {0, 1, 2, 3} and max(picks.count(i) for i in range(4)) < 140
    again = UniformRandom(4, seed=7)
    assert [again.select() for _ in range(20)] == picks[:20]
    oracle = OracleFixedArm(3)
    with pytest.raises(RuntimeError, match="tell"):
        oracle.select()
    oracle.tell(1)
    play(oracle, [(1, 0.9)])
    oracle.start_query()
    assert oracle.counts == [0, 0, 0] and oracle.select() == 1


def test_one_pass_oracle_tries_every_arm_once_then_the_told_arm():
    ceiling = OnePassOracle(3, best_arm=2)
    play(ceiling, [(0, 0.9), (1, 0.9), (2, 0.1), (2, 0.1), (2, 0.9)])  # rewards never move it
    ceiling.start_query()
    play(ceiling, [(0, 0.5)])


# ---------------------------------------------------------------- protocol and state
def test_start_query_resets_unless_persistent():
    for persistent in (False, True):
        ucb = MetaSDUCB(2, persistent=persistent)
        play(ucb, [(0, 0.2), (1, 0.9), (1, 0.9)])
        ucb.start_query()
        if persistent:
            assert ucb.counts == [1, 2] and ucb.select() == 1  # keeps exploiting across prompts
        else:
            assert ucb.counts == [0, 0] and ucb.t == 0 and ucb.select() == 0  # new round-robin pass


def test_reset_replays_the_same_random_stream():
    exp3 = EXP3Spec(4, max_len=4, seed=11)
    first = []
    for y in [1, 5, 3, 2, 4, 1]:
        first.append(exp3.select())
        exp3.update(first[-1], y)
    exp3.reset()
    second = []
    for y in [1, 5, 3, 2, 4, 1]:
        second.append(exp3.select())
        exp3.update(second[-1], y)
    assert first == second


def test_update_must_follow_select_of_that_arm():
    ucb = MetaSDUCB(2)
    with pytest.raises(RuntimeError):
        ucb.update(0, 0.5)
    assert ucb.select() == 0
    with pytest.raises(RuntimeError):
        ucb.update(1, 0.5)


# ---------------------------------------------------------------- simulated bandits (fixed seeds)
ALPHAS = [0.45, 0.6, 0.75]  # per-token acceptance of three drafters; arm 2 is best


def bd_reward(rng, alpha, n_max=5):
    """Mean over N_max positions of a per-position alignment 1 - TV with mean alpha."""
    return sum(rng.betavariate(20 * alpha, 20 * (1 - alpha)) for _ in range(n_max)) / n_max


def accepted(rng, alpha, max_len):
    """Accepted drafts of one round: leading successes of per-token acceptance alpha."""
    k = 0
    while k < max_len and rng.random() < alpha:
        k += 1
    return k


def best_arm_fraction(selector, reward, rounds, seed=100):
    rng = random.Random(seed)
    best = 0
    for _ in range(rounds):
        arm = selector.select()
        selector.update(arm, reward(rng, ALPHAS[arm]))
        best += arm == 2
    return best / rounds


def test_bandits_find_the_best_drafter():
    assert best_arm_fraction(MetaSDUCB(3), bd_reward, 300) > 0.95
    assert best_arm_fraction(UCBSpec(3, max_len=4), lambda r, a: accepted(r, a, 4) + 1, 1500) > 0.8
    assert best_arm_fraction(EXP3Spec(3, max_len=4), lambda r, a: accepted(r, a, 4) + 1, 1500) > 0.75
    assert best_arm_fraction(UniformRandom(3), bd_reward, 1500) == pytest.approx(1 / 3, abs=0.05)


def test_exp3_keeps_gamma_exploration():
    exp3 = EXP3(3, gamma=0.4)
    assert best_arm_fraction(exp3, bd_reward, 1500) > 0.6
    # weights concentrate on the best arm, but every arm keeps gamma / K
    assert exp3.probabilities()[2] == pytest.approx(1 - 0.4 + 0.4 / 3, abs=0.02)
    assert min(exp3.probabilities()) >= 0.4 / 3


def test_sequential_halving_keeps_the_best_drafter():
    survivors = []
    for seed in range(10):
        sh = SequentialHalving(3, seed=seed)
        best_arm_fraction(sh, bd_reward, 6, seed=200 + seed)
        survivors.append(sh.survivors)
    assert survivors.count([2]) >= 8


# ---------------------------------------------------------------- factory and bad input
def test_make_selector_builds_every_selector():
    params = {"ucbspec": {"max_len": 4}, "exp3spec": {"max_len": 4}, "oracle": {"best_arm": 0}, "one-pass-oracle": {"best_arm": 0}}
    for name, cls in SELECTORS.items():
        sel = make_selector(name, 2, seed=1, **params.get(name, {}))
        assert type(sel) is cls and sel.n_arms == 2
        arm = sel.select()
        sel.update(arm, 1.0)
        assert sel.t == 1
    assert make_selector("ucb", 3, beta=0.2).beta == 0.2


@pytest.mark.parametrize(
    "name, n_arms, params, match",
    [
        ("ucbb", 2, {}, "did you mean 'ucb'"),
        ("exp3spc", 2, {}, "did you mean 'exp3spec'"),
        ("ucb", 0, {}, "n_arms"),
        ("ucb", 2, {"beta": 0.0}, "beta"),
        ("ucb", 2, {"beta": -1.0}, "beta"),
        ("ucbspec", 2, {"max_len": 4, "delta": 0.0}, "delta"),
        ("ucbspec", 2, {"max_len": 4, "delta": 1.0}, "delta"),
        ("ucbspec", 2, {}, "needs max_len"),
        ("exp3spec", 2, {"max_len": 0}, "max_len"),
        ("exp3", 2, {"gamma": 0.0}, "gamma"),
        ("exp3", 2, {"gamma": 1.5}, "gamma"),
        ("sh", 2, {"period": 0}, "period"),
        ("fixed", 2, {"arm": 2}, "arm"),
        ("ucb", 2, {"delta": 0.5}, "does not take delta"),
    ],
)
def test_bad_input_raises_one_line_input_error(name, n_arms, params, match):
    with pytest.raises(InputError, match=match) as err:
        make_selector(name, n_arms, **params)
    assert "\n" not in str(err.value)


def test_rewards_out_of_range_are_rejected():
    ucb = MetaSDUCB(2)
    ucb.select()
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        ucb.update(0, 1.5)
    spec = UCBSpec(2, max_len=4)
    spec.select()
    with pytest.raises(InputError, match=r"\[1, L \+ 1 = 5\]"):
        spec.update(0, 0)  # Y counts the bonus token, so it is never 0
    exp3 = EXP3(2)
    exp3.select()
    with pytest.raises(InputError, match="finite"):
        exp3.update(exp3._pending, float("nan"))
