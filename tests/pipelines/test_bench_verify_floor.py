"""benchmarks/cpu/bench_verify_floor.py: its parsing, memory budget and paired ratios, and a whole run on a tiny
Llama (printed only: the RESULTS page stays as it was)."""
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_verify_floor")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(path, safe_serialization=True)
    return path


def test_configs_are_a_dtype_and_a_compile_mode(bench):
    configs = bench.parse_configs("float32,bfloat16/default")
    assert [(c.dtype, c.compile, c.name) for c in configs] == [("float32", "none", "float32"),
                                                               ("bfloat16", "default", "bfloat16/default")]
    plain = bench.parse_configs("bfloat16:plain,bfloat16:plain/default")
    assert [(c.dtype, c.plain, c.weights, c.name) for c in plain] == [
        ("bfloat16", True, "bfloat16:plain", "bfloat16:plain"),
        ("bfloat16", True, "bfloat16:plain", "bfloat16:plain/default")]
    for bad in ("float64", "bfloat16/fast", "float32,float32", "", "bfloat16:packed"):
        with pytest.raises(ValueError):
            bench.parse_configs(bad)


def test_a_model_other_than_the_built_in_ones_needs_its_directory(bench):
    assert bench.parse_models("smollm2,demo,q=/x") == [("smollm2", None), ("demo", None), ("q", "/x")]
    with pytest.raises(ValueError, match="qwen=DIR"):
        bench.parse_models("qwen")


def test_configs_past_the_memory_budget_are_left_out_and_named(bench):
    configs = bench.parse_configs("float32,bfloat16,bfloat16/default")
    kept, left = bench.fit_configs(configs, {"float32": 7.1, "bfloat16": 3.6}, 6.0)
    # fp32 alone passes the budget; both bf16 configs share one model's 3.6 GB
    assert [c.name for c in kept] == ["bfloat16", "bfloat16/default"]
    assert len(left) == 1 and left[0].startswith("float32 (7.1 GB")
    kept, left = bench.fit_configs(configs, {"float32": 4.0, "bfloat16": 2.5}, 6.0)
    assert [c.name for c in kept] == ["float32"] and len(left) == 2 and "bfloat16 (2.5 GB" in left[0]
    # the packed and the plain layout are two models: each holds its own weights
    kept, left = bench.fit_configs(bench.parse_configs("bfloat16,bfloat16:plain"), {"bfloat16": 3.6}, 6.0)
    assert [c.name for c in kept] == ["bfloat16"] and left[0].startswith("bfloat16:plain (3.6 GB of weights; 7.2 GB")


def test_v_is_taken_within_each_pass(bench):
    units = [(1, 1), (1, 2), (2, 1), (2, 2)]
    per_pass = [[1.0, 2.0, 4.0, 4.0], [10.0, 12.0, 3.0, 6.0]]  # the second pass 10x slower at B = 1
    v = bench.ratios(per_pass, units)
    assert v[(1, 2)] == [2.0, 1.2] and v[(2, 2)] == [1.0, 2.0] and v[(1, 1)] == [1.0, 1.0]


def test_weight_gigabytes_are_read_from_the_files_shapes(bench, tiny):
    params = sum(p.numel() for p in LlamaForCausalLM.from_pretrained(tiny).parameters())
    assert bench.weight_gb(str(tiny), "float32") == pytest.approx(params * 4 / 1e9)
    assert bench.weight_gb(str(tiny), "bfloat16") == pytest.approx(params * 2 / 1e9)


@pytest.mark.parametrize("argv", [["--configs", "float16x"], ["--models", "qwen"], ["--batch-sizes", "2,4"],
                                  ["--max-k", "3"]])
def test_bad_arguments_stop_in_one_line(bench, argv, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(argv + ["--no-append"])
    assert stop.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_whole_run_on_a_tiny_llama(bench, tiny, capsys):
    page = Path(bench.__file__).with_name("RESULTS.md")
    before = page.read_bytes()
    assert bench.main(["--models", f"tiny={tiny}", "--configs", "float32,bfloat16", "--batch-sizes", "1,2",
                       "--max-k", "4", "--passes", "2", "--ar-tokens", "4", "--ar-prompts", "1", "--copy-mib", "4",
                       "--no-append"]) == 0
    out = capsys.readouterr().out
    assert page.read_bytes() == before
    rows = [line for line in out.splitlines() if line.startswith("| float32 |") or line.startswith("| bfloat16 |")]
    assert len(rows) == 4 and all(len(r.split("|")) == 2 + 6 for r in rows)  # config, B, v(2)..v(5)
    floor = [line for line in out.splitlines() if line.startswith("| tiny |")]
    assert [line.split("|")[2].strip() for line in floor] == ["float32", "bfloat16"]
    mb = [float(line.split("|")[3]) for line in floor]
    assert mb[0] == pytest.approx(2 * mb[1], abs=1)  # bf16 streams half fp32's bytes
    assert "- tiny, bfloat16: v(5)" in out and "x float32's" in out
