"""Speculative cascades sample the cascade's pi, not the target's p (Faster Cascades via Speculative
Decoding, Algorithms 2, 4-6, Table 1).

With table stubs whose next-token distributions are known, the first two tokens the decoder emits are
enumerated exactly under each rule and compared by a chi-square test; the same samples must reject the
lossless distribution (so the test sees the difference) and a 2% error (so the sample size has power).
"""
import itertools
import math

import pytest
import torch

from specdraft.decoding.cascades import (
    NEUTRAL_ALPHA,
    RULES,
    SPECULATIVE_RULES,
    CascadeMethod,
    bild_discrepancy,
    cascade_method,
    emitted_distribution,
    lossy_target,
    target_distribution,
    token_target,
    token_v3_rejects,
    verification_distribution,
)
from specdraft.core.errors import InputError
from specdraft.decoding.rounds.sampling import SamplingConfig, probs, sample
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.policies.stopping import FixedK
from specdraft.decoding.rounds.verify import verify
from tests.decoding.conftest import chi2_pvalue

V, N_TOKENS, N_SAMPLES = 3, 2, 4_000
PROMPT = [1, 2]
SAMPLING = SamplingConfig(temperature=1.0)
# alphas inside the paper's ranges that make each rule defer in some contexts and not in others
ALPHA = {"chow": 0.35, "diff": 0.0, "opt": 0.05, "token_v1": 0.05, "token_v2": 0.1, "token_v3": 0.3,
         "lossy": 0.5, "bild": 1.05, "token_chow": 0.35, "seq_chow": 0.6}


def rand_dists(n: int, seed: int, scale: float = 2.0) -> torch.Tensor:
    return (torch.randn(n, 7, generator=torch.Generator().manual_seed(seed)) * scale).softmax(-1)


@pytest.fixture(scope="module")
def tables():
    gen = torch.Generator().manual_seed(3)
    p_table = torch.randn(V, V, V, generator=gen) * 1.5
    q_table = p_table + torch.randn(V, V, V, generator=gen) * 1.2
    return p_table, q_table


@pytest.fixture(scope="module")
def stubs(table_lm, tables):
    p_table, q_table = tables
    hidden = torch.zeros(V, V, 4)
    return table_lm(p_table, hidden), table_lm(q_table, hidden)


def step_dists(tables, ctx):
    p_table, q_table = tables
    return probs(q_table[ctx[-2], ctx[-1]], SAMPLING).double(), probs(p_table[ctx[-2], ctx[-1]], SAMPLING).double()


def exact_two_tokens(tables, per_step) -> torch.Tensor:
    """P(x1, x2) when each position emits per_step(q, p) given the context: (V * V,)."""
    out = torch.zeros(V**N_TOKENS, dtype=torch.float64)
    for cell, seq in enumerate(itertools.product(range(V), repeat=N_TOKENS)):
        ctx, prob = list(PROMPT), 1.0
        for x in seq:
            q, p = step_dists(tables, ctx)
            prob *= float(per_step(q, p)[x])
            ctx.append(x)
        out[cell] = prob
    return out


def exact_seq_cascade(tables, alpha: float) -> torch.Tensor:
    """SeqCascade [Chow] with joint confidence: keep the drafter's whole response x when q(x) >= 1 - alpha."""
    q_seq = exact_two_tokens(tables, lambda q, p: q)
    p_seq = exact_two_tokens(tables, lambda q, p: p)
    keep = q_seq >= 1 - alpha
    return torch.where(keep, q_seq, 0.0) + q_seq[~keep].sum() * p_seq


def sample_counts(run, n: int = N_SAMPLES) -> torch.Tensor:
    gen = torch.Generator().manual_seed(42)
    counts = torch.zeros(V**N_TOKENS)
    for _ in range(n):
        x1, x2 = run(gen)[:2]
        counts[x1 * V + x2] += 1
    return counts


def assert_follows(counts, exact, lossless):
    n = counts.sum()
    assert chi2_pvalue(counts, exact) > 1e-3
    assert (counts / n - exact).abs().max() < 0.03
    assert chi2_pvalue(counts, lossless) < 1e-3  # the cascade is visibly not the target
    wrong = exact.clone()  # power: a 2% error is rejected by the same samples
    kept = (exact > 0.01).nonzero().flatten()
    hi, lo = kept[exact[kept].argmax()], kept[exact[kept].argmin()]
    wrong[hi] -= 0.02
    wrong[lo] += 0.02
    assert chi2_pvalue(counts, wrong) < 1e-3


# the decoder runs take ~8 s per rule on 2 busy cores: two in the default suite (the paper's Token rule
# and the unnormalised lossy pi), the rest with -m slow; the fast verify-level test below covers every rule
DEFAULT_RULES = ("token_v3", "lossy")


@pytest.mark.parametrize("rule", [r if r in DEFAULT_RULES else pytest.param(r, marks=pytest.mark.slow)
                                  for r in SPECULATIVE_RULES])
def test_speculative_cascade_emits_pi_not_p(stubs, tables, rule):
    target, drafter = stubs
    alpha = ALPHA[rule]

    def per_step(q, p):
        return emitted_distribution(q, target_distribution(rule, q, p, alpha))

    exact = exact_two_tokens(tables, per_step)
    lossless = exact_two_tokens(tables, lambda q, p: p)
    assert 0.5 * (exact - lossless).abs().sum() > 0.04  # the rule changes the output distribution
    # the rule both defers and keeps q somewhere, so both branches are exercised
    ctxs = [PROMPT] + [[2, x] for x in range(V)]
    same = [torch.allclose(target_distribution(rule, *step_dists(tables, c), alpha), step_dists(tables, c)[1])
            for c in ctxs]
    assert not all(same)
    if rule in ("chow", "diff", "opt", "bild"):
        assert any(same)
    spec = DrafterSpeculator(drafter, FixedK(2))
    pi = verification_distribution(rule, alpha)
    # 3 new tokens: the first round drafts 2, so x1 and x2 are both drafted positions (the bonus row,
    # which keeps p, only ever emits x3)
    counts = sample_counts(lambda gen: generate_speculative(target, spec, PROMPT, 3, SAMPLING, generator=gen,
                                                            verification_distribution=pi).tokens)
    assert_follows(counts, exact, lossless)


@pytest.mark.parametrize("rule", SPECULATIVE_RULES)
def test_one_verification_step_emits_pi(rule):
    """Algorithm 4 at one drafted position, every rule: the emitted token follows emitted(q, pi) (= pi
    for the normalised cascade targets), not p."""
    q = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
    p = torch.tensor([0.10, 0.45, 0.05, 0.25, 0.05, 0.10])  # TV(p, q) = 0.38, max q < max p
    # alphas at which each rule keeps (part of) q here
    alpha = {"chow": 0.8, "diff": 0.2, "opt": 0.5, "token_v1": 0.2, "bild": 2.1}.get(rule, ALPHA[rule])
    pi = target_distribution(rule, q, p, alpha)
    exact = emitted_distribution(q, pi).double()
    if rule != "lossy":
        assert torch.allclose(exact, pi.double(), atol=1e-6)
    assert 0.5 * (exact - p.double()).abs().sum() > 0.05
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(6)
    for _ in range(N_SAMPLES):
        y = sample(q, gen)
        result = verify(torch.stack([pi, p]), q[None], y.view(1), gen)
        counts[y if result.n_accepted else result.token] += 1
    assert_follows(counts, exact, p.double())


def test_token_cascade_samples_chow_mixture(stubs, tables):
    target, drafter = stubs
    alpha = ALPHA["token_chow"]
    method = cascade_method("token_chow", alpha)
    exact = exact_two_tokens(tables, lambda q, p: target_distribution("chow", q, p, alpha))
    lossless = exact_two_tokens(tables, lambda q, p: p)
    deferrals = n = 0

    def run(gen):
        nonlocal deferrals, n
        res = method.generate(target, drafter, PROMPT, 2, SAMPLING, generator=gen)
        deferrals += res.metrics.n_target
        n += 1
        assert res.metrics.n_draft == 2  # the small model runs for every token
        return res.tokens

    counts = sample_counts(run)
    assert_follows(counts, exact, lossless)
    assert 0 < deferrals < 2 * n  # it defers on some tokens only


def test_seq_cascade_keeps_or_replaces_whole_responses(stubs, tables):
    target, drafter = stubs
    alpha = ALPHA["seq_chow"]
    method = cascade_method("seq_chow", alpha)
    exact = exact_seq_cascade(tables, alpha)
    lossless = exact_two_tokens(tables, lambda q, p: p)
    counts = sample_counts(lambda gen: method.generate(target, drafter, PROMPT, 2, SAMPLING, generator=gen).tokens)
    assert_follows(counts, exact, lossless)


@pytest.mark.parametrize("rule", RULES)
def test_neutral_alpha_is_lossless_speculative_sampling(stubs, rule):
    """pi == p exactly on random distributions, and the decoder's tokens equal the lossless run's."""
    q, p = rand_dists(200, 0), rand_dists(200, 1)
    q[0], p[0] = p[1], p[1]  # q == p
    q[1] = torch.tensor([0.6, 0.4, 0, 0, 0, 0, 0])  # max q - max p == TV: OPT's edge case
    p[1] = torch.tensor([0.5, 0.5, 0, 0, 0, 0, 0])
    base = "chow" if rule in ("token_chow", "seq_chow") else rule
    assert torch.equal(target_distribution(base, q, p, NEUTRAL_ALPHA[rule]), p)
    target, drafter = stubs
    method = CascadeMethod(rule, NEUTRAL_ALPHA[rule])
    for seed in range(5):
        got = method.generate(target, drafter, PROMPT, 12, SAMPLING, k=3, generator=torch.Generator().manual_seed(seed))
        if method.speculative:
            want = generate_speculative(target, DrafterSpeculator(drafter, FixedK(3)), PROMPT, 12, SAMPLING,
                                        generator=torch.Generator().manual_seed(seed))
            assert got.tokens == want.tokens
            assert got.metrics.n_target == want.metrics.n_target
        else:  # every token (or the whole response) deferred: the target's own sampling, the same counts
            assert got.metrics.n_target == 12


def test_rules_match_the_paper_on_hand_computed_cases():
    q = torch.tensor([0.5, 0.3, 0.2])
    p = torch.tensor([0.2, 0.7, 0.1])  # TV = 0.4
    # Chow: max q = 0.5 < 1 - alpha  <=> alpha < 0.5
    assert torch.equal(target_distribution("chow", q, p, 0.4), p)
    assert torch.equal(target_distribution("chow", q, p, 0.6), q)
    # Diff: 0.5 < 0.7 - alpha <=> alpha < 0.2; OPT: 0.5 < 0.7 - 0.4 alpha <=> alpha < 0.5
    assert torch.equal(target_distribution("diff", q, p, 0.3), q)
    assert torch.equal(target_distribution("opt", q, p, 0.3), p)
    assert torch.equal(target_distribution("opt", q, p, 0.6), q)
    # V3 at alpha = 0.5: Top = {p >= 0.35} = {1}; pi = q * 1(Top) + p * q(not Top)
    pi = target_distribution("token_v3", q, p, 0.5)
    assert torch.allclose(pi, torch.tensor([0.0, 0.3, 0.0]) + p * 0.7)
    assert torch.allclose(pi.sum(), torch.tensor(1.0))
    # V1: reject v when q(v) < 0.7 - alpha; alpha = 0.25: rejects {1: 0.3, 2: 0.2}; V2: p(v) < 0.45: {0, 2}
    assert torch.allclose(target_distribution("token_v1", q, p, 0.25), torch.tensor([0.5, 0.0, 0.0]) + p * 0.5)
    assert torch.allclose(target_distribution("token_v2", q, p, 0.25), torch.tensor([0.0, 0.3, 0.0]) + p * 0.7)
    # lossy (beta = 1): accepts x w.p. min(1, p / ((1 - alpha) q)); residual norm((p - q)_+)
    pi = lossy_target(q, p, 0.5)
    assert torch.allclose(torch.minimum(pi / q, torch.ones(3)), torch.minimum(p / (0.5 * q), torch.ones(3)))
    emitted = emitted_distribution(q, pi)
    accept = torch.minimum(p / (0.5 * q), torch.ones(3))
    resid = (p - q).clamp_min(0) / (p - q).clamp_min(0).sum()
    assert torch.allclose(emitted, q * accept + (1 - (q * accept).sum()) * resid)
    # BiLD*: D = -sum q log p
    d = float(bild_discrepancy(q, p))
    assert math.isclose(d, -(0.5 * math.log(0.2) + 0.3 * math.log(0.7) + 0.2 * math.log(0.1)), rel_tol=1e-6)
    assert torch.equal(target_distribution("bild", q, p, d - 0.01), p)
    assert torch.equal(target_distribution("bild", q, p, d + 0.01), q)
    # emitted_distribution of a normalised pi is pi itself
    assert torch.allclose(emitted_distribution(q, target_distribution("token_v3", q, p, 0.5)),
                          target_distribution("token_v3", q, p, 0.5))


def test_token_target_is_a_distribution_on_random_inputs():
    q, p = rand_dists(100, 5), rand_dists(100, 6)
    for alpha in (0.0, 0.2, 0.7):
        pi = token_target(q, p, token_v3_rejects(q, p, alpha))
        assert torch.allclose(pi.sum(-1), torch.ones(100), atol=1e-6) and (pi >= 0).all()


def test_bonus_row_keeps_p_and_k0_is_plain_p():
    q, p = rand_dists(2, 7), rand_dists(3, 8)
    pi = verification_distribution("token_v3", 0.4)(p, q)
    assert pi.shape == (3, 7) and torch.equal(pi[2], p[2])
    assert torch.equal(pi[:2], target_distribution("token_v3", q, p[:2], 0.4))
    assert torch.equal(verification_distribution("opt", 0.4)(p[:1], q[:0]), p[:1])


def test_bad_input_is_refused_in_one_line(stubs):
    target, drafter = stubs
    with pytest.raises(InputError, match="unknown cascade rule"):
        cascade_method("nope", 0.1)
    with pytest.raises(InputError, match="0 <= alpha < 1"):
        cascade_method("lossy", 1.0)
    with pytest.raises(InputError, match="beta >= 1 - alpha"):
        cascade_method("lossy", 0.2, beta=0.5)
    with pytest.raises(InputError, match="temperature > 0"):
        cascade_method("opt", 0.1).generate(target, drafter, PROMPT, 4, SamplingConfig(temperature=0.0))
    with pytest.raises(InputError, match="sequential"):
        verification_distribution("seq_chow", 0.1)
    assert cascade_method("token", 0.1).rule == "token_v3"
