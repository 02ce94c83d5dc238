"""Smoke test of benchmarks/decoder/bench_decoder.py on two random tiny models, so the script keeps running on a
fresh clone (slow: 4-9 s on the shared 2-core box; run with -m slow)."""
import pytest

from tests.conftest import import_benchmark


@pytest.mark.slow
def test_bench_decoder_runs_on_random_tiny_models(capsys):
    bench_decoder = import_benchmark("bench_decoder")
    argv = ["--random-tiny", "--n-prompts", "2", "--runs", "1", "--max-new-tokens", "12", "--threads", "1", "--no-append"]
    assert bench_decoder.main(argv) == 0
    out = capsys.readouterr().out
    assert "| greedy |" in out and "| T=0.7 |" in out and "hindsight oracle" in out and "R^2" in out
