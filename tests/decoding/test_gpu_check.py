"""benchmarks/gpu/gpu_check.py (issue 71's prepared GPU run) and bench_gpu_floor.py, on this CPU: the run refuses a
machine without CUDA at once, its steps run end to end in --smoke, and the floor's byte count is the step's."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.conftest import import_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_run_stops_at_once_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "benchmarks/gpu/gpu_check.py", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "sees no CUDA device" in proc.stderr and "--smoke" in proc.stderr
    assert not out.exists()


def test_an_unknown_step_is_refused_by_name_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "benchmarks/gpu/gpu_check.py", "--only", "floor,curves", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no step named curves" in proc.stderr and "floor, test-gpu, predict, curve" in proc.stderr
    assert not out.exists()


@pytest.mark.slow
def test_smoke_runs_every_benchmark_step_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    pages = {p: p.read_bytes() for p in (ROOT / "benchmarks").glob("*/RESULTS.md")}
    proc = subprocess.run([sys.executable, "benchmarks/gpu/gpu_check.py", "--smoke", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = (out / "summary.md").read_text()
    for step in ("floor", "predict", "curve"):
        assert f"| {step} | 0 |" in summary, summary
    assert "step <= 1.5x floor" in (out / "floor.log").read_text()
    assert "Decisions:" in (out / "predict.log").read_text()
    curve = (out / "curve.log").read_text()
    assert "batch-aware lockstep" in curve and "global budget" in curve
    assert "UCBSpec 0..4 tok/s" not in curve  # --methods core: the GPU's curve compiles only the rules
    assert {p: p.read_bytes() for p in (ROOT / "benchmarks").glob("*/RESULTS.md")} == pages  # --smoke prints only
    # the floor reports each phase as it ends, so a step stopped at its limit says how far it got
    assert "copy bandwidth" in (out / "floor.log").read_text() and "first step called" in (out / "floor.log").read_text()


@pytest.mark.parametrize("tied", [True, False])
def test_the_floor_counts_every_weight_a_step_reads(tied):
    floor = import_benchmark("floor")
    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg)
    every = sum(p.numel() * 4 for p in model.parameters())  # parameters() lists a tied matrix once
    # an untied input embedding is read a row a token: not streamed; tied, it is the output head, read whole
    assert floor.streamed_bytes(model) == (every if tied else every - 64 * 16 * 4)


def test_the_copy_bandwidth_counts_bytes_read_and_written(monkeypatch):
    floor = import_benchmark("floor")
    times = iter([0.5, 0.25, 1.0])
    monkeypatch.setattr(floor, "timed_call", lambda fn, device: (fn(), type("T", (), {"time": next(times)})()))
    assert floor.copy_bandwidth("cpu", 1, 3) == 2 * (1 << 20) / 0.25  # the fastest copy
