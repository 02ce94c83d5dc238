"""One verification step against hand computations (SpecDec++ App. C, Alg. 2)."""
import pytest
import torch

from specdraft.decoding.rounds.verify import residual, verify

P = torch.tensor([0.5, 0.3, 0.2])
Q = torch.tensor([0.2, 0.3, 0.5])


def test_residual_by_hand():
    # (p - q)_+ = [0.3, 0, 0] -> normalised [1, 0, 0]
    assert torch.allclose(residual(P, Q), torch.tensor([1.0, 0.0, 0.0]))
    p, q = torch.tensor([0.4, 0.4, 0.2]), torch.tensor([0.1, 0.3, 0.6])
    # (p - q)_+ = [0.3, 0.1, 0] / 0.4
    assert torch.allclose(residual(p, q), torch.tensor([0.75, 0.25, 0.0]))
    assert torch.equal(residual(P, P), P)  # empty positive part: fall back to p


def _accept_rate(p_row, q_row, y, n=4000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = torch.stack([p_row, p_row])  # (K+1, V) with K = 1
    hits = sum(verify(p, q_row[None], torch.tensor([y]), gen).n_accepted for _ in range(n))
    return hits / n


def test_acceptance_probability_is_min_one_p_over_q():
    assert _accept_rate(P, Q, 0) == 1.0  # p/q = 2.5
    assert _accept_rate(P, Q, 1) == 1.0  # p/q = 1, never rejected
    assert _accept_rate(P, Q, 2) == pytest.approx(0.4, abs=0.03)  # p/q = 0.2/0.5


def test_rejection_emits_residual_sample_and_acceptance_emits_bonus():
    gen = torch.Generator().manual_seed(1)
    bonus = torch.tensor([0.0, 0.0, 1.0])
    p = torch.stack([P, bonus])
    for _ in range(200):
        out = verify(p, Q[None], torch.tensor([2]), gen)
        if out.n_accepted == 0:
            assert out.token == 0 and not out.bonus  # residual [1, 0, 0]
        else:
            assert out.token == 2 and out.bonus and out.n_emitted == 2


def test_first_rejection_stops_the_scan():
    # draft tokens: accept surely, reject surely (p = 0), would-accept; n must be 1
    p = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    q = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    out = verify(p, q, torch.tensor([0, 2, 2]), torch.Generator().manual_seed(0))
    assert out.n_accepted == 1 and out.token == 1 and out.n_drafted == 3


def test_greedy_is_exact_prefix_match_with_target_argmax():
    p = torch.tensor([[0.1, 0.9, 0.0], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]])
    q = torch.full((2, 3), 1 / 3)  # q does not matter under greedy
    assert verify(p, q, torch.tensor([1, 0]), greedy=True) == verify(p, q, torch.tensor([1, 0]), greedy=True)
    full = verify(p, q, torch.tensor([1, 0]), greedy=True)
    assert (full.n_accepted, full.token) == (2, 2)  # bonus = argmax p_3
    miss = verify(p, q, torch.tensor([1, 1]), greedy=True)
    assert (miss.n_accepted, miss.token) == (1, 0)  # correction = argmax p_2


def test_no_draft_is_a_plain_target_step():
    out = verify(torch.tensor([[0.0, 1.0, 0.0]]), torch.empty(0, 3), torch.empty(0, dtype=torch.long))
    assert (out.n_accepted, out.token, out.bonus) == (0, 1, True)


def test_one_step_output_follows_p():
    """Draft x ~ q then verify: the emitted first token is distributed as p (rejection sampling)."""
    gen = torch.Generator().manual_seed(2)
    n = 6000
    counts = torch.zeros(3)
    p = torch.stack([P, P])
    for _ in range(n):
        y = torch.multinomial(Q, 1, generator=gen)
        out = verify(p, Q[None], y, gen)
        counts[int(y) if out.n_accepted else out.token] += 1
    # standard error <= 0.0065: 4 sigma < 0.027; sampling from q instead of p would be off by 0.3
    assert torch.allclose(counts / n, P, atol=0.027)


def test_verification_distribution_is_an_argument():
    """A cascade / lossy target pi replaces p with no other change (Narasimhan et al., Faster Cascades via Speculative Decoding)."""
    pi = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    out = verify(pi, Q[None], torch.tensor([2]), torch.Generator().manual_seed(0))
    assert (out.n_accepted, out.token) == (1, 0)  # pi(2) = 1 >= q(2): accepted, bonus from pi_2
