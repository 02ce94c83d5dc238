"""benchmarks/training/bench_train_step.py's arguments and table on hand-made inputs (no model)."""
import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_train_step")


def test_arguments(bench):
    args = bench.parse_args([])
    assert (args.batches, args.steps, args.rounds, args.config) == ([16, 8, 4, 2], 4, 3, "configs/demo.yaml")
    with pytest.raises(SystemExit):
        bench.parse_args(["--batches", "0"])


def test_table_gives_each_batch_its_median_step_time_and_range(bench):
    lines = bench.table(256, {4: [1000.0, 4000.0, 2048.0]}).splitlines()
    assert lines[0].startswith("| batch x 256 |")
    assert lines[2] == "| 4 | 0.500 | 2,048 | 1,000-4,000 |"  # 4 x 256 tokens at 2,048 tokens/s
