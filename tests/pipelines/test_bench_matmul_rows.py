"""benchmarks/real/bench_matmul_rows.py's table and argument checks (its timing needs ~0.5 GB of weights: not run here)."""
import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_matmul_rows")


def test_the_table_gives_medians_spreads_ratios_to_one_row_and_bandwidth(bench):
    samples = {(name, m): [m * 1.0, m * 2.0, m * 3.0] for name in bench.SHAPES for m in (1, 4)}
    lines = bench.table(samples, [1, 4])
    assert len(lines) == 2 + len(bench.SHAPES)
    up = next(line for line in lines if line.startswith("| MLP up"))
    cells = [c.strip() for c in up.strip("|").split("|")]
    assert cells[1:4] == ["2.000 (1.000-3.000)", "8.000 (4.000-12.000)", "4.00"]
    assert cells[4] == f"{576 * 1536 * 4 / 2e-3 / 1e9:.1f}"  # bytes of the weight over its 1-row median


@pytest.mark.parametrize("argv", [["--rows", "2,4"], ["--rows", "1,x"], ["--repeats", "0"]])
def test_bad_arguments_stop_before_anything_is_timed(bench, argv, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.main(argv + ["--no-append"])
    assert stop.value.code == 2 and "error: --" in capsys.readouterr().err
