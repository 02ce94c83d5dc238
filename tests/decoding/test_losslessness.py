"""Speculative sampling is lossless: with stub models whose next-token distributions are known, the
first three generated tokens follow exactly the target's autoregressive distribution (same
temperature / top-k / top-p), for fixed K and for SpecDec++ stopping. SpecDec++ generates four tokens:
with three the first round is capped at two drafts before its head is ever read (Alg. 1 reads e_1 only
after y_2 is drafted); with four its stop after y_2 decides whether token 3 is a bonus or a draft.

Power: n = 5,000 samples; the chi-square test must also *reject* the same samples against the exact
distribution with 0.02 of mass moved between two cells (a 2% error), so the sample size is shown to
be enough inside the test itself."""

import pytest
import torch

from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_with_drafter
from specdraft.decoding.policies.stopping import FixedK, SpecDecPP
from tests.decoding.conftest import chi2_pvalue, exact_distribution, shifted

V, N_TOKENS, N_SAMPLES = 3, 3, 5_000
PROMPT = [1, 2]


@pytest.fixture(scope="module")
def stub_pair(table_lm):
    gen = torch.Generator().manual_seed(0)
    p_table = torch.randn(V, V, V, generator=gen) * 1.5
    q_table = p_table + torch.randn(V, V, V, generator=gen) * 1.0  # agrees often, not always
    hidden = torch.randn(V, V, 8, generator=gen)
    return table_lm(p_table, hidden), table_lm(q_table, hidden), p_table


def linear_head(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    head = torch.nn.Linear(8, 1)
    with torch.no_grad():
        head.bias.fill_(1.0)
    return head


@pytest.mark.parametrize(
    "sampling,make_stopping,n_tokens",
    [
        pytest.param(SamplingConfig(temperature=0.8, top_k=2), lambda: FixedK(2), 3, id="fixedK2-T0.8-topk2"),
        pytest.param(
            SamplingConfig(temperature=1.0, top_p=0.9), lambda: SpecDecPP(linear_head(0), 0.35), 4,
            id="specdecpp-topp0.9",
        ),
    ],
)
def test_first_tokens_follow_the_target_distribution(stub_pair, sampling, make_stopping, n_tokens):
    target, drafter, p_table = stub_pair
    exact = exact_distribution(p_table, sampling, PROMPT, N_TOKENS)
    gen = torch.Generator().manual_seed(42)
    counts = torch.zeros(V**N_TOKENS)
    full = rejected = 0
    first_round = set()
    stopping = make_stopping()
    for _ in range(N_SAMPLES):
        result = generate_with_drafter(target, drafter, PROMPT, n_tokens, sampling, stopping=stopping, generator=gen)
        x1, x2, x3 = result.tokens[:N_TOKENS]
        counts[(x1 * V + x2) * V + x3] += 1
        m = result.metrics
        full += sum(a == d > 0 for a, d in zip(m.accepted, m.drafted))
        rejected += sum(a < d for a, d in zip(m.accepted, m.drafted))
        first_round.add(m.drafted[0])
    assert full > 300 and rejected > 300  # bonus and residual paths both taken many times
    if isinstance(stopping, SpecDecPP):
        assert first_round == {2, 3}  # the head stops some rounds after y_2 and lets others reach y_3
    assert counts[exact == 0].sum() == 0  # filtered tokens (top-k / top-p) are never emitted
    assert chi2_pvalue(counts, exact) > 1e-3
    assert (counts / N_SAMPLES - exact).abs().max() < 0.02

    assert chi2_pvalue(counts, shifted(exact)) < 1e-3  # the same samples must reject a 2% error
