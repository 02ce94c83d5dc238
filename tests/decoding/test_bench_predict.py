"""benchmarks/predict/bench_predict.py --paired: each pass's prediction against the decodes right after its own table."""
from types import SimpleNamespace

import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_predict")


def test_each_pass_is_priced_by_its_own_table(bench, monkeypatch):
    # pass i's table predicts 100 * i tokens/s; every decode takes 1 s of 110 tokens: the per-pass errors are
    # 100 i / 110 - 1, whatever the order, and the warm-up pass (table 0) neither counts nor is timed
    tables, calls = [], []
    monkeypatch.setattr(bench, "timed_call", lambda fn, device: (fn(), SimpleNamespace(time=1.0)))

    def profile():
        tables.append(SimpleNamespace(i=len(tables)))
        return tables[-1]

    def predicted_at(table, groups, b):
        return {name: {"tokens_per_s": 100.0 * table.i, "mat": 2.0} for name in ("AR", "K=4")}

    def methods(table, groups):
        result = [SimpleNamespace(metrics=SimpleNamespace(n_generated=110, n_target=55))]
        return {name: (lambda name=name: calls.append((table.i, name)) or result) for name in ("AR", "K=4")}

    worst = {}
    rows, last = bench.paired_rows(2, [[1], [2]], profile, predicted_at, methods, 3, worst)
    assert len(tables) == 4 and last is tables[-1]
    # the warm-up decodes every method once; then the order rotates so no method always follows the profile
    assert calls == [(0, "AR"), (0, "K=4"), (1, "AR"), (1, "K=4"), (2, "K=4"), (2, "AR"), (3, "AR"), (3, "K=4")]
    # errors 100/110 - 1, 200/110 - 1, 300/110 - 1: median +81.8%, spread -9.1%..+172.7%
    assert rows[0] == "| AR | 2 | 200.0 | 110.0 | +81.8% (-9.1%..+172.7%) | 2.00 | 2.00 |"
    assert worst == {"AR": pytest.approx(200 / 110 - 1), "K=4": pytest.approx(200 / 110 - 1)}


def test_paired_refuses_a_compiled_run(bench, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--paired", "--compile", "default", "--no-append"])
    assert exit_.value.code == 2
    assert "--paired profiles a table every pass: eager only" in capsys.readouterr().err


def test_unpaired_rows_measure_by_the_median_pass_and_by_each_batchs_fastest(bench):
    # two batches of 10 tokens each (one row each), three passes: totals 4, 3, 6 s (median 4 s: 5 tokens/s); each
    # batch's fastest pass, 1 s and 1.5 s (from different passes): 2.5 s, 8 tokens/s
    row = SimpleNamespace(metrics=SimpleNamespace(n_generated=10, n_target=4))
    times = {"K=4": [[2.0, 2.0], [1.5, 1.5], [1.0, 5.0]]}
    outs = {"K=4": [[[row], [row]]] * 3}
    worst, worst_fastest = {}, {}
    rows = bench.unpaired_rows(4, {"K=4": {"tokens_per_s": 6.0, "mat": 2.4}}, times, outs, worst, worst_fastest)
    assert rows == ["| K=4 | 4 | 6.0 | 5.0 | +20.0% | 8.0 | -25.0% | 2.40 | 2.50 |"]
    assert worst == {"K=4": pytest.approx(0.2)} and worst_fastest == {"K=4": pytest.approx(0.25)}


def test_a_decision_is_judged_against_the_best_fixed_k_of_its_own_pass(bench):
    # pass 0: K=4 fastest, predict chose 4 (ratio 1); pass 1: AR fastest (K = 0), predict chose 2 (ratio 90 / 120)
    rates = {"AR": [100.0, 120.0], "K=2": [150.0, 90.0], "K=4": [180.0, 80.0], "K table": [180.0, 90.0],
             "batch-aware lockstep": [500.0, 500.0]}  # not a fixed K: never the best
    assert bench.decision_quality(rates, [4, 2]) == [(4, 4, 1.0), (2, 0, pytest.approx(0.75))]
    lines = bench.decision_lines({2: bench.decision_quality(rates, [4, 2])})
    assert lines[-1] == "| 2 | 4, 2 | 4, 0 | 0.875 (0.750..1.000) |"


def test_unpaired_decisions_judge_one_tables_k_against_each_passs_best(bench, monkeypatch):
    # one table chooses K = 2 at B = 2; pass 0 decodes K=2 fastest, pass 1 AR: the decision is judged per pass
    row = SimpleNamespace(metrics=SimpleNamespace(n_generated=10, n_target=5))
    pass_time = {"AR": [2.0, 1.0], "K=2": [1.0, 2.0], "K table": [1.0, 2.0]}
    monkeypatch.setattr(bench, "predicted_at", lambda s, table, groups, b: {
        name: {"tokens_per_s": 10.0, "mat": 2.0, **({"k": 2} if name == "K table" else {})} for name in pass_time})
    monkeypatch.setattr(bench, "methods", lambda s, table, b=None: dict.fromkeys(pass_time if b else ("AR", "K=2")))
    monkeypatch.setattr(bench, "interleave", lambda fns, groups, runs, device: (
        {name: [[pass_time[name][i]] for i in range(runs)] for name in fns},
        {name: [[[row]] for _ in range(runs)] for name in fns}))
    s = SimpleNamespace(args=SimpleNamespace(profile_each_batch=False, runs=2, device="cpu"))
    decisions = {}
    rows, _ = bench.unpaired_batch_size(s, 2, [[[1]]], "table", {}, {}, [], decisions)
    assert decisions == {2: [(2, 2, 1.0), (2, 0, 0.5)]} and len(rows) == 3


def test_with_a_head_specdecpp_decodes_at_the_h_and_k_max_it_is_predicted_at(bench, monkeypatch):
    seen = {}
    monkeypatch.setattr(bench, "generate_batch", lambda target, group, n, **kw: seen.update(kw) or [])
    head = SimpleNamespace()  # the rule only keeps it here; nothing is decoded
    s = bench.Setup(args=SimpleNamespace(max_new_tokens=8, decisions=False, rounds=2, seed=0), target=None,
                    drafter="d", head=head, prior="the head's prior", prompts=[], eos=None, ks=[2], k_max=8, context=4,
                    slots=64, summary=SimpleNamespace(threshold=0.6), compiler=None)
    monkeypatch.setattr(bench, "LockstepBatchAwareSpecDec", lambda *a: "the batch-aware rule")  # needs a real table
    fns = bench.methods(s, SimpleNamespace(max_drafts=6))
    assert list(fns) == ["AR", "K=2", "SpecDec++", "batch-aware lockstep"]
    fns["SpecDec++"]([[1]], 0)
    rule = seen["policy"]
    assert isinstance(rule, bench.SpecDecPP) and rule.head is head and rule.threshold == 0.6 and rule.max_tokens == 6
    predicted = {"AR": {}, "K table": {"k": 0}, "SpecDec++ h=0.6": {"mat": 3.0}}
    monkeypatch.setattr(bench, "predict_throughput", lambda *a, **kw: {
        "predictions": [{"method": m, **v} for m, v in predicted.items()], "k_per_batch_size": {1: 2}})
    table = SimpleNamespace(prefill_positions=lambda n: n, max_drafts=6)
    out = bench.predicted_at(s, table, [[[1, 2]]], 1)  # one batch of one prompt
    assert out["SpecDec++"]["mat"] == 3.0  # the row the decode is set beside is the prediction at the same h


def test_the_real_wrapper_runs_bench_predict_on_the_run_in_its_own_section(monkeypatch, tmp_path, capsys):
    real = import_benchmark("bench_predict_real")
    with pytest.raises(SystemExit) as exit_:
        real.main(["--run", str(tmp_path)])
    assert exit_.value.code == 2 and "make real" in capsys.readouterr().err
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "bundle.json").write_text("{}")
    (tmp_path / "prompts" / "sets").mkdir(parents=True)
    seen = {}
    monkeypatch.setattr(real.bench_predict, "main", lambda argv, owner: seen.update(argv=argv, owner=owner) or 0)
    assert real.main(["--run", str(tmp_path), "--runs", "5"]) == 0
    argv = seen["argv"]
    # its section on its own page: the one of its folder, not bench_predict.py's
    assert seen["owner"].name == "bench_predict_real.py" and seen["owner"].parent.name == "predict"
    assert argv[:4] == ["--bundle", str(tmp_path / "bundle"), "--prompt-set", str(tmp_path / "prompts" / "sets")]
    # an option given after the defaults wins: argparse keeps the last
    assert real.bench_predict.build_parser().parse_args(argv).runs == 5
    assert {"--profile-each-batch", "--decisions"} <= set(argv)
