import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from specdraft.core.errors import InputError
from specdraft.drafters.model import PRESETS, build_causal_lm, num_parameters, preset
from specdraft.decoding.bundle.loading import load_causal_lm
from specdraft.core.tokenizers import check_same_vocabulary, tokenizer_fingerprint


def test_metasd_preset_has_68m_parameters_with_the_llama_vocabulary():
    cfg = PRESETS["metasd-68m"]
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.intermediate) == (2, 768, 12, 3072)
    # count without allocating: embeddings + lm_head (untied) + 2 layers of attention and SwiGLU + norms
    v, h, i = 32000, cfg.hidden, cfg.intermediate
    n = 2 * v * h + cfg.n_layers * (4 * h * h + 3 * h * i + 2 * h) + h
    assert 67e6 < n < 69e6


def test_same_seed_same_weights_and_global_rng_untouched():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_causal_lm("demo-tiny", vocab_size=40, seed=7)
    after = torch.rand(1)
    b = build_causal_lm("demo-tiny", vocab_size=40, seed=7)
    c = build_causal_lm("demo-tiny", vocab_size=40, seed=8)
    assert before == after
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.config.vocab_size == 40 and num_parameters(a) > 0


def test_save_and_load_roundtrip_is_safetensors_only(tmp_path):
    m = build_causal_lm("demo-tiny", vocab_size=40, seed=0, eos_token_id=2, pad_token_id=0)
    m.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob("*.bin"))
    loaded = load_causal_lm(tmp_path, "float32")
    x = torch.tensor([[1, 2, 3]])
    assert torch.allclose(m(x).logits, loaded(x).logits)
    assert isinstance(AutoModelForCausalLM.from_pretrained(tmp_path), type(m))
    for f in tmp_path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(InputError, match="safetensors"):
        load_causal_lm(tmp_path)


def test_bad_configs_raise_input_error():
    with pytest.raises(InputError, match="divisible"):
        preset("demo-tiny", n_heads=3)
    with pytest.raises(InputError, match="unknown model preset"):
        preset("metasd-86m")


def _tokenizer(words):
    vocab = {w: i for i, w in enumerate(["<unk>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_vocabulary_and_tokenizer_mismatch_is_refused(tmp_path):
    check_same_vocabulary(40, 40)
    with pytest.raises(InputError, match="vocab size 41 != target vocab size 40"):
        check_same_vocabulary(41, 40)
    a, b = _tokenizer(["a", "b"]), _tokenizer(["a", "c"])
    check_same_vocabulary(3, 3, a, _tokenizer(["a", "b"]))
    with pytest.raises(InputError, match="tokenizer"):
        check_same_vocabulary(3, 3, a, b)
    # directories are hashed by their tokenizer.json
    a.save_pretrained(tmp_path / "a")
    b.save_pretrained(tmp_path / "b")
    assert tokenizer_fingerprint(tmp_path / "a") != tokenizer_fingerprint(tmp_path / "b")
    with pytest.raises(InputError, match="tokenizer"):
        check_same_vocabulary(3, 3, tmp_path / "a", tmp_path / "b")
