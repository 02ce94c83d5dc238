import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.config import from_dict
from specdraft.pipelines.schema import RunConfig
from specdraft.pipelines.stage import run_stage


def test_tiny_target_round_trips_through_from_pretrained(tmp_path):
    cfg = from_dict(RunConfig, {
        "run": {"root": str(tmp_path)},
        "demo": {"domains": ["math", "chat"], "heldout_domains": ["spell"], "corpus_per_domain": 40,
                 "train_per_domain": 2, "dev_per_domain": 3, "test_per_domain": 2},
        "pretrain_target": {"tokenizer": {"vocab_size": 300}, "seq_len": 64,
                            "model": {"n_layers": 1, "hidden": 32, "n_heads": 2, "intermediate": 64,
                                      "max_positions": 128},
                            "train": {"max_steps": 3, "batch_size": 4, "wandb": {"mode": "disabled"}}},
    })
    run_stage(cfg, "prepare-data")
    out = run_stage(cfg, "pretrain-target")
    assert (out / "model.safetensors").is_file() and not list(out.glob("*.bin"))
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("Question: Ava has 3 apples.", return_tensors="pt")["input_ids"]
    assert ids[0, 0].item() == tok.bos_token_id == model.config.bos_token_id
    assert tok.decode(ids[0], skip_special_tokens=True) == "Question: Ava has 3 apples."
    assert model(ids).logits.shape == (1, ids.shape[1], len(tok))
    m = read_manifest(out, expect_stage="pretrain-target")
    ppl = m.metrics["dev_perplexity"]
    assert set(ppl) == {"math", "chat", "spell"}
    assert all(torch.isfinite(torch.tensor(r["target_ppl"])) and r["unigram_ppl"] > 1 for r in ppl.values())
    assert m.inputs["prepare-data"]["content_hash"] == read_manifest(tmp_path / "prompts").content_hash
    assert m.metrics["steps"] == 3
