"""EAGLE-3 drafters (multi-layer feature fusion; here specdraft's eagle3-proj variant, whose hand-made mimic
agrees with a one-layer target; vLLM's layout is tests/decoding/test_eagle3_vllm_layout.py) decode losslessly: greedy chain and trees equal plain
greedy decoding, the decoder hands the drafter exactly the target's fused low / middle / high features
of every committed position, sampled chains emit the target's distribution (chi-square with a power
check), EAGLE-1 and EAGLE-3 arms share one bandit, and the checkpoint records the variant and layers."""
import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.speculators.arms import Arm
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.speculators.eagle import EagleSpeculator, StaticTree, TreeShape
from specdraft.decoding.speculators.eagle_model import EagleDrafter, eagle3_layers, fused_features, load_eagle, read_eagle_config, save_eagle
from specdraft.decoding.speculators.multi_drafter import MultiDrafterSpeculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.bandits.selectors import make_selector
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.policies.stopping import FixedK
from tests.decoding.eagle_fixtures import mimic_drafter, tiny_target
from tests.decoding.test_eagle import N_TOKENS, PROMPT, V, assert_samples_fit, exact_model_distribution, stoppings

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [[3, 5, 7, 11], [1], [40, 2, 2, 9, 60, 14, 8]]
LAYERS = (0, 0, 1)  # a one-layer target: the embeddings (twice) and the final state stand in for low / mid / high


@pytest.fixture(scope="module")
def pair():
    target = tiny_target("llama", 0)
    return target, mimic_drafter(target, 0.1, seed=1, variant="eagle3-proj", feature_layers=LAYERS)


TREES = [None, TreeShape(depth=4, top_k=3, nodes=10), StaticTree()]


@pytest.mark.parametrize("tree", TREES, ids=["chain", "tree-4x3-10", "static"])
def test_greedy_equals_autoregressive(pair, tree):
    target, drafter = pair
    accepted = 0
    for prompt in PROMPTS:
        reference = generate_autoregressive(target, prompt, 40, GREEDY).tokens
        for stopping in stoppings(target.config.hidden_size):  # fixed K and a SpecDec++ head on the EAGLE layer
            result = generate_speculative(target, EagleSpeculator(drafter, stopping, tree), prompt, 40, GREEDY)
            assert result.tokens == reference
            accepted += sum(result.metrics.accepted)
    assert accepted > 50  # the drafter's tokens were accepted, not only the target's corrections


@pytest.mark.parametrize("tree", TREES[:2], ids=["chain", "tree"])
def test_the_drafter_gets_the_targets_fused_features_of_every_committed_position(pair, tree):
    target, drafter = pair
    speculator = EagleSpeculator(drafter, FixedK(3), tree)
    assert speculator.target_feature_layers == LAYERS
    result = generate_speculative(target, speculator, PROMPTS[2], 30, GREEDY)
    context = PROMPTS[2] + result.tokens
    with torch.no_grad():
        out = target(input_ids=torch.tensor([context]), output_hidden_states=True)
    expected = fused_features(out.hidden_states, LAYERS)[0, : len(context) - 1]  # (n, 3d)
    got = speculator._feature_rows(0, speculator.n_features)
    assert got.shape == expected.shape == (len(context) - 1, 3 * target.config.hidden_size)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_eagle1_and_eagle3_arms_share_a_bandit(pair):
    target, drafter3 = pair
    drafter1 = mimic_drafter(target, 0.1, seed=2)
    arms = [Arm("eagle1", EagleSpeculator(drafter1, FixedK(3))), Arm("eagle3", EagleSpeculator(drafter3, FixedK(3))),
            Arm("eagle3-tree", EagleSpeculator(drafter3, FixedK(3), TreeShape(3, 2, 6)))]
    bandit = MultiDrafterSpeculator(arms, make_selector("ucb", len(arms)), reward="be", n_max=3)
    assert bandit.target_feature_layers == (-1, 0, 1)  # the union; each arm takes its own columns
    prompt = PROMPTS[2]
    result = generate_speculative(target, bandit, prompt, 40, GREEDY)
    assert result.tokens == generate_autoregressive(target, prompt, 40, GREEDY).tokens
    assert min(bandit.counts()) >= 1
    d = target.config.hidden_size
    for arm, width in zip(arms, (d, 3 * d, 3 * d)):
        assert arm.speculator.n_features == len(prompt) + len(result.tokens) - 1
        assert arm.speculator._feature_rows(0, 1).shape[-1] == width


@pytest.fixture(scope="module")
def small_pair():
    target = tiny_target("llama", 5, vocab=V, layers=2)
    return target, mimic_drafter(target, 0.3, seed=6, variant="eagle3-proj")


@pytest.mark.slow  # ~20 s on the shared CPU
def test_sampled_chain_emits_the_target_distribution(small_pair):
    target, drafter = small_pair
    assert drafter.feature_layers == eagle3_layers(2) == (1, 1, 2)
    sampling, n_samples, shift = SamplingConfig(temperature=1.0), 2_500, 0.05
    exact = exact_model_distribution(target, sampling, PROMPT, N_TOKENS)
    assert_samples_fit(target, EagleSpeculator(drafter, FixedK(3)), sampling, n_samples, exact, shift)


def test_checkpoint_records_variant_and_layers(pair, tmp_path):
    target, drafter = pair
    out = save_eagle(drafter, tmp_path / "eagle3")
    meta = read_eagle_config(out)
    assert meta["variant"] == "eagle3-proj" and meta["feature_layers"] == list(LAYERS)
    loaded = load_eagle(out, target=target)
    assert loaded.variant == "eagle3-proj" and loaded.feature_layers == LAYERS
    a = generate_speculative(target, EagleSpeculator(drafter, FixedK(3)), PROMPTS[0], 20, GREEDY)
    b = generate_speculative(target, EagleSpeculator(loaded, FixedK(3)), PROMPTS[0], 20, GREEDY)
    assert a.tokens == b.tokens and a.metrics.accepted == b.metrics.accepted
    old = read_eagle_config(save_eagle(mimic_drafter(target, 0.1, seed=1), tmp_path / "eagle1"))
    assert old["variant"] == "eagle1" and old["feature_layers"] == [-1]


def test_eagle3_layers_and_bad_input():
    assert eagle3_layers(32) == (2, 16, 29)  # EAGLE-3's choice for a 32-layer Llama
    assert eagle3_layers(1) == (1, 1, 1)
    cfg = tiny_target("llama", 0, layers=2).config
    with pytest.raises(InputError, match="variant"):
        EagleDrafter(cfg, variant="eagle2")
    with pytest.raises(InputError, match="3 hidden-state indices"):
        EagleDrafter(cfg, variant="eagle3-proj", feature_layers=[0, 1])
    with pytest.raises(InputError, match="3 hidden-state indices"):
        EagleDrafter(cfg, variant="eagle3-proj", feature_layers=[0, 1, 3])
    with pytest.raises(InputError, match="new_eagle_drafter"):
        EagleDrafter(cfg, variant="eagle3")
    with pytest.raises(InputError, match="for the eagle3 variants"):
        EagleDrafter(cfg, feature_layers=[0, 1, 2])
