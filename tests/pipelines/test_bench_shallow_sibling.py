"""benchmarks/sibling/bench_shallow_sibling.py's layer cut, on a tiny Qwen2 model (the pair's architecture)."""
import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_shallow_sibling")


def tiny(layers: int = 6) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def test_a_cut_keeps_the_first_layers_and_the_last_and_refuses_a_depth_the_model_lacks(bench):
    assert bench.kept_layers(24, 12) == list(range(11)) + [23]
    assert bench.kept_layers(24, 24) == list(range(24))
    assert bench.kept_layers(24, 1) == [23]
    for bad in (0, 25):
        with pytest.raises(SystemExit, match="give depths 1..24"):
            bench.kept_layers(24, bad)


def test_a_cut_model_is_the_kept_layers_and_decodes_with_a_cache_after_a_save_and_load(bench, tmp_path):
    model = tiny()
    kept = [model.model.layers[i] for i in (0, 1, 5)]
    ids = torch.tensor([[3, 9, 4, 17, 2]])
    cut = bench.cut(model, 3)
    assert list(cut.model.layers) == kept and cut.config.num_hidden_layers == 3
    assert [layer.self_attn.layer_idx for layer in cut.model.layers] == [0, 1, 2]  # the cache is indexed by them
    cut.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.num_hidden_layers == 3 and len(loaded.config.layer_types) == 3
    with torch.no_grad():
        whole = loaded(ids).logits
        first = loaded(ids[:, :3], use_cache=True)  # the last two positions fed through the cache
        rest = loaded(ids[:, 3:], past_key_values=first.past_key_values, use_cache=True).logits
        # a layer that kept its old index (5) would write to a cache slot the first pass never filled
        assert torch.allclose(rest, whole[:, 3:], atol=1e-5)
        assert torch.allclose(loaded(ids).logits, cut(ids).logits, atol=1e-6)


def test_the_section_has_a_row_per_drafter_with_its_cost_acceptance_and_training_time(bench):
    from specdraft.pipelines.schema import RunConfig

    args = bench.build_parser().parse_args(["RUN", "--depths", "24,12"])
    args.argv = ["RUN", "--depths", "24,12"]
    cell = (1.5, 1.25, 1.75)
    results = {name: {"mat": cell, "speedup": cell, "c": c, "parameters": 3e8}
               for name, c in (("cut-24", 0.31), ("cut-12", 0.2), ("distilled-12", 0.2))}
    text = bench.render(args, RunConfig(), "bfloat16", results, {24: None, 12: 512.3}, {"v": 1.05, "passes": 10},
                        64, 8, 24)
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(lines) == 2 + 3  # header, rule, then the sibling, the cut 12 and the distilled 12
    assert "24 of 24 (the sibling) | none" in lines[2] and "0.310" in lines[2]
    assert "12 of 24 | as cut" in lines[3] and lines[4].startswith("| 12 of 24 | 2 passes") and "512.3" in lines[4]
    assert "v(4) = 1.050" in text and "RUN --depths 24,12" in text
