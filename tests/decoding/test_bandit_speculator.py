"""Multi-drafter speculation: lossless under any selector, bandit bookkeeping, switching costs, gamma
arms (gamma = 0 included) and the bad-input errors."""
import pytest
import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.multi_drafter import (
    Arm,
    MultiDrafterSpeculator,
    NoDraftSpeculator,
    gamma_arms,
)
from specdraft.decoding.speculators.prompt_lookup import PromptLookupSpeculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.bandits.selectors import make_selector
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.policies.stopping import FixedK

GREEDY = SamplingConfig(temperature=0.0)
VOCAB = 96


@pytest.fixture(scope="module")
def models(make_llama):
    from tests.decoding.conftest import noisy_copy

    target = make_llama(0)
    return {"target": target, "good": noisy_copy(target, 0.05, seed=1), "bad": make_llama(7)}


def prompts(n=3):
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, VOCAB, (length,), generator=gen).tolist() for length in (4, 9, 2)[:n]]


def drafter_arms(models, k=4):
    return [
        Arm("good", DrafterSpeculator(models["good"], FixedK(k))),
        Arm("bad", DrafterSpeculator(models["bad"], FixedK(k))),
        Arm("lookup", PromptLookupSpeculator(ngram=2, max_tokens=k)),
    ]


def selector_for(name, n_arms, reward):
    params = {"ucbspec": {"max_len": 4}, "exp3spec": {"max_len": 4}, "fixed": {"arm": 1}}.get(name, {})
    return make_selector(name, n_arms, seed=3, **params)


@pytest.mark.parametrize(
    "name,reward", [("ucb", "bd"), ("ucb", "bd-argmax"), ("ucb", "be"), ("exp3", "bd"), ("sh", "be"), ("ucbspec", "accepted"),
                    ("exp3spec", "accepted"), ("random", "bd"), ("fixed", "bd")]
)
def test_greedy_output_equals_autoregressive_and_counts_add_up(models, name, reward):
    target = models["target"]
    arms = drafter_arms(models)
    spec = MultiDrafterSpeculator(arms, selector_for(name, len(arms), reward), reward=reward, n_max=4)
    for prompt in prompts():
        ref = generate_autoregressive(target, prompt, 30, GREEDY).tokens
        out = generate_speculative(target, spec, prompt, 30, GREEDY)
        assert out.tokens == ref
        m = out.metrics
        # every round is a bandit round except one with no room to draft, which can only be the last
        h = spec.history
        assert len(h) == m.n_rounds or (len(h) == m.n_rounds - 1 and m.drafted[-1] == 0)
        assert [r["drafted"] for r in h] == m.drafted[: len(h)]
        assert [r["accepted"] for r in h] == m.accepted[: len(h)]
        assert all(r["drafted"] <= 4 for r in h)  # n_max caps every arm
        assert sum(spec.selector.counts) == spec.selector.t == len(h)
        assert spec.counts() == spec.selector.counts


def test_sampling_runs_and_rewards_are_in_range(models):
    target = models["target"]
    arms = drafter_arms(models)
    spec = MultiDrafterSpeculator(arms, make_selector("ucb", 3, seed=0), reward="bd", n_max=4)
    gen = torch.Generator().manual_seed(0)
    out = generate_speculative(target, spec, prompts(1)[0], 25, SamplingConfig(temperature=1.0), generator=gen)
    assert out.metrics.n_generated == 25
    assert all(0.0 <= h["reward"] <= 1.0 for h in spec.history)


def test_ucb_with_bd_prefers_the_good_drafter(models):
    target = models["target"]
    arms = [Arm("bad", DrafterSpeculator(models["bad"], FixedK(4))), Arm("self", DrafterSpeculator(target, FixedK(4)))]
    spec = MultiDrafterSpeculator(arms, make_selector("ucb", 2), reward="bd", n_max=4)
    generate_speculative(target, spec, prompts(1)[0], 60, GREEDY)
    chosen = [h["arm"] for h in spec.history]
    assert chosen.count(1) >= 0.8 * len(chosen)
    assert chosen[-3:] == [1, 1, 1]
    assert spec.selector.means[1] == pytest.approx(1.0)  # the target agrees with itself everywhere


def test_greedy_bd_reads_the_models_own_distributions(models, monkeypatch):
    """Under greedy decoding p and q are one-hots; the BD reward is 1 - TV of the softmax distributions
    behind them (MetaSD Assumption 2), so it is dense rather than a count of argmax agreements."""
    import specdraft.decoding.speculators.multi_drafter as multi

    seen = []
    real = multi.block_divergence_reward

    def spy(p, q, *args):
        seen.append((p, q))
        return real(p, q, *args)

    monkeypatch.setattr(multi, "block_divergence_reward", spy)
    target = models["target"]
    arms = [Arm("good", DrafterSpeculator(models["good"], FixedK(4)))]
    spec = MultiDrafterSpeculator(arms, make_selector("fixed", 1, arm=0), reward="bd", n_max=4)
    out = generate_speculative(target, spec, prompts(1)[0], 30, GREEDY)
    assert out.tokens == generate_autoregressive(target, prompts(1)[0], 30, GREEDY).tokens  # still lossless
    assert seen and all(0.0 < h["reward"] < 1.0 for h in spec.history)  # never exactly 0 or 1: dense
    for p, q in seen:  # full-support softmax rows, not one-hots
        assert (p > 0).all() and (q > 0).all()
        assert torch.allclose(p.sum(-1), torch.ones(len(p))) and torch.allclose(q.sum(-1), torch.ones(len(q)))


def test_greedy_bd_argmax_counts_argmax_agreements(models, monkeypatch):
    """reward="bd-argmax" keeps greedy verification's one-hots: the reward is the share of drafted
    positions where the drafter's and the target's argmax agree (also after the first rejection)."""
    import specdraft.decoding.speculators.multi_drafter as multi

    seen = []
    real = multi.block_divergence_reward
    monkeypatch.setattr(multi, "block_divergence_reward", lambda p, q, *a: seen.append((p, q)) or real(p, q, *a))
    target = models["target"]
    arms = [Arm("bad", DrafterSpeculator(models["bad"], FixedK(4)))]
    spec = MultiDrafterSpeculator(arms, make_selector("fixed", 1, arm=0), reward="bd-argmax", n_max=4)
    out = generate_speculative(target, spec, prompts(1)[0], 30, GREEDY)
    assert out.tokens == generate_autoregressive(target, prompts(1)[0], 30, GREEDY).tokens
    assert len(seen) == len(spec.history)
    for (p, q), h in zip(seen, spec.history):
        assert ((p == 0) | (p == 1)).all() and ((q == 0) | (q == 1)).all()  # one-hots
        agree = (p.argmax(-1) == q.argmax(-1)).float().mean().item()
        assert h["reward"] == pytest.approx(agree)
        assert agree >= h["accepted"] / h["drafted"]  # accepted positions all agree; later ones may too


def test_switching_counts_catch_up_forwards(models):
    target = models["target"]
    arms = drafter_arms(models)[:2]
    prompt, n = prompts(1)[0], 20
    # alternate arms every round: every round after the first switches drafter
    spec = MultiDrafterSpeculator(arms, make_selector("random", 2, seed=1), reward="bd", n_max=4)
    out = generate_speculative(target, spec, prompt, n, GREEDY)
    arms_used = [h["arm"] for h in spec.history]
    switches = sum(a != b for a, b in zip(arms_used, arms_used[1:]))
    assert switches >= 2
    assert 1 <= spec.switch_forwards <= switches  # a switch back after one round may have nothing to prefill
    assert spec.switch_seconds > 0
    assert out.tokens == generate_autoregressive(target, prompt, n, GREEDY).tokens

    # the same drafter every round: no switch cost at all
    fixed = MultiDrafterSpeculator(arms, make_selector("fixed", 2, arm=0), reward="bd", n_max=4)
    generate_speculative(target, fixed, prompt, n, GREEDY)
    assert fixed.switch_forwards == 0 and fixed.switch_seconds == 0.0


def test_switch_catch_ups_ride_on_the_first_forward(models):
    target = models["target"]
    prompt = prompts(1)[0]
    a = MultiDrafterSpeculator(drafter_arms(models)[:2], make_selector("random", 2, seed=1), "bd", n_max=4)
    out = generate_speculative(target, a, prompt, 20, GREEDY)
    assert a.switch_forwards >= 1
    # the catch-up is fed with the last committed token in the forward that yields q_1: a round of k
    # candidates costs k forwards, switch or not, and Lemma 3.1 holds exactly
    m = out.metrics
    assert m.n_draft == sum(h["drafted"] for h in a.history)
    assert m.n_draft + m.n_target == m.n_generated + m.n_discarded


def test_gamma_arms_share_one_cache_and_gamma_zero_is_plain_decoding(models):
    target, drafter = models["target"], models["good"]
    prompt = prompts(1)[0]
    ref = generate_autoregressive(target, prompt, 30, GREEDY).tokens
    arms = gamma_arms(drafter, [0, 1, 2, 4])
    assert isinstance(arms[0].speculator, NoDraftSpeculator) and arms[0].drafter_key is None
    spec = MultiDrafterSpeculator(arms, make_selector("ucbspec", 4, max_len=4), reward="accepted", n_max=4)
    out = generate_speculative(target, spec, prompt, 30, GREEDY)
    assert out.tokens == ref
    assert {h["arm"] for h in spec.history} == {0, 1, 2, 3}  # the round-robin pass tried them all
    zero = [h for h in spec.history if h["arm"] == 0]
    assert all(h["drafted"] == 0 and h["reward"] == 1.0 for h in zero)
    # drafter arms hand the cache over instead of re-prefilling: only a round after gamma=0 catches up,
    # and then on at most one unseen token besides the last one
    after_zero = sum(
        1 for a, b in zip(spec.history, spec.history[1:]) if a["arm"] == 0 and b["arm"] != 0
    )
    assert spec.switch_forwards <= after_zero

    # gamma = 0 alone is autoregressive decoding: one target call per token, no drafting
    alone = MultiDrafterSpeculator([Arm("gamma=0", NoDraftSpeculator())], make_selector("fixed", 1), "be", n_max=4)
    out = generate_speculative(target, alone, prompt, 12, GREEDY)
    assert out.tokens == ref[:12] and out.metrics.n_target == 12 and out.metrics.n_draft == 0


def test_bad_input(models, make_llama):
    target = models["target"]
    with pytest.raises(InputError, match="empty"):
        MultiDrafterSpeculator([], make_selector("ucb", 1))
    arms = drafter_arms(models)
    with pytest.raises(InputError, match="unknown reward"):
        MultiDrafterSpeculator(arms, make_selector("ucb", 3), reward="speed")
    with pytest.raises(InputError, match="3 arms"):
        MultiDrafterSpeculator(arms, make_selector("ucb", 2))
    with pytest.raises(InputError, match="accepted"):
        MultiDrafterSpeculator(arms, make_selector("ucbspec", 3, max_len=4), reward="bd", n_max=4)
    with pytest.raises(InputError, match="max_len"):
        MultiDrafterSpeculator(arms, make_selector("ucbspec", 3, max_len=3), reward="accepted", n_max=4)
    with pytest.raises(InputError, match="gamma"):
        gamma_arms(models["good"], [1, -1])
    other_vocab = make_llama(3, vocab=64)
    bad = arms + [Arm("small", DrafterSpeculator(other_vocab, FixedK(2)))]
    with pytest.raises(InputError, match="needs cost_ratio.*good, bad, small"):  # no default c for drafter arms
        MultiDrafterSpeculator(bad, make_selector("ucb", 4))
    spec = MultiDrafterSpeculator(bad, make_selector("ucb", 4), cost_ratio=0.2)
    with pytest.raises(InputError, match="'small'.*vocabulary size 64"):
        generate_speculative(target, spec, [1, 2, 3], 5, GREEDY)
    mixed = [Arm("a", DrafterSpeculator(models["good"], FixedK(1)), "d"), Arm("b", DrafterSpeculator(models["bad"], FixedK(2)), "d")]
    with pytest.raises(InputError, match="different drafter models"):
        generate_speculative(target, MultiDrafterSpeculator(mixed, make_selector("ucb", 2), cost_ratio=0.2), [1, 2], 5, GREEDY)
