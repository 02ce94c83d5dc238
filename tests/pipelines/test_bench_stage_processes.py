"""benchmarks/pipeline/bench_stage_processes.py's arguments and table on hand-made inputs (no stage is run)."""
import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_stage_processes")


def _root(tmp_path, *outputs):
    for out in outputs:
        (tmp_path / out).mkdir(exist_ok=True)
        (tmp_path / out / "manifest.json").write_text("{}")
    return str(tmp_path)


def test_arguments(bench, tmp_path, capsys):
    args = bench.parse_args([_root(tmp_path, "distill_data", "heads"), "--processes", "1,2,4", "--runs", "3"])
    assert args.processes == [1, 2, 4] and args.stages == ["distill-data", "train-heads"] and args.runs == 3
    for argv, message in (([_root(tmp_path), "--processes", "1,x"], "give process counts"),
                          ([_root(tmp_path), "--processes", "0,2"], ">= 1"),
                          ([_root(tmp_path), "--stages", "evaluate"], "unknown stage 'evaluate'"),
                          ([str(tmp_path / "nothing"), "--stages", "train-heads"], "no finished train-heads")):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


def test_the_table_compares_medians_and_bytes_with_the_first_count(bench, tmp_path):
    args = bench.parse_args([_root(tmp_path, "heads"), "--stages", "train-heads"])
    results = {"train-heads": {1: [{"wall": 100.0, "content_hash": "a"}, {"wall": 80.0, "content_hash": "a"}],
                               2: [{"wall": 50.0, "content_hash": "a"}, {"wall": 40.0, "content_hash": "b"}]}}
    rows = [line for line in bench.table(args, results).splitlines() if line.startswith("| train-heads")]
    assert rows[0].endswith("| 100.0, 80.0 | 90.0 | 1.00x | 2 of 2 |")
    assert rows[1].endswith("| 50.0, 40.0 | 45.0 | 2.00x | 1 of 2 |")
