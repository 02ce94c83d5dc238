"""Any HF causal LM as target and drafter: tiny random models of several families, built offline from
their configs, through distill-data -> train-drafters -> acceptance-data -> train-heads -> export, then
greedy speculative decoding (the bundled decoder, and transformers' assisted generation) against the
target's own greedy output. The target and the drafter are of different families and share the
tokenizer (the tiny demo run's, with its chat template)."""

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, GemmaConfig, GPTNeoXConfig, LlamaConfig, MistralConfig,
                          Phi3Config, Qwen2Config)

from specdraft.data.chat import row_messages
from specdraft.data.prompts import load_prompt_sets
from specdraft.decoding.bundle.directory import load_bundle
from specdraft.decoding.generate import generate_text, load_pair
from specdraft.decoding.bundle.loading import load_tokenizer
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import FAST, tiny_config

# Grouped-query attention (4 heads, 2 KV heads) where the family has it; windows and tied embeddings as
# the families default them, except where a short window makes the sliding path matter in a short test.
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=256)
GQA = dict(num_key_value_heads=2)
FAMILIES = {
    "llama": lambda: LlamaConfig(**SHAPE, **GQA),
    "qwen2": lambda: Qwen2Config(**SHAPE, **GQA, tie_word_embeddings=True),
    "mistral": lambda: MistralConfig(**SHAPE, **GQA, sliding_window=24),
    "gemma": lambda: GemmaConfig(**SHAPE, **GQA, head_dim=8),
    "gemma2": lambda: Gemma2Config(**SHAPE, **GQA, head_dim=8, sliding_window=24, query_pre_attn_scalar=8),
    "phi3": lambda: Phi3Config(**SHAPE, **GQA, original_max_position_embeddings=256),
    "gpt_neox": lambda: GPTNeoXConfig(**SHAPE),
}


def save_tiny(family: str, tok, path, seed: int):
    config = FAMILIES[family]()
    config.vocab_size = len(tok)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # EOS logit 0 against ~280 random ones: the greedy comparisons run their full length
        model.get_output_embeddings().weight[tok.eos_token_id] = 0
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def run_pair(root, tmp_path, target_family: str, drafter_family: str):
    tok = load_tokenizer(root / "target")
    target = save_tiny(target_family, tok, tmp_path / f"target-{target_family}", seed=1)
    init = save_tiny(drafter_family, tok, tmp_path / f"drafter-{drafter_family}", seed=2)
    cfg = tiny_config(root, **FAST, target={"name_or_path": str(target)},
                      distill_data={"temperatures": [0.0], "max_new_tokens": 8},
                      train_drafters={"init_from": str(init), "drafters": [{"name": "math", "domains": ["math"]}],
                                      "general": {"enabled": False}})
    for stage in ("distill-data", "train-drafters", "acceptance-data", "train-heads", "export"):
        run_stage(cfg, stage)
    bundle = load_bundle(root / "bundle")
    assert bundle.meta["target"]["reference"] == str(target.resolve())
    tok, tgt, dft, head, hcfg = load_pair(str(root / "bundle"), drafter="math")
    assert type(tgt).__name__.lower().startswith(target_family.replace("_", ""))
    assert type(dft).__name__.lower().startswith(drafter_family.replace("_", ""))
    rows = list(load_prompt_sets(root / "prompts")["test"])[:2]
    for row in rows:
        prompt = row_messages(row)[-1]["content"]
        ar, m_ar = generate_text(tok, tgt, dft, prompt, 20, method="ar", chat=bundle.chat)
        assert m_ar["N"] == 20  # a random target never stops early here: every comparison covers 20 tokens
        for k in (1, 3):
            spec, m = generate_text(tok, tgt, dft, prompt, 20, k=k, chat=bundle.chat)
            assert spec == ar and m["N"] == m_ar["N"]
        spec, _ = generate_text(tok, tgt, dft, prompt, 20, head=head, threshold=hcfg["threshold"], chat=bundle.chat)
        assert spec == ar
        # the exported drafter as transformers' assistant_model: the target's own greedy tokens
        from specdraft.decoding.bundle.chat import format_prompt

        ids = torch.tensor([format_prompt(tok, row_messages(row), bundle.chat)])
        assert ids.shape[1] > 24  # longer than the sliding windows below: the windowed path is exercised
        kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id)
        plain = tgt.generate(ids, **kw)
        assert tgt.generate(ids, assistant_model=dft, **kw).tolist() == plain.tolist()
        # and the bundled decoder's own autoregressive text is transformers' (sliding windows included)
        assert tok.decode(plain[0, ids.shape[1]:], skip_special_tokens=True) == ar


@pytest.mark.parametrize("target_family, drafter_family", [("llama", "qwen2")])
def test_two_families_end_to_end(tiny_run, tmp_path, target_family, drafter_family):
    run_pair(tiny_run, tmp_path, target_family, drafter_family)


@pytest.mark.slow
@pytest.mark.parametrize("target_family, drafter_family", [
    ("qwen2", "mistral"), ("mistral", "gemma2"), ("gemma2", "phi3"), ("phi3", "gpt_neox"), ("gpt_neox", "gemma"),
    ("gemma", "llama"),
])
def test_family_matrix_end_to_end(tiny_run, tmp_path, target_family, drafter_family):
    run_pair(tiny_run, tmp_path, target_family, drafter_family)
