"""EAGLE drafting is lossless: greedy chain and tree decoding equal plain greedy decoding token for token
(two families), sampled chain and tree decoding emit the target's distribution (chi-square with a power
check), a one-path tree is chain drafting, and the drafter's checkpoint round-trips without the target."""
import itertools

import pytest
import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.speculators.arms import Arm
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.speculators.eagle import EagleSpeculator, StaticTree, TreeShape, topk_candidates_select
from specdraft.decoding.speculators.eagle_model import EagleDrafter, load_eagle, save_eagle
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.multi_drafter import MultiDrafterSpeculator
from specdraft.decoding.rounds.sampling import SamplingConfig, probs
from specdraft.decoding.bandits.selectors import make_selector
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.policies.stopping import FixedK, SpecDecPP
from tests.decoding.eagle_fixtures import mimic_drafter, tiny_target
from tests.decoding.test_spectr import assert_fits_with_power, random_head

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [[3, 5, 7, 11], [1], [40, 2, 2, 9, 60, 14, 8]]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request):
    target = tiny_target(request.param, 0)
    return target, mimic_drafter(target, 0.1, seed=1)


def stoppings(hidden):
    return [FixedK(1), FixedK(4), SpecDecPP(random_head(hidden, 3), threshold=0.5, k_max=6)]


@pytest.mark.parametrize("tree", [None, TreeShape(depth=4, top_k=3, nodes=10), TreeShape(depth=5, top_k=2, nodes=4),
                                  StaticTree()], ids=["chain", "tree-4x3-10", "tree-5x2-4", "static"])
def test_greedy_equals_autoregressive(pair, tree):
    target, drafter = pair
    accepted = 0
    for prompt in PROMPTS:
        reference = generate_autoregressive(target, prompt, 40, GREEDY).tokens
        for stopping in stoppings(target.config.hidden_size):
            result = generate_speculative(target, EagleSpeculator(drafter, stopping, tree), prompt, 40, GREEDY)
            assert result.tokens == reference
            accepted += sum(result.metrics.accepted)
    assert accepted > 50  # the drafter's tokens were accepted, not only the target's corrections


def test_tree_beats_chain_and_one_path_tree_is_the_chain(pair):
    target, drafter = pair
    chain = generate_speculative(target, EagleSpeculator(drafter, FixedK(4)), PROMPTS[0], 40, GREEDY).metrics
    path = generate_speculative(target, EagleSpeculator(drafter, FixedK(4), TreeShape(4, 1, 4)), PROMPTS[0], 40,
                                GREEDY).metrics
    wide = generate_speculative(target, EagleSpeculator(drafter, FixedK(4), TreeShape(4, 4, 16)), PROMPTS[0], 40,
                                GREEDY).metrics
    assert (path.n_target, path.n_draft, path.accepted) == (chain.n_target, chain.n_draft, chain.accepted)
    assert wide.n_target < chain.n_target  # more tokens per target call (MAT) from the tree
    static = generate_speculative(target, EagleSpeculator(drafter, FixedK(4), StaticTree(((0,), (0, 0), (0, 0, 0),
                                  (0, 0, 0, 0)))), PROMPTS[0], 40, GREEDY).metrics
    assert (static.n_target, static.n_draft, static.accepted) == (chain.n_target, chain.n_draft, chain.accepted)


def test_first_round_prefills_then_drafts_through_the_eagle_layer(pair):
    target, drafter = pair
    result = generate_speculative(target, EagleSpeculator(drafter, FixedK(3)), PROMPTS[0], 10, GREEDY)
    m = result.metrics
    assert m.drafted[0] == 0 and m.accepted[0] == 0  # no features for the prompt before the target's prefill
    assert m.drafted[1] == 3 and max(m.drafted) == 3
    assert m.n_draft == sum(m.drafted)  # k candidates cost k drafter forwards (Lemma 3.1)


# ---------------------------------------------------------------- sampling: the target's distribution

V, N_TOKENS = 3, 4
PROMPT = [1, 2]


def exact_model_distribution(target, cfg, prompt, n_tokens) -> torch.Tensor:
    """P(x_1..x_n | prompt) of sampling from `target` under `cfg`, over all V**n sequences."""
    vocab = target.config.vocab_size
    memo = {}

    def next_probs(ctx):
        if ctx not in memo:
            with torch.no_grad():
                logits, _ = kv.forward(target, kv.new_cache(), list(ctx))
            memo[ctx] = probs(logits[-1], cfg).double()
        return memo[ctx]

    out = torch.zeros(vocab**n_tokens, dtype=torch.float64)
    for cell, seq in enumerate(itertools.product(range(vocab), repeat=n_tokens)):
        ctx, prob = tuple(prompt), 1.0
        for x in seq:
            prob *= float(next_probs(ctx)[x])
            ctx = ctx + (x,)
        out[cell] = prob
    return out


@pytest.fixture(scope="module")
def small_pair():
    target = tiny_target("llama", 5, vocab=V)
    return target, mimic_drafter(target, 0.3, seed=6)


SAMPLED = [
    # slow: the EAGLE-1 and EAGLE-3 chains at T = 1 are checked, row by row, in test_batch_losslessness.py's
    # eagle-fixedK2-T1 and eagle3-fixedK2-T1 (17 CPU s here for the same claim)
    pytest.param(None, SamplingConfig(temperature=1.0), 2_500, 0.05, id="chain-T1", marks=pytest.mark.slow),
    pytest.param(TreeShape(depth=3, top_k=2, nodes=4), SamplingConfig(temperature=1.0), 2_500, 0.05, id="tree-T1"),
    pytest.param(TreeShape(depth=3, top_k=2, nodes=5), SamplingConfig(temperature=0.8, top_k=2), 5_000, 0.03,
                 id="tree-T0.8-topk2", marks=pytest.mark.slow),
    pytest.param(StaticTree(((0,), (1,), (0, 0), (0, 1), (1, 0))), SamplingConfig(temperature=1.0), 5_000, 0.03,
                 id="static-T1", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("tree,sampling,n_samples,shift", SAMPLED)
def test_sampled_decoding_emits_the_target_distribution(small_pair, tree, sampling, n_samples, shift):
    target, drafter = small_pair
    exact = exact_model_distribution(target, sampling, PROMPT, N_TOKENS)
    counts = assert_samples_fit(target, EagleSpeculator(drafter, FixedK(3), tree), sampling, n_samples, exact, shift)
    assert (counts / n_samples - exact).abs().max() < shift


def assert_samples_fit(target, speculator, sampling, n_samples, exact, shift) -> torch.Tensor:
    """Decode PROMPT -> N_TOKENS tokens n_samples times; check that rounds ended both with a full accept
    (bonus token) and with a rejection (residual) often, and that the sequence counts fit `exact`
    (chi-square with a power check at `shift`). -> the counts over the V**N_TOKENS sequences."""
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(V**N_TOKENS)
    rejected = full = 0
    for _ in range(n_samples):
        result = generate_speculative(target, speculator, PROMPT, N_TOKENS, sampling, generator=gen)
        cell = 0
        for x in result.tokens:
            cell = cell * V + x
        counts[cell] += 1
        m = result.metrics
        full += sum(a == d > 0 for a, d in zip(m.accepted, m.drafted))
        rejected += sum(a < d for a, d in zip(m.accepted, m.drafted))
    assert min(full, rejected) > n_samples // 20  # both the bonus and the residual paths were taken often
    assert_fits_with_power(counts, exact, shift)
    return counts


def test_topk_candidate_rule_emits_p():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(4_000):
        _, token = topk_candidates_select(p, p, [1, 0], gen)
        counts[token] += 1
    assert_fits_with_power(counts, p.double(), 0.04)


# ---------------------------------------------------------------- bandit arm, checkpoint, bad input


def test_eagle_arms_in_a_bandit_stay_lossless_and_keep_their_features(pair):
    target, drafter = pair
    other = mimic_drafter(target, 0.4, seed=9)
    arms = [Arm("eagle-a", EagleSpeculator(drafter, FixedK(3))), Arm("eagle-b", EagleSpeculator(other, FixedK(3)),
            cost_ratio=0.1), Arm("eagle-tree", EagleSpeculator(drafter, FixedK(3), TreeShape(3, 2, 6)))]
    bandit = MultiDrafterSpeculator(arms, make_selector("ucb", len(arms)), reward="be", n_max=3)
    prompt = PROMPTS[2]
    reference = generate_autoregressive(target, prompt, 40, GREEDY).tokens
    result = generate_speculative(target, bandit, prompt, 40, GREEDY)
    assert result.tokens == reference
    assert min(bandit.counts()) >= 1 and bandit.switch_forwards >= 1
    for arm in arms:  # every arm holds the target's features of every committed position but the last
        assert arm.speculator.n_features == len(prompt) + len(result.tokens) - 1


def test_checkpoint_holds_only_the_eagle_layer_and_round_trips(pair, tmp_path):
    target, drafter = pair
    out = save_eagle(drafter, tmp_path / "eagle", extra={"domains": ["math"]})
    from safetensors.torch import load_file

    names = set(load_file(str(out / "model.safetensors")))
    assert names and all(n.startswith(("fc.", "body.")) for n in names)
    assert not any("lm_head" in n for n in names)
    assert load_file(str(out / "model.safetensors"))["body.embed_tokens.weight"].shape[0] == 1
    loaded = load_eagle(out, target=target)
    a = generate_speculative(target, EagleSpeculator(drafter, FixedK(3)), PROMPTS[0], 20, GREEDY)
    b = generate_speculative(target, EagleSpeculator(loaded, FixedK(3)), PROMPTS[0], 20, GREEDY)
    assert a.tokens == b.tokens and a.metrics.accepted == b.metrics.accepted


def test_bad_input_is_one_line(pair, tmp_path):
    target, drafter = pair
    with pytest.raises(InputError, match="no target attached"):
        EagleDrafter(target.config).lm_logits(torch.zeros(1, target.config.hidden_size))
    with pytest.raises(InputError, match="trained for target"):
        load_eagle(save_eagle(EagleDrafter(target.config, target_hash="a" * 64), tmp_path / "e"), target_hash="b" * 64)
    with pytest.raises(InputError, match="depth"):
        TreeShape(depth=0)
    with pytest.raises(InputError, match="is missing"):
        StaticTree(((0,), (1, 0)))
    wrong = tiny_target("llama", 0, vocab=50)
    with pytest.raises(InputError):
        EagleDrafter(target.config).attach_target(wrong)


def test_eagle_drafter_is_a_banditspec_arm_beside_model_free_ones(pair):
    from specdraft.decoding.speculators.arms import ArmResources, build_arms

    target, drafter = pair
    arms = build_arms(["lookup", "suffix", "eagle"], ArmResources({"eagle": drafter}), n_max=3)
    assert isinstance(arms[2].speculator, EagleSpeculator)
    bandit = MultiDrafterSpeculator(arms, make_selector("ucbspec", 3, max_len=3), reward="throughput", n_max=3,
                                    cost_ratio=0.2)
    prompt = PROMPTS[2]
    result = generate_speculative(target, bandit, prompt, 30, GREEDY)
    assert result.tokens == generate_autoregressive(target, prompt, 30, GREEDY).tokens
    assert bandit.counts()[2] >= 1
