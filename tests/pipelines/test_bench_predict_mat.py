"""benchmarks/predict/bench_predict_mat.py on a tiny exported run: the MAT the simulation predicts for fixed K and
SpecDec++ is the MAT the batched decoder counts on the same prompts, at every B and seed (no clock)."""
import re

import pytest

from tests.conftest import import_benchmark
from tests.pipelines.conftest import run_template

FAST = {"train_heads": {"depths": [0, 1], "w_rejs": [1.0, 6.0], "epochs": 1, "cost_ratio": 0.2},
        "acceptance_data": {"max_sequences": {"train": 8, "dev": 4}}}


@pytest.fixture(scope="module")
def exported(_tiny_run_template, tmp_path_factory):
    return run_template(tmp_path_factory, "predict_mat", _tiny_run_template,
                        ("distill-data", "train-drafters", "acceptance-data", "train-heads", "export"), **FAST)


def test_predicted_mat_is_the_counted_mat_at_every_batch_size(exported, capsys):
    bench = import_benchmark("bench_predict_mat")
    assert bench.main(["--run", str(exported), "--batch-sizes", "1,2,3", "--ks", "1,2", "--max-new-tokens", "10",
                       "--seeds", "3", "--no-append"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (K=\d|SpecDec\+\+) \| (\d) \| ([\d.]+) \| ([\d.]+)-([\d.]+) \| ([\d.]+) \| ([+-][\d.]+)% \|$",
                      out, flags=re.MULTILINE)
    # each row printed as its B ends and again in the section
    assert len(rows) == 2 * 3 * 3 and {r[0] for r in rows} == {"K=1", "K=2", "SpecDec++"}
    for _, _, seed0, low, high, counted, err in rows:
        assert seed0 == low == high == counted and float(err) == 0.0
    assert any(float(r[5]) > 1.0 for r in rows)  # some drafts accepted: the equality is not AR's 1 = 1


def test_a_run_without_a_bundle_is_a_one_line_error(tmp_path, capsys):
    bench = import_benchmark("bench_predict_mat")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--run", str(tmp_path)])
    assert exit_.value.code == 2 and "run `make real` first" in capsys.readouterr().err


def test_a_k_the_prediction_does_not_simulate_is_refused(exported, capsys):
    bench = import_benchmark("bench_predict_mat")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--run", str(exported), "--ks", "1,3"])
    assert exit_.value.code == 2 and "simulates fixed K in 1, 2, 4, 8" in capsys.readouterr().err
