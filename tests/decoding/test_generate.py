"""`specdraft generate` from model directories: the speculative text equals the autoregressive text."""
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdraft.data.demo_tokenizer import train_bpe
from specdraft.decoding.generate import generate_text, load_pair
from specdraft.core.errors import InputError
from specdraft.pipelines.cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    tok = train_bpe(["the quick brown fox jumps over the lazy dog"] * 50 + ["hello world"] * 20, vocab_size=300)
    torch.manual_seed(0)  # the random weights must not depend on which tests ran before (early EOS)
    for name, layers in (("target", 2), ("drafter", 1)):
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        LlamaForCausalLM(cfg).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


def test_generate_matches_autoregressive(pair, capsys):
    tok, tgt, dft, head, _ = load_pair(target=str(pair / "target"), drafter=str(pair / "drafter"))
    spec, m = generate_text(tok, tgt, dft, "the quick", 16, k=3)
    ar, _ = generate_text(tok, tgt, dft, "the quick", 16, method="ar")
    assert spec == ar and m["N"] == 16
    assert main(["generate", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"),
                 "--prompt", "the quick", "--max-new-tokens", "8", "--k", "2"]) == 0
    text, metrics = capsys.readouterr().out.strip().rsplit("\n", 1)
    assert json.loads(metrics)["N"] == 8


def test_generate_refuses_mismatched_tokenizer(pair, tmp_path):
    other = train_bpe(["completely different text corpus"] * 30, vocab_size=300)
    d = tmp_path / "d"
    LlamaForCausalLM.from_pretrained(pair / "drafter").save_pretrained(d)
    other.save_pretrained(d)
    with pytest.raises(InputError, match="different tokenizer"):
        load_pair(target=str(pair / "target"), drafter=str(d))
    assert main(["generate", "--target", str(pair / "target"), "--drafter", str(d), "--prompt", "x"]) == 2


def test_generate_with_several_drafts(pair, capsys):
    """`--drafts K`: SpecTr's K-draft tree decoding; greedy, so the text equals the autoregressive text."""
    tok, tgt, dft, _, _ = load_pair(target=str(pair / "target"), drafter=str(pair / "drafter"))
    spec, m = generate_text(tok, tgt, dft, "the quick", 16, k=3, drafts=3)
    ar, _ = generate_text(tok, tgt, dft, "the quick", 16, method="ar")
    assert spec == ar and m["N"] == 16
    args = ["generate", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"), "--prompt", "the quick",
            "--max-new-tokens", "8", "--k", "2", "--temperature", "1.0"]
    assert main(args + ["--drafts", "4"]) == 0
    text, metrics = capsys.readouterr().out.strip().rsplit("\n", 1)
    assert json.loads(metrics)["N"] == 8
    assert main(args + ["--drafts", "0"]) == 2  # a one-line InputError
    assert "drafts" in capsys.readouterr().err


def test_drafts_default_comes_from_the_bundle():
    """No --drafts: the bundle's decoding.drafts; --drafts overrides it; without a bundle 1."""
    import argparse

    from specdraft.decoding.defaults import DecodingDefaults
    from specdraft.pipelines.generate import settings_from
    from specdraft.pipelines.generate_args import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    bundle = DecodingDefaults(drafts=4, cost_ratio=0.1)
    for argv, has_bundle, expected in (([], True, 4), ([], False, 1), (["--drafts", "2"], True, 2)):
        args = p.parse_args(["b", "--prompt", "x", *argv])
        assert settings_from(args, bundle, has_bundle).drafts == expected


def test_generate_formats_the_prompt_with_the_chat_template(pair, monkeypatch):
    """The prompt is one user turn through the target's chat template; --raw-prompt feeds the text as is
    and --system-prompt adds a system turn."""
    import specdraft.decoding.generate as g
    from specdraft.decoding.bundle.chat import format_prompt, user_turn

    tok, tgt, dft, _, _ = load_pair(target=str(pair / "target"), drafter=str(pair / "drafter"))
    seen = []
    real = g.generate_batch  # --method ar decodes through the batched decoder
    monkeypatch.setattr(g, "generate_batch", lambda model, prompts, *a, **k: seen.append(prompts[0]) or real(model, prompts, *a, **k))
    for argv, want in (([], format_prompt(tok, user_turn("the quick"))),
                       (["--raw-prompt"], tok("the quick")["input_ids"]),
                       (["--system-prompt", "be brief"],
                        format_prompt(tok, [{"role": "system", "content": "be brief"}, *user_turn("the quick")]))):
        assert main(["generate", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"), "--prompt",
                     "the quick", "--max-new-tokens", "2", "--method", "ar", *argv]) == 0
        assert list(seen[-1]) == want
    assert tok.convert_ids_to_tokens(seen[0][-1]) == "<|assistant|>" and seen[0] != seen[1]


def test_sliding_window_models_go_to_the_one_prompt_decoder():
    """The batched decoder's static cache is causal over the whole cache: a target or drafter with sliding-window
    layers, or a window shorter than the decode, is decoded one prompt at a time (`full_attention_decode`); a
    window that covers the decode stays batched."""
    from types import SimpleNamespace

    from specdraft.decoding.generate import Plan, full_attention_decode
    from specdraft.decoding.policies.stopping import FixedK

    def model(**config):
        return SimpleNamespace(config=SimpleNamespace(**config))

    prompts = [[1] * 30, [2] * 10]  # 30 + 20 new + K 4 + 2 = 56 slots, rounded to 64
    full, windowed = model(), model(sliding_window=24)
    assert full_attention_decode(full, Plan("target"), prompts, 20, "none")
    assert not full_attention_decode(windowed, Plan("target"), prompts, 20, "none")
    assert full_attention_decode(model(sliding_window=4096), Plan("target"), prompts, 20, "none")
    assert not full_attention_decode(full, Plan("drafter", windowed, lambda: FixedK(4)), prompts, 20, "none")
    assert not full_attention_decode(model(layer_types=["full_attention", "sliding_attention"]), Plan("target"),
                                     prompts, 20, "none")
