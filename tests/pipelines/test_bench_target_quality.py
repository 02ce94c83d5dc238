"""benchmarks/training/bench_target_quality.py's arguments, table and CSV loss reader on hand-made inputs (no models)."""
import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_target_quality")


def test_arguments(bench):
    args = bench.parse_args(["/runs/x"])
    assert (args.steps, args.prompts, args.max_new_tokens, args.config) == ([720, 1440, 2880], 10, 48, "configs/demo.yaml")
    assert bench.parse_args(["/runs/x", "--steps", "180", "360"]).steps == [180, 360]
    with pytest.raises(SystemExit):
        bench.parse_args(["/runs/x", "--steps", "0"])


def test_table_rows(bench):
    q = {"math": {"exact_match": 10.0}, "translate": {"exact_match": 0.0, "bleu": 12.345},
         "summarize": {"rouge2": 3.21}, "code": {"exact_match": 20.0, "bleu": 5.0}}
    text = bench.table([{"steps": 180, "reused": True, "wall_s": 155.1, "cpu_s": None, "final_loss": None, "quality": q},
                        {"steps": 360, "wall_s": 300.4, "cpu_s": 290.0, "final_loss": 2.3456, "quality": q}])
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| steps | pretrain s (wall)")
    assert lines[2] == "| 180 (the run's target) | 155 | n/a | n/a | 10.0 | 0.0 / 12.3 | 3.2 | 20.0 / 5.0 |"
    assert lines[3].startswith("| 360 | 300 | 290 | 2.346 |")


def test_final_loss_reads_the_last_logged_train_loss(bench, tmp_path):
    log = tmp_path / "metrics.csv"
    log.write_text("epoch,step,train/loss,train/lr\n0,9,5.0,0.001\n0,9,,0.001\n0,19,4.5,0.002\n0,20,,\n")
    assert bench._final_loss(log) == 4.5
    assert bench._final_loss(tmp_path / "missing.csv") is None
