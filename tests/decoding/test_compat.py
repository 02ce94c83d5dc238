"""Compatibility checks and bad input: one-line InputError naming the problem."""
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.compat import check_head, check_pair
from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.core.errors import InputError
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_with_drafter
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.policies.stopping import FixedK, SpecDecPP


def word_tokenizer(words, eos="</s>"):
    vocab = {w: i for i, w in enumerate([eos, "<unk>", *words])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, unk_token="<unk>")


def test_fingerprint_is_stable_across_save_and_load(tmp_path):
    tok = word_tokenizer(["a", "b", "c"])
    tok.save_pretrained(tmp_path)
    again = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(tok)
    assert len(tokenizer_fingerprint(tok)) == 64


def test_fingerprint_changes_with_ids_or_special_tokens():
    base = tokenizer_fingerprint(word_tokenizer(["a", "b", "c"]))
    assert tokenizer_fingerprint(word_tokenizer(["a", "c", "b"])) != base  # same strings, other ids
    assert tokenizer_fingerprint(word_tokenizer(["a", "b", "c", "d"])) != base
    assert tokenizer_fingerprint(word_tokenizer(["a", "b", "c"], eos="<eos>")) != base


def test_pair_checks(make_llama):
    target, other_vocab = make_llama(0, vocab=64, layers=1), make_llama(1, vocab=80, layers=1)
    with pytest.raises(InputError, match="vocabulary size 80 differs"):
        check_pair(target, other_vocab)
    same = make_llama(2, vocab=64, layers=1)
    check_pair(target, same, word_tokenizer(["a"]), word_tokenizer(["a"]))
    with pytest.raises(InputError, match="tokenizer"):
        check_pair(target, same, word_tokenizer(["a"]), word_tokenizer(["b"]))
    with pytest.raises(InputError, match="vocabulary size"):  # caught when decoding starts
        generate_with_drafter(target, other_vocab, [1, 2], 4)


def test_head_hidden_size_must_match_the_drafter(make_llama):
    drafter = make_llama(0, vocab=64, layers=1)  # hidden 32
    check_head(torch.nn.Linear(32, 1), drafter)
    with pytest.raises(InputError, match="hidden size 16"):
        DrafterSpeculator(drafter, SpecDecPP(torch.nn.Linear(16, 1)))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: FixedK(0), "K must be"),
        (lambda: SpecDecPP(torch.nn.Linear(4, 1), threshold=0.0), r"h must be in \(0, 1\)"),
        (lambda: SpecDecPP(torch.nn.Linear(4, 1), threshold=1.0), r"h must be in \(0, 1\)"),
        (lambda: SpecDecPP(torch.nn.Linear(4, 1), k_max=0), "K_max"),
        (lambda: SamplingConfig(temperature=-0.5), "temperature"),
    ],
)
def test_bad_settings(make, match):
    with pytest.raises(InputError, match=match):
        make()


def test_bad_prompts(make_llama):
    model = make_llama(0, vocab=64, layers=1, context=16)
    with pytest.raises(InputError, match="prompt has 16 tokens but the model context is 16"):
        generate_autoregressive(model, list(range(16)), 1)
    with pytest.raises(InputError, match="lower max_new_tokens to at most 6"):
        generate_with_drafter(model, model, list(range(10)), 7)
    with pytest.raises(InputError, match="empty"):
        generate_autoregressive(model, [], 4)
    with pytest.raises(InputError, match="batch size 2"):
        generate_autoregressive(model, torch.zeros(2, 3, dtype=torch.long), 4)
    with pytest.raises(InputError, match="max_new_tokens"):
        generate_autoregressive(model, [1], 0)
