"""benchmarks/engines/bench_distill_real.py on the tiny run's target: every (backend, dtype) answers the same
prompts through the stage's own open_backend, the table holds one row each, and the decoder's greedy answers in
fp32 equal transformers' token for token; a list flag it does not know stops in one line."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_distill_real", ROOT / "benchmarks/engines/bench_distill_real.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_backend_and_dtype_answers_and_fp32_answers_agree(bench, tiny_run, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(f"run:\n  root: {tiny_run}\n")
    page = ROOT / "benchmarks/engines/RESULTS.md"
    before = page.read_bytes()
    assert bench.main(["--config", str(config), "--target", str(tiny_run / "target"), "--prompt-set",
                       str(tiny_run / "prompts" / "sets"), "--n-prompts", "4", "--batch", "2", "--tokens", "6",
                       "--passes", "2", "--threads", "1", "--work", str(tmp_path), "--no-append"]) == 0
    assert page.read_bytes() == before
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith(("| hf |", "| decoder |"))}
    assert set(rows) == {(b, d) for b in ("hf", "decoder") for d in ("float32", "bfloat16")}
    assert rows["hf", "float32"][2] == "1.00 (1.00-1.00)"  # the baseline over itself, within each pass
    assert rows["decoder", "float32"][4] == "4/4"


@pytest.mark.parametrize("argv", [["--backends", "hf,vllm"], ["--dtypes", "float32,float32"], ["--passes", "0"]])
def test_bad_lists_stop_in_one_line(bench, argv, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(["--config", "c.yaml", "--target", "t", "--prompt-set", "p", *argv, "--no-append"])
    assert stop.value.code == 2 and "error:" in capsys.readouterr().err
