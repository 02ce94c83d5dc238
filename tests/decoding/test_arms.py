"""Bandit arms of any kind from config entries (decoding.speculators.arms) and the throughput reward with a cost per
arm (BanditSpec §6.2): model-free and drafter arms behind one bandit stay lossless under greedy decoding."""
import pytest

from specdraft.decoding.speculators.arms import ArmResources, build_arms
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.speculators.datastore import SuffixIndex
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.multi_drafter import MultiDrafterSpeculator, NoDraftSpeculator
from specdraft.decoding.speculators.prompt_lookup import PromptLookupSpeculator
from specdraft.decoding.speculators.rest import RestSpeculator
from specdraft.decoding.bandits.rewards import throughput_bounds, throughput_reward
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.bandits.selectors import make_selector
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.speculators.suffix import SuffixSpeculator

GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def resources(llama_pair):
    target, drafter = llama_pair
    outputs = [generate_autoregressive(target, [i, i + 1, i + 2], 16, GREEDY).tokens for i in range(0, 40, 5)]
    return target, ArmResources({"math": drafter}, SuffixIndex.build(outputs))


def test_entries_build_the_named_arms(resources):
    _, res = resources
    arms = build_arms(["lookup", "rest", "suffix", "none", "math",
                       {"kind": "drafter", "drafter": "math", "k": 2, "cost_ratio": 0.1},
                       {"kind": "suffix", "name": "suffix-a2", "spec_factor": 2.0, "cost_ratio": 0.01}], res, n_max=4)
    assert [a.name for a in arms] == ["lookup", "rest", "suffix", "none", "math", "math:k=2", "suffix-a2"]
    kinds = [PromptLookupSpeculator, RestSpeculator, SuffixSpeculator, NoDraftSpeculator, DrafterSpeculator,
             DrafterSpeculator, SuffixSpeculator]
    assert all(isinstance(a.speculator, k) for a, k in zip(arms, kinds))
    assert arms[4].speculator.stopping.max_tokens == 4 and arms[5].speculator.stopping.max_tokens == 2
    assert arms[4].drafter_key == arms[5].drafter_key == "drafter:math"  # one KV cache
    assert arms[6].speculator.spec_factor == 2.0 and arms[6].cost_ratio == 0.01 and arms[0].cost_ratio is None
    assert arms[1].speculator.max_tokens == 4
    assert build_arms(["drafter:math"], res, 4)[0].name == "math"


def test_bad_entries(resources):
    _, res = resources
    no_store = ArmResources(res.drafters, None)
    assert "rest" in no_store.unavailable() and res.unavailable() == {}
    for entry, match in [("resst", "neither a kind"), ({"kind": "tree"}, "kind"), (3, "string or a mapping"),
                         ({"kind": "drafter", "drafter": "code"}, "loaded: math"),
                         ({"kind": "drafter", "drafter": "math", "k": 9}, "1..n_max"),
                         ({"kind": "lookup", "window": 3}, "window"), ({"kind": "none", "k": 1}, "no parameters")]:
        with pytest.raises(InputError, match=match):
            build_arms([entry], res, 4)
    with pytest.raises(InputError, match="datastore"):
        build_arms(["rest"], no_store, 4)
    assert isinstance(build_arms(["suffix"], no_store, 4)[0].speculator, SuffixSpeculator)  # per request only
    with pytest.raises(InputError, match="empty"):
        build_arms([], res, 4)


def test_throughput_reward_charges_each_arm_its_cost(resources):
    _, res = resources
    arms = build_arms(["lookup", "math"], res, n_max=4)
    bandit = MultiDrafterSpeculator(arms, make_selector("ucbspec", 2, max_len=4), reward="throughput", n_max=4,
                                    cost_ratio=0.25)
    assert bandit.arm_cost(0) == 0.0 and bandit.arm_cost(1) == 0.25
    assert throughput_reward(4, 4, 0.25) == 2.5 and throughput_bounds(4, [0.0, 0.25]) == (0.5, 5.0)
    full_free = bandit.round_reward(None, None, 4, 4, arm=0)
    full_paid = bandit.round_reward(None, None, 4, 4, arm=1)
    none_paid = bandit.round_reward(None, None, 4, 0, arm=1)
    assert full_free == 5.0 and none_paid == 1.0  # the bounds map onto UCBSpec's [1, L + 1]
    assert full_free > full_paid == pytest.approx(1 + 4 * (2.5 - 0.5) / 4.5)
    # [0, 1] for MetaSD's selectors
    ucb = MultiDrafterSpeculator(arms, make_selector("ucb", 2), reward="throughput", n_max=4, cost_ratio=0.25)
    assert ucb.round_reward(None, None, 4, 4, arm=0) == 1.0 and ucb.round_reward(None, None, 4, 0, arm=1) == 0.0
    with pytest.raises(InputError, match="cost_ratio"):
        MultiDrafterSpeculator(arms, make_selector("ucb", 2), reward="throughput", cost_ratio=-1)


@pytest.mark.parametrize("selector", ["ucbspec", "exp3spec"])
def test_mixed_bandit_is_lossless_under_greedy(resources, selector):
    target, res = resources
    arms = build_arms(["lookup", "rest", "suffix", "math"], res, n_max=4)
    bandit = MultiDrafterSpeculator(arms, make_selector(selector, 4, max_len=4, seed=1), reward="throughput", n_max=4,
                                    cost_ratio=0.2)
    used = set()
    for prompt in ([0, 1, 2], [3, 9, 4, 3, 9, 4, 3], [50, 51, 52, 53]):
        want = generate_autoregressive(target, prompt, 20, GREEDY).tokens
        out = generate_speculative(target, bandit, prompt, 20, GREEDY)
        assert out.tokens == want
        used |= {h["arm"] for h in bandit.history}
    assert used == {0, 1, 2, 3}
