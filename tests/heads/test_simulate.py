import math
import random

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.heads.simulate import (
    THRESHOLDS,
    best,
    greedy_oracle,
    simulate_fixed_k,
    simulate_specdecpp,
    specdecpp_round_lengths,
)


def test_all_accept_fixed_k_by_hand():
    # N = 10, K = 4: rounds at 0 (positions 0-3 + bonus 4) and 5 (5-8 + bonus 9): 2 target calls, 8 drafts
    (r,) = simulate_fixed_k([torch.ones(10)], cost_ratio=0.25, ks=[4])
    assert (r.n, r.n_target, r.n_draft, r.n_discarded) == (10, 2, 8, 0)
    assert r.cost == pytest.approx(0.25 * 8 + 2)
    assert r.verification_rate == pytest.approx(0.2) and r.discard_rate == 0


def test_all_reject_fixed_k_by_hand():
    # every round emits only the correction: one round per position, drafts capped at the end
    (r,) = simulate_fixed_k([torch.zeros(10)], cost_ratio=0.1, ks=[4])
    drafts = 4 * 7 + 3 + 2 + 1
    assert (r.n_target, r.n_draft, r.n_discarded) == (10, drafts, drafts)


def test_specdecpp_rule_with_constant_prediction():
    # sigma = 0.9, h = 0.5, Alg. 1: the decision after drafting k tokens has read k - 1 predictions, and
    # 1 - 0.9^k > 0.5 first at k = 7 (0.9^7 = 0.478): the round stops after drafting y_8
    k = specdecpp_round_lengths(torch.full((1, 30), 0.9), torch.tensor([30]), [0.5], k_max=20)
    assert k[0, 0, 0] == 8
    assert k[0, 0, 25] == 5  # capped at the end of the response
    # sigma = 0: the first prediction (on e_1) fires at once, after y_2 is drafted
    assert specdecpp_round_lengths(torch.zeros(1, 30), torch.tensor([30]), [0.1])[0, 0, 0] == 2
    # sigma = 1 never fires: K_max
    k1 = specdecpp_round_lengths(torch.ones(1, 30), torch.tensor([30]), [0.9], k_max=20)
    assert k1[0, 0, 0] == 20


def test_specdecpp_all_accept_by_hand():
    # perfect head on an all-accept sequence of 45 tokens: rounds of K_max = 20 + bonus: starts 0, 21, 42;
    # the last round's drafts reach the final token, so its bonus is dropped (counted discarded: Lemma 3.1)
    (r,) = simulate_specdecpp([torch.ones(45)], [torch.ones(45)], cost_ratio=0.2, thresholds=[0.5])
    assert (r.n_target, r.n_draft, r.n_discarded) == (3, 20 + 20 + 3, 1)
    assert r.n_draft + r.n_target == r.n + r.n_discarded
    # all-reject sequence, head predicting 0: two-token rounds (y_2 rides along), the first rejected ->
    # N rounds, the last one capped at the end
    (r0,) = simulate_specdecpp([torch.zeros(6)], [torch.zeros(6)], cost_ratio=0.2, thresholds=[0.5])
    assert (r0.n_target, r0.n_draft, r0.n_discarded) == (6, 11, 11)
    assert r0.cost == pytest.approx(0.2 * 11 + 6) and r0.speedup == pytest.approx(6 / 8.2)


def test_greedy_oracle_counts():
    agree = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1, 1, 1], dtype=torch.bool)  # S = {2, 4, 5}
    r = greedy_oracle([agree], cost_ratio=0.1)
    assert (r.n_target, r.n_discarded) == (3 + 1, 1)  # the agreeing tail's bonus is dropped after the end
    assert r.n_draft == 10 - 3
    # last token a disagreement: it is the final round's bonus, nothing left to verify
    r2 = greedy_oracle([torch.tensor([1, 1, 0], dtype=torch.bool)], cost_ratio=0.1)
    assert (r2.n_target, r2.n_draft, r2.n_discarded) == (1, 2, 0)


def _monte_carlo(accept, round_len, n_runs, seed):
    """Straightforward round-by-round simulation; round_len(j) -> K."""
    rng = random.Random(seed)
    tot = [0, 0, 0]
    for _ in range(n_runs):
        j, N = 0, len(accept)
        while j < N:
            K = round_len(j)
            m = 0
            while m < K and rng.random() < accept[j + m]:
                m += 1
            tot[0] += 1
            tot[1] += K
            tot[2] += K - m
            j = j + m + 1
    return [t / n_runs for t in tot]


def test_dp_matches_monte_carlo():
    g = torch.Generator().manual_seed(0)
    accept = torch.rand(40, generator=g) ** 0.3
    sigma = torch.rand(40, generator=g) ** 0.3
    h, k_max = 0.5, 6
    (r,) = simulate_specdecpp([accept], [sigma], cost_ratio=0.1, thresholds=[h], k_max=k_max)

    def round_len(j):  # the decoder's loop (Alg. 1): draft y_k, then multiply in sigma of y_(k-1)
        prod, k = 1.0, 1
        while True:
            if k >= 2:
                prod *= float(sigma[j + k - 2])
            if 1 - prod > h or k == k_max or j + k == 40:
                return k
            k += 1

    mc = _monte_carlo([float(a) for a in accept], round_len, n_runs=3000, seed=1)
    assert r.n_target == pytest.approx(mc[0], rel=0.02)
    assert r.n_draft == pytest.approx(mc[1], rel=0.02)
    assert r.n_discarded == pytest.approx(mc[2], rel=0.05)


def test_batched_equals_one_by_one_and_pools():
    g = torch.Generator().manual_seed(3)
    accept = [torch.rand(n, generator=g) for n in (5, 17, 9)]
    sigma = [torch.rand(n, generator=g) for n in (5, 17, 9)]
    together = simulate_specdecpp(accept, sigma, 0.2, thresholds=[0.3, 0.7])
    alone = [simulate_specdecpp([a], [s], 0.2, thresholds=[0.3, 0.7]) for a, s in zip(accept, sigma)]
    for i in range(2):
        assert together[i].n_target == pytest.approx(sum(a[i].n_target for a in alone))
        assert together[i].n_discarded == pytest.approx(sum(a[i].n_discarded for a in alone))
    assert together[0].n == 31


def test_good_head_beats_fixed_k_and_threshold_choice():
    # easy stretches of irregular length, each ended by a hard token: a head that knows where the hard
    # tokens are ends every round on one, which no fixed K can do
    gaps = [3, 11, 6, 14, 4, 9, 2, 13, 7, 10]
    accept = torch.tensor([p for g in gaps for p in [0.995] * g + [0.05]])
    results = simulate_specdecpp([accept], [accept], cost_ratio=0.05)
    chosen = best(results)
    fixed = best(simulate_fixed_k([accept], cost_ratio=0.05))
    oracle = greedy_oracle([accept > 0.5], cost_ratio=0.05)
    # every h in (0.05, 0.995) stops on the same tokens: a tie, and ties go to the smallest h
    assert THRESHOLDS[results.index(chosen)] == 0.1 and all(r.cost == chosen.cost for r in results)
    assert oracle.cost < chosen.cost < fixed.cost


def test_bad_inputs():
    with pytest.raises(InputError, match="outside"):
        simulate_fixed_k([torch.tensor([0.5, math.nan])], 0.1)
    with pytest.raises(InputError, match="length"):
        simulate_specdecpp([torch.ones(3)], [torch.ones(4)], 0.1)
    with pytest.raises(InputError, match="empty"):
        simulate_fixed_k([], 0.1)


def test_predictions_must_be_probabilities():
    with pytest.raises(InputError, match="sigmoid"):
        simulate_specdecpp([torch.ones(3)], [torch.tensor([0.5, 2.0, 0.1])], 0.1)


def test_oracle_closed_form_equals_the_dp():
    from specdraft.heads.simulate import expected_counts, oracle_round_lengths, pad

    g = torch.Generator().manual_seed(7)
    agree = [torch.rand(n, generator=g) < 0.8 for n in (12, 30, 1, 7)]
    p, lengths = pad([a.double() for a in agree])
    counts = expected_counts(p, lengths, oracle_round_lengths(p > 0.5, lengths))
    r = greedy_oracle(agree, cost_ratio=0.3)
    assert r.n_target == pytest.approx(float(counts["n_target"].sum()))
    assert r.n_draft == pytest.approx(float(counts["n_draft"].sum()))
    assert r.n_discarded == pytest.approx(float(counts["n_discarded"].sum()))
    assert r.n_discarded == sum(bool(a[-1]) for a in agree)  # only dropped bonuses, no rejected drafts
