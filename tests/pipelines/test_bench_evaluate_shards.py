"""benchmarks/pipeline/bench_evaluate_shards.py's arguments and count comparison on hand-made inputs (no model)."""
import json

import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_evaluate_shards")


def _root(tmp_path):
    (tmp_path / "bundle").mkdir(exist_ok=True)
    (tmp_path / "bundle" / "bundle.json").write_text("{}")
    return str(tmp_path)


def test_arguments(bench, tmp_path, capsys):
    args = bench.parse_args([_root(tmp_path), "--shards", "1,2,4"])
    assert args.shards == [1, 2, 4] and args.config == "configs/demo.yaml"
    for argv, message in (([_root(tmp_path), "--shards", "1,x"], "give shard counts"),
                          ([_root(tmp_path), "--shards", "0,2"], ">= 1"),
                          ([str(tmp_path / "nothing")], "no exported bundle")):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert message in capsys.readouterr().err


def test_counts_are_keyed_by_what_a_run_is(bench, tmp_path):
    run = {"set": "test", "domain": "math", "prompt": "p", "family": "fixed", "drafter": "math", "policy": "K",
           "k": 4, "mode": "greedy", "bandit": None, "router": None, "params": {"a": 1},
           "N": 48, "N_target": 12, "N_draft": 40, "N_discarded": 4, "time_s": 0.1}
    (tmp_path / "metrics.json").write_text(json.dumps({"runs": [run, {**run, "k": 8, "N_target": 10}]}))
    counts = bench.counts_by_run(tmp_path)
    assert sorted(counts.values()) == [(48, 10, 40, 4), (48, 12, 40, 4)]
