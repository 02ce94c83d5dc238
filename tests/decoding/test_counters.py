"""Exact counter values for stub pairs that always accept (q == p) and never accept (disjoint
supports / opposite argmax), computed by hand from the round structure:
a round with budget `remaining` drafts k = min(K, remaining - 1) tokens and emits k + 1 (all accepted)
or 1 (none accepted); fixed K spends k draft forwards on it (one catch-up forward giving q_1, then
y_1..y_{k-1}); SpecDec++ (Alg. 1) reads the head on e_{k-1} after sampling y_k, so its rounds cost k too."""
import pytest
import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_with_drafter
from specdraft.decoding.policies.stopping import SpecDecPP

V, N = 5, 10
PROMPT = [1, 2, 3]
GREEDY, SAMPLED = SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0)


@pytest.fixture(scope="module")
def tables():
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(V, V, V, generator=gen)
    # disjoint supports: p on tokens {0, 1}, q on {2, 3, 4}; greedy argmaxes differ too
    p_disjoint = p.clone()
    p_disjoint[..., 2:] = float("-inf")
    q_disjoint = p.clone()
    q_disjoint[..., :2] = float("-inf")
    return p, p_disjoint, q_disjoint, torch.randn(V, V, 4, generator=gen)


def counters(m):
    return m.n_generated, m.n_target, m.n_draft, m.n_discarded, m.drafted, m.accepted


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_always_accept_fixed_k(table_lm, tables, sampling):
    p, _, _, hidden = tables
    model = table_lm(p, hidden)
    m = generate_with_drafter(model, model, PROMPT, N, sampling, k=3, generator=torch.Generator().manual_seed(0)).metrics
    # budgets 10, 6, 2 -> drafts 3, 3, 1 -> emits 4 + 4 + 2
    assert counters(m) == (10, 3, 3 + 3 + 1, 0, [3, 3, 1], [3, 3, 1])
    assert m.mat == pytest.approx(10 / 3)
    assert m.discard_rate == 0 and m.verification_rate == pytest.approx(0.3)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_never_accept_fixed_k(table_lm, tables, sampling):
    _, p, q, hidden = tables
    target, drafter = table_lm(p, hidden), table_lm(q, hidden)
    m = generate_with_drafter(target, drafter, PROMPT, N, sampling, k=3, generator=torch.Generator().manual_seed(0)).metrics
    drafted = [3] * 7 + [2, 1, 0]  # one token per round; the last rounds are capped by the budget
    assert counters(m) == (10, 10, sum(drafted), sum(drafted), drafted, [0] * 10)
    assert m.mat == 1.0 and m.discard_rate == pytest.approx(2.4)


def test_specdecpp_rounds_cost_one_forward_per_candidate(table_lm, tables):
    p, _, _, hidden = tables
    model = table_lm(p, hidden)
    stop_now = torch.nn.Linear(4, 1)
    with torch.no_grad():
        stop_now.weight.zero_()
        stop_now.bias.fill_(-10.0)  # predicted acceptance ~ 0: stop at the first prediction
    m = generate_with_drafter(model, model, PROMPT, N, GREEDY, stopping=SpecDecPP(stop_now, 0.5)).metrics
    # y_1 goes out unpredicted; the forward on y_1 gives q_2 and e_1; y_2 is sampled, then e_1 says stop:
    # rounds of two drafts + bonus at two forwards each (budgets 10, 7, 4), then the budget leaves room
    # for the target's token only
    assert counters(m) == (10, 4, 2 * 3, 0, [2, 2, 2, 0], [2, 2, 2, 0])
    assert m.n_draft + m.n_target == m.n_generated + m.n_discarded  # Lemma 3.1

    never_stop = torch.nn.Linear(4, 1)
    with torch.no_grad():
        never_stop.weight.zero_()
        never_stop.bias.fill_(10.0)
    m = generate_with_drafter(model, model, PROMPT, N, GREEDY, stopping=SpecDecPP(never_stop, 0.5, k_max=3)).metrics
    # capped at K_max = 3 like fixed K = 3, and e_3 is never needed: the same counts as fixed K
    assert counters(m) == (10, 3, 7, 0, [3, 3, 1], [3, 3, 1])


def test_autoregressive_counters(table_lm, tables):
    p, _, _, hidden = tables
    m = generate_autoregressive(table_lm(p, hidden), PROMPT, N, SAMPLED, generator=torch.Generator().manual_seed(0)).metrics
    assert (m.n_generated, m.n_target, m.n_draft, m.n_discarded, m.mat) == (10, 10, 0, 0, 1.0)
    assert m.time_total > 0 and m.tokens_per_s > 0
