"""Prompt lookup: proposes the continuation of the last n-gram's earlier occurrence, with point-mass q,
and stays lossless (greedy: token for token; sampling: exact distribution on a stub target)."""
import pytest
import torch

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.prompt_lookup import PromptLookupSpeculator, lookup
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_speculative

GREEDY = SamplingConfig(temperature=0.0)


def test_lookup_finds_the_most_recent_longest_match():
    ctx = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7]
    # last bigram (6, 7) occurred at 1 and 6; the most recent (6) is followed by 2, 3, 6, 7
    assert lookup(ctx, ngram=2, max_tokens=3) == [2, 3, 6]
    # a trigram (3, 6, 7) never occurred before: falls back to the bigram
    assert lookup(ctx, ngram=3, max_tokens=2) == [2, 3]
    assert lookup(ctx, ngram=3, max_tokens=2, min_ngram=3) == []
    assert lookup([1, 2, 3, 4], ngram=2, max_tokens=5) == []
    assert lookup([4], ngram=2, max_tokens=5) == []
    # the continuation may run into the final n-gram itself
    assert lookup([1, 2, 1, 2], ngram=2, max_tokens=4) == [1, 2]


def test_proposal_is_a_point_mass_and_stops_at_eos(make_llama):
    target = make_llama(0)
    spec = PromptLookupSpeculator(ngram=2, max_tokens=4)
    spec.start(target, eos={9})
    draft = spec.propose([3, 4, 5, 9, 8, 3, 4], 10, GREEDY, None)
    assert draft.tokens == [5, 9] and draft.n_forwards == 0
    assert draft.q.shape == (2, target.config.vocab_size)
    assert torch.equal(draft.q.argmax(-1), torch.tensor([5, 9])) and torch.all(draft.q.sum(-1) == 1)
    assert spec.propose([3, 4, 5, 9, 8, 3, 4], 1, GREEDY, None).tokens == [5]  # the loop's limit wins


def test_repeated_text_is_drafted_and_greedy_output_is_unchanged(make_llama):
    target = make_llama(0)
    prompt = [7, 8, 9, 10, 11, 12, 13, 14]
    ref = generate_autoregressive(target, prompt + prompt, 30, GREEDY).tokens
    out = generate_speculative(target, PromptLookupSpeculator(ngram=3, max_tokens=5), prompt + prompt, 30, GREEDY)
    assert out.tokens == ref
    assert sum(out.metrics.drafted) > 0 and out.metrics.n_draft == 0


def test_sampling_is_lossless_on_a_stub_target(table_lm):
    # first-order target over 4 tokens: the next token depends on the current one only
    V = 4
    gen = torch.Generator().manual_seed(0)
    first = torch.randn(V, V, generator=gen) * 1.5  # logits[cur]
    table = first[None].expand(V, V, V).clone()
    target = table_lm(table, torch.zeros(V, V, 2))
    spec = PromptLookupSpeculator(ngram=1, max_tokens=3)
    sampling = SamplingConfig(temperature=1.0)
    n_runs, n_new = 1500, 4
    counts = torch.zeros(V)
    prompt = [0, 1, 2, 1]
    rng = torch.Generator().manual_seed(1)
    for _ in range(n_runs):
        out = generate_speculative(target, spec, prompt, n_new, sampling, generator=rng)
        counts[out.tokens[-1]] += 1
    # exact distribution of the 4th new token: the Markov chain from token 1, 4 steps
    P = torch.softmax(first, -1)
    expected = torch.linalg.matrix_power(P, n_new)[1]
    assert torch.allclose(counts / n_runs, expected, atol=0.04)


def test_bad_input():
    with pytest.raises(InputError, match="ngram"):
        PromptLookupSpeculator(ngram=0)
    with pytest.raises(InputError, match="max_tokens"):
        PromptLookupSpeculator(max_tokens=0)
    with pytest.raises(InputError, match="min_ngram"):
        PromptLookupSpeculator(ngram=2, min_ngram=3)
