"""Model-free speculators (REST, suffix decoding) and their suffix-array datastore: retrieval agrees
with brute force, drafts are point masses, greedy output equals plain decoding token for token, and
sampled output follows the target's distribution (chi-square with a power check)."""
import itertools
import random

import numpy as np
import pytest
import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.speculators.datastore import (SEPARATOR, SMALL, Continuations, SuffixIndex, build_datastore, most_frequent_chain,
                                suffix_array)
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.prompt_lookup import PromptLookupSpeculator
from specdraft.decoding.speculators.rest import RestSpeculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.suffix import SuffixSpeculator
from tests.decoding.conftest import chi2_pvalue, exact_distribution, sample_sequences

GREEDY = SamplingConfig(temperature=0.0)


def brute_occurrences(seqs, pattern):
    return sorted((i, s) for i, seq in enumerate(seqs) for s in range(len(seq) - len(pattern) + 1)
                  if seq[s : s + len(pattern)] == pattern)


def test_match_range_agrees_with_brute_force():
    rng = random.Random(0)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 50))] for _ in range(30)]  # > SMALL: divsufsort
    index = SuffixIndex.build(seqs)
    offsets = np.cumsum([0] + [len(s) + 1 for s in seqs])
    for m in (1, 2, 3, 5):
        for pattern in itertools.islice(itertools.product(range(4), repeat=m), 40):
            pattern = list(pattern)
            lo, hi = index.match_range(pattern)
            got = sorted(int(p) for p in index.suffix_array[lo:hi])
            want = sorted(int(offsets[i] + s) for i, s in brute_occurrences(seqs, pattern))
            assert got == want, pattern


def test_both_suffix_sorts_agree():
    rng = np.random.default_rng(0)
    for n in (5, SMALL + 40):
        tokens = rng.integers(0, 3, n).astype(np.int32)
        tokens[rng.integers(0, n, n // 10)] = SEPARATOR
        slow = np.asarray(sorted(range(n), key=lambda i: tokens[i:].tolist()))
        assert np.array_equal(suffix_array(tokens), slow)


def test_longest_match_and_continuations():
    seqs = [[1, 2, 3, 4, 5], [9, 2, 3, 4, 6, 7], [3, 4, 5, 8]]
    index = SuffixIndex.build(seqs)
    # context ends in 2 3 4: occurs in seq 0 and 1 (m = 3); 7 2 3 4 does not occur
    cont = index.continuations([7, 2, 3, 4], max_match=16, depth=3)
    assert cont.match_length == 3 and cont.occurrences == 2
    rows = sorted(map(tuple, cont.windows.tolist()))
    assert rows == [(5, SEPARATOR, SEPARATOR), (6, 7, SEPARATOR)]  # cut at each sequence's end
    # max_match caps the match: only "4" is matched, three occurrences
    cont = index.continuations([7, 2, 3, 4], max_match=1, depth=1)
    assert cont.match_length == 1 and sorted(cont.windows[:, 0].tolist()) == [5, 5, 6]
    assert index.continuations([42], 16, 3).match_length == 0
    # end: occurrences must leave a token before `end` (the per-request index's own last suffix)
    own = SuffixIndex.build([[1, 2, 1, 2]])
    cont = own.continuations([1, 2, 1, 2], 16, 4, end=4)
    assert cont.match_length == 2 and cont.windows.tolist() == [[1, 2, SEPARATOR, SEPARATOR]]


def test_thinning_keeps_frequencies():
    seqs = [[0, 1]] * 300 + [[0, 2]] * 100
    cont = SuffixIndex.build(seqs).continuations([0], 4, 1, max_rows=40)
    assert cont.occurrences == 400 and cont.windows.shape == (40, 1)
    assert (cont.windows[:, 0] == 1).sum() == 30


def test_most_frequent_chain():
    w = np.array([[1, 2, 3], [1, 2, 4], [1, 5, SEPARATOR], [6, SEPARATOR, SEPARATOR]])
    tokens, path = most_frequent_chain(Continuations(2, 4, w), 3)
    assert tokens == [1, 2, 3] and path == pytest.approx([0.75, 0.5, 0.25])  # tie 3/4 -> smaller id
    assert most_frequent_chain(Continuations(2, 4, w), 3, min_prob=0.3)[0] == [1, 2]
    assert most_frequent_chain(Continuations(2, 4, w), 1)[0] == [1]
    assert most_frequent_chain(Continuations.none(3), 3) == ([], [])


def test_save_load_round_trip(tmp_path):
    built = build_datastore([[1, 2, 3], [2, 3, 4]], source="unit")
    info = built.index.save(tmp_path / "ds", built.meta)
    assert info["tokens"] == 6 and info["sequences"] == 2 and info["source"] == "unit"
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["datastore.json", "datastore.safetensors"]
    back = SuffixIndex.load(tmp_path / "ds")
    assert np.array_equal(back.tokens, built.index.tokens) and np.array_equal(back.suffix_array, built.index.suffix_array)
    with pytest.raises(InputError, match="no datastore"):
        SuffixIndex.load(tmp_path)
    with pytest.raises(InputError, match="at least one sequence"):
        SuffixIndex.build([])
    with pytest.raises(InputError, match=">= 0"):
        SuffixIndex.build([[1, -3]])


def test_rest_and_suffix_proposals(make_llama):
    target = make_llama(0)
    index = SuffixIndex.build([[10, 11, 12, 13, 14], [10, 11, 12, 13, 15], [20, 11, 12, 16]])
    rest = RestSpeculator(index, max_tokens=4)
    rest.start(target, eos={14})
    d = rest.propose([5, 10, 11, 12], 10, GREEDY, None)
    assert d.tokens == [13, 14] and d.n_forwards == 0  # most frequent path, cut after EOS 14
    assert torch.equal(d.q.argmax(-1), torch.tensor([13, 14])) and torch.all(d.q.sum(-1) == 1)
    assert rest.propose([5, 10, 11, 12], 1, GREEDY, None).tokens == [13]
    assert rest.propose([5, 7], 10, GREEDY, None).tokens == []

    suffix = SuffixSpeculator(index, max_tokens=8, spec_factor=1.0, min_prob=0.0)
    suffix.start(target, eos=set())
    # global match of length 3 (10 11 12): at most ceil(1.0 * 3) = 3 tokens
    d = suffix.propose([5, 10, 11, 12], 10, GREEDY, None)
    assert d.tokens == [13, 14, 10] or d.tokens[:2] == [13, 14]
    assert len(d.tokens) <= 3 and suffix.source == "global"
    # the request's own text matches longer (4 tokens): the per-request candidate wins
    ctx = [30, 10, 11, 12, 40, 41, 42, 30, 10, 11, 12]
    d = suffix.propose(ctx, 10, GREEDY, None)
    assert suffix.source == "request" and d.tokens == [40, 41, 42, 30]
    # no global structure: per request only
    alone = SuffixSpeculator(None, max_tokens=8)
    alone.start(target, eos=set())
    assert alone.propose([5, 10, 11, 12], 10, GREEDY, None).tokens == []
    assert alone.propose(ctx, 10, GREEDY, None).tokens == [40, 41, 42, 30]


def test_bad_input():
    index = SuffixIndex.build([[1, 2]])
    with pytest.raises(InputError, match="datastore"):
        RestSpeculator(None)
    with pytest.raises(InputError, match="max_match"):
        RestSpeculator(index, max_match=0)
    with pytest.raises(InputError, match="spec_factor"):
        SuffixSpeculator(index, spec_factor=0)
    with pytest.raises(InputError, match="min_prob"):
        SuffixSpeculator(index, min_prob=1.5)


@pytest.fixture(scope="module")
def greedy_world():
    """A tiny target and a datastore of its own greedy outputs (as distill-data writes them), so that
    retrieval drafts are often right and often wrong."""
    from tests.decoding.conftest import tiny_llama

    target = tiny_llama(0)
    rng = random.Random(3)
    prompts = [[rng.randrange(96) for _ in range(6)] for _ in range(8)]
    outputs = [generate_autoregressive(target, p, 24, GREEDY).tokens for p in prompts]
    return target, prompts, outputs


@pytest.mark.parametrize("kind", ["lookup", "rest", "suffix"])
def test_greedy_output_equals_plain_decoding(greedy_world, kind):
    target, prompts, outputs = greedy_world
    index = SuffixIndex.build(outputs[:5])  # prompts 5..7 are not in the datastore
    spec = {"lookup": lambda: PromptLookupSpeculator(ngram=3, max_tokens=5),
            "rest": lambda: RestSpeculator(index, max_tokens=5),
            "suffix": lambda: SuffixSpeculator(index, max_tokens=5, min_prob=0.0)}[kind]()
    accepted = rejected = 0
    for prompt, ref in zip(prompts, outputs):
        for p in (prompt, prompt + ref[:7]):  # also prompts that quote part of the answer
            want = generate_autoregressive(target, p, 24, GREEDY).tokens
            out = generate_speculative(target, spec, p, 24, GREEDY)
            assert out.tokens == want
            m = out.metrics
            accepted += sum(m.accepted)
            rejected += sum(a < d for a, d in zip(m.accepted, m.drafted))
            assert m.n_draft == 0
    assert accepted > 20 and rejected > 0  # both paths of verification were exercised


# ---- sampling: exact distribution on a stub target (the pattern of test_losslessness.py) -----------
V, N_TOKENS, N_SAMPLES = 3, 3, 3_000
SHIFT = 0.03  # the error the power check must detect
PROMPT = [1, 2, 0, 1]


@pytest.mark.parametrize("kind", ["rest", "suffix"])
def test_sampling_follows_the_target_distribution(table_lm, kind):
    gen = torch.Generator().manual_seed(0)
    p_table = torch.randn(V, V, V, generator=gen) * 1.5
    target = table_lm(p_table, torch.zeros(V, V, 2))
    rng = random.Random(5)
    # a datastore whose continuations are right sometimes: random text over the same 3 tokens
    index = SuffixIndex.build([[rng.randrange(V) for _ in range(12)] for _ in range(30)])
    spec = RestSpeculator(index, max_tokens=3) if kind == "rest" else SuffixSpeculator(index, max_tokens=3, min_prob=0.0)
    sampling = SamplingConfig(temperature=1.0)
    exact = exact_distribution(p_table, sampling, PROMPT, N_TOKENS)
    rng_t = torch.Generator().manual_seed(42)
    counts, paths = sample_sequences(
        lambda: generate_speculative(target, spec, PROMPT, N_TOKENS, sampling, generator=rng_t), N_SAMPLES, V, N_TOKENS)
    assert paths["full"] > 300 and paths["rejected"] > 300  # bonus and residual paths both taken many times
    assert chi2_pvalue(counts, exact) > 1e-3
    assert (counts / N_SAMPLES - exact).abs().max() < SHIFT
    # power: the same samples reject SHIFT of mass moved between the most and least likely cells
    wrong = exact.clone()
    kept = (exact > 0.03).nonzero().flatten()
    hi, lo = kept[exact[kept].argmax()], kept[exact[kept].argmin()]
    wrong[hi] -= SHIFT
    wrong[lo] += SHIFT
    assert chi2_pvalue(counts, wrong) < 1e-3
