"""benchmarks/training/bench_teacher_cache.py's arguments and table on hand-made inputs (no model)."""
import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_teacher_cache")


def test_arguments(bench):
    args = bench.parse_args(["runs/demo"])
    assert (args.root, args.domain, args.steps, args.rounds) == ("runs/demo", "code", 50, 3)
    with pytest.raises(SystemExit):
        bench.parse_args(["runs/demo", "--steps", "0"])


def test_table_gives_each_mode_its_median_and_the_ratio_to_live(bench):
    lines = bench.table(50, {"live": [6.0, 5.0, 9.0], "cached": [2.0, 3.0, 2.5]}, 4.0).splitlines()
    assert lines[2] == "| live | 6.00 | 5.00-9.00 | 0.1200 | 1.00x |"
    assert lines[3] == "| cached | 2.50 | 2.00-3.00 | 0.0500 | 2.40x |"
    assert lines[4].startswith("| (cache build, once per stage) | 4.00 |")
