"""The evaluate stage on a tiny exported run: report files, numbers traceable to metrics.json, damage."""
import json
import os
import re
from pathlib import Path

import pytest

from specdraft.core.errors import InputError
from specdraft.decoding.bundle.loading import choose_dtype
from specdraft.pipelines.evaluate.methods import key_of, label
from specdraft.pipelines.evaluate.plots import PLOTS
from specdraft.pipelines.evaluate.render import headline
from specdraft.pipelines.schema import EvaluateSection
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import FAST, fresh_copy, run_template, tiny_config

REPO = Path(__file__).resolve().parents[2]

TINY_EVAL = {"prompts_per_domain": 2, "max_new_tokens": 8, "ks": [2], "k": 2, "sampling_prompts": 1,
             "stream_bandits": ["ucb-bd"], "repeats": 2, "repeats_max": 2, "calibration_reps": 3,
             "batch_sizes": [1, 2]}  # throughput rows: the 4 test prompts in batches of 1 and of 2
# heads for greedy decoding and for the sampling rows, each labelled under its own transform
TWO_TRANSFORMS = {**FAST["acceptance_data"], "label_transforms": [{"temperature": 0.0}, {"temperature": 1.0}]}


def _config(root):
    return tiny_config(root, **{**FAST, "acceptance_data": TWO_TRANSFORMS}, evaluate=TINY_EVAL)


@pytest.fixture(scope="module")
def _exported(_tiny_run_template, tmp_path_factory):
    return run_template(tmp_path_factory, "evaluate", _tiny_run_template,
                        ("distill-data", "train-drafters", "acceptance-data", "train-heads", "export"),
                        **{**FAST, "acceptance_data": TWO_TRANSFORMS}, evaluate=TINY_EVAL)


@pytest.fixture
def run_root(_exported, tmp_path):
    return fresh_copy(_exported, tmp_path)


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(?<![\w.])-?\d+\.\d+|(?<![\w.=])\d+(?![\w.])", text)]


def _json_numbers(obj) -> set[float]:
    if isinstance(obj, bool):
        return set()
    if isinstance(obj, (int, float)):
        return {float(obj)}
    if isinstance(obj, dict):
        return set().union(*(_json_numbers(v) for v in obj.values())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(_json_numbers(v) for v in obj)) if obj else set()
    return set()


def test_report_numbers_come_from_metrics_json(run_root):
    out = run_stage(_config(run_root), "evaluate")
    assert out == run_root / "report"
    for name in ("report.md", "metrics.json", *PLOTS):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in PLOTS)
    metrics = json.loads((out / "metrics.json").read_text())
    rows = metrics["rows"]
    # where the target ran and how it was loaded; the bandits' c (the bundle's) beside the calibrated one
    # target.dtype auto: what it means on this CPU (bf16 with bf16 units, else fp32), and why, in one line
    auto = choose_dtype("auto", "cpu")
    assert metrics["target_load"]["devices"] == ["cpu"] and metrics["target_load"]["dtype"] == auto.name
    report_text = (out / "report.md").read_text()
    assert f"Target on cpu, dtype {auto.name} ({auto.reason}), quantization none." in report_text
    bundle_c = json.loads((run_root / "bundle" / "bundle.json").read_text())["decoding"]["cost_ratio"]
    assert metrics["bundle_cost_ratio"] == bundle_c and "bundle's c" in report_text
    timing = metrics["timing"]
    assert timing["timer"] == "process CPU time" and timing["warmup"] and timing["passes_max"] == 2
    assert "Timing: process CPU time" in report_text and "no further passes" in report_text
    # every method ran on the same prompts; greedy speculative output equals AR's, so N agrees
    greedy = [r for r in rows if r["mode"] == "greedy" and r["domain"] != "all"]  # "all" pools what ran
    families = {r["family"] for r in rows}
    assert {"ar", "fixed", "specdecpp", "oracle", "domain", "hindsight"} <= families
    ar = {(r["set"], r["domain"]): r for r in greedy if r["family"] == "ar"}
    assert all(r["speedup"] == 1.0 and r["counted_speedup"] == 1.0 and r["MAT"] == 1.0 for r in ar.values())
    for r in greedy:
        assert r["MAT"] == pytest.approx(r["N"] / r["N_target"], abs=1e-3)
    # per prompt (some families run on the first prompts only): every greedy run emits AR's tokens' count
    ar_n = {r["prompt"]: r["N"] for r in metrics["runs"] if r["family"] == "ar" and r["mode"] == "greedy"}
    for r in metrics["runs"]:
        if r["mode"] == "greedy":
            assert r["N"] == ar_n[r["prompt"]], label(r)
    # the further families ran and render: SpecTr, cascades (sampling) and the model-free arms (greedy)
    assert {"spectr", "cascade", "model_free"} <= families
    assert "SpecTr" in (out / "report.md").read_text() and "SpecCascade [Token] math" in (out / "report.md").read_text()

    for r in rows:
        if r["family"] == "oracle":
            assert r["N_discarded"] == 0  # Theorem 4.1: the oracle never drafts a token it loses
    assert {r["mode"] for r in rows} == {"greedy", "sampling"}
    for mode, temperature in (("greedy", 0.0), ("sampling", 1.0)):  # SpecDec++ rows in both modes...
        assert any(r["mode"] == mode and r["family"] == "specdecpp" for r in rows)
        for h in metrics["heads"][mode].values():  # ...each with the heads labelled under its transform
            assert h["name"].startswith("greedy/" if temperature == 0.0 else "T1/")
    bandits = {(r["bandit"], r["stream"]) for r in rows if r["family"] == "bandit"}
    assert ("ucb-bd", False) in bandits and ("ucb-bd", True) in bandits
    assert {label(r) for r in rows if r["family"] == "bandit"} >= {"MetaSD-UCB (BD)", "MetaSD-UCB (BD) (stream)"}
    # the one-pass ceiling needs every drafter's run on the prompt: only where per_drafter_sets has them
    ceiling = [r for r in rows if r["family"] == "ceiling"]
    assert ceiling and {r["set"] for r in ceiling} == {"test"}
    near = {json.dumps(e["key"], sort_keys=True): e for e in metrics["effects"]["bandits_near_best"]}
    assert near[json.dumps(key_of(ceiling[0]), sort_keys=True)]["key"]["family"] == "ceiling"
    assert {(e["key"]["bandit"], e["key"]["stream"]) for e in metrics["stopping_regret"]} == bandits | {(None, False)}
    # every run's raw numbers are kept: its counts and each repeat's times (stream bandits run once)
    runs = metrics["runs"]
    assert len(runs) == sum(r["prompts"] for r in rows if r["domain"] != "all"
                            and r["family"] not in ("domain", "hindsight"))
    for r in runs:
        assert len(r["repeats"]) == (1 if r["stream"] else 2), label(r)
        assert all(t["time_s"] > 0 and t["wall_s"] > 0 for t in r["repeats"])
    for r in rows:  # every speedup is a median inside its interval
        for name in ("speedup", "counted_speedup", "wall_speedup"):
            if r[name] is not None:
                assert r[name + "_lo"] <= r[name] <= r[name + "_hi"], (label(r), name)
    assert set(metrics["calibration"]["v"]) >= {"0", "2"} and metrics["calibration"]["v"]["0"] == 1.0
    # the bandits choose among the specialists; the OFA drafter is a baseline beside them (MetaSD Table 3)
    assert metrics["bandit_arms"] == sorted(set(metrics["drafters"]["own"].values()))
    assert metrics["drafters"]["ofa"] not in metrics["bandit_arms"] and len(metrics["bandit_arms"]) >= 2
    assert {r["set"] for r in rows} == {"test", "perturbed", "ood"}
    assert metrics["cost_fit"]["runs"] > 2
    # the target alone on its tasks: greedy AR on every scored test prompt, with an example each
    quality = metrics["target_quality"]
    ar_test = {r["domain"]: r["prompts"] for r in greedy if r["family"] == "ar" and r["set"] == "test"}
    assert set(quality) == set(ar_test) and all(q["prompts"] == ar_test[d] for d, q in quality.items()), ar_test
    assert "## The target on its tasks" in (out / "report.md").read_text()
    # the specialists' teacher-forced margins travel from train-drafters through the bundle to the report
    for own in set(metrics["drafters"]["own"].values()):
        assert "agreement_vs_best_other_lo" in metrics["drafter_alignment"][own][own]
    assert "win in domain by greedy agreement (teacher-forced" in (out / "report.md").read_text()
    # every number in the report's tables is a number of metrics.json
    known = _json_numbers(metrics)
    table_lines = [ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("|") and "---" not in ln]
    assert len(table_lines) > 10
    for line in table_lines:
        for x in _numbers(line.split("|", 2)[2] if line.count("|") > 2 else line):
            assert any(abs(x - y) < 5e-4 for y in known), f"{x} in '{line}' is not in metrics.json"
    head = headline(metrics)
    assert head.startswith("| method") and "AR" in head
    # benchmarks/adaptive/bench_multi_drafter.py builds its tables from this same metrics.json
    from tests.conftest import import_benchmark

    bench = import_benchmark("bench_multi_drafter")
    for table in (bench.bandit_table(metrics), bench.best_arm_table(metrics), bench.robustness_table(metrics)):
        assert len(table) >= 3 and all(line.startswith("|") for line in table)
    _throughput_counts_are_the_batched_decoders(run_root, metrics)
    assert "## Throughput by batch size" in report_text and "adaptive length hold up" in report_text
    assert run_stage(_config(run_root), "evaluate") == out  # a rerun is a cache hit


def _throughput_counts_are_the_batched_decoders(root: Path, metrics: dict) -> None:
    """Every throughput run's per-row counts are those of decoding.batched.generate_batch called directly on its
    batch's prompts with the bundle's all-domain drafter, its head at the evaluated threshold, fixed K or the
    length bandit (N_max = k, the bundle's c), and the run's seed."""
    from specdraft.decoding.batched import generate_batch
    from specdraft.decoding.bundle.chat import end_of_turn_ids
    from specdraft.decoding.bundle.directory import load_bundle
    from specdraft.decoding.policies.batch_length_ucb import LengthUCB
    from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP
    from specdraft.pipelines.evaluate.load import load_prompts, load_target

    cfg = _config(root)
    ecfg = cfg.evaluate
    bundle = load_bundle(root / "bundle")
    tok = bundle.load_tokenizer()
    target = load_target(bundle, cfg.target, "cpu")
    ofa = metrics["drafters"]["ofa"]
    drafter = bundle.load_drafter(ofa, device="cpu", target=target)
    h = metrics["heads"]["greedy"][ofa]
    head, _ = bundle.load_head(ofa, h["name"], device="cpu")
    max_prompt = min(ecfg.max_prompt_tokens, target.config.max_position_embeddings - ecfg.max_new_tokens - 1)
    prompts = {p.id: p for p in load_prompts(root / "prompts", ecfg, tok, max_prompt, [], bundle.chat)
               if p.set == "test"}
    policies = {"ar": lambda k: None, "fixed": lambda k: FixedK(k),
                "specdecpp": lambda k: SpecDecPP(head, h["threshold"], h["k_max"]),
                "specdecpp-lockstep": lambda k: LockstepSpecDecPP(head, h["threshold"], h["k_max"]),
                "ucbspec": lambda k: LengthUCB(tuple(range(k + 1)), delta=ecfg.delta,
                                               cost_ratio=bundle.defaults.cost_ratio)}
    t = metrics["throughput"]
    # the batch-aware rows were priced with the cost table the stage profiled (in metrics.json) and the bundle's prior
    from specdraft.decoding.policies.batch_aware import GlobalVerifyBudget, LockstepBatchAwareSpecDec
    from specdraft.decoding.costs.model import CostTable

    table, prior = CostTable.from_dict(t["cost_table"]), bundle.prior_for(ofa)
    policies["batch-aware-lockstep"] = lambda k: LockstepBatchAwareSpecDec(head, table, prior, h["k_max"])
    policies["global-budget"] = lambda k: GlobalVerifyBudget(head, table, prior, k)
    assert t["batch_sizes"] == [1, 2] and sorted(t["prompt_ids"]) == sorted(prompts)
    assert {r["policy"] for r in t["runs"]} == {"ar", "fixed", "specdecpp", "specdecpp-lockstep", "ucbspec",
                                                "batch-aware-lockstep", "global-budget"}
    assert {x["batch"] for x in t["predicted"]["predictions"]} == {1, 2}
    assert any(x["measured_tokens_per_s"] for x in t["predicted"]["predictions"])
    for run in t["runs"]:
        direct = generate_batch(target, [list(prompts[p].ids) for p in run["row_prompts"]], ecfg.max_new_tokens,
                                drafter=None if run["policy"] == "ar" else drafter,
                                policy=policies[run["policy"]](run["k"]), eos_token_id=end_of_turn_ids(tok, target),
                                seed=run["seed"])
        assert run["rows"] == [{"N": d.metrics.n_generated, "N_target": d.metrics.n_target,
                                "N_draft": d.metrics.n_draft, "N_discarded": d.metrics.n_discarded}
                               for d in direct], label(run)
    for row in t["rows"]:  # pooled per batch size and method from exactly those runs
        runs = [r for r in t["runs"] if key_of(r) == key_of(row)]
        assert row["N"] == sum(r["N"] for r in runs) and row["batches"] == len(runs) == 4 // row["batch_size"]


def test_drafter_quality_beside_the_targets_and_the_cascades_plot(run_root):
    """evaluate.drafter_quality: every drafter decodes alone on the scored test prompts; the report sets its quality
    beside the target's with the paired gap; the cascades' quality-latency plot is written when cascades ran."""
    cfg = tiny_config(run_root, **{**FAST, "acceptance_data": TWO_TRANSFORMS},
                      evaluate={**TINY_EVAL, "bandits": [], "stream_bandits": [], "spectr_drafts": [],
                                "model_free_arms": [], "drafter_quality": True})
    out = run_stage(cfg, "evaluate")
    metrics = json.loads((out / "metrics.json").read_text())
    scores, gap = metrics["quality_scores"], metrics["verdicts"]["quality_gap"]["per_domain"]
    assert set(scores) == set(gap) == {"math", "translate"}  # the tiny world's scored domains
    for d, e in scores.items():
        assert set(e["drafters"]) >= set(metrics["drafters"]["own"].values()) | {metrics["drafters"]["ofa"]}
        assert len(e["target"]) == 2  # the 2 test prompts
        for n, by in e["drafters"].items():
            row = gap[d]["drafters"][n]
            diffs = [e["target"][i] - by[i] for i in e["target"]]
            assert row["gap"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-3)
            assert row["gap_lo"] <= row["gap"] <= row["gap_hi"]
            assert row["verdict"] == ("above" if row["gap_lo"] > 0 else "below" if row["gap_hi"] < 0 else "within noise")
    assert "What a cascade trades: the target's quality against its drafters alone" in (out / "report.md").read_text()
    assert (out / "cascades.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pinned_counted_costs_price_every_run_and_the_report_shows_the_calibration_beside(run_root):
    """evaluate.counted_costs: each run's counted cost over AR's on its prompt is Eq. 3.1 with the configured c
    and v(K) (the counts alone), whatever this machine timed; the report names the pinned prices and shows
    the calibration this machine measured in its own row."""
    pinned = {"cost_ratio": 0.05, "verify_slope": 0.25}  # far from anything a CPU measures for this pair
    cfg = tiny_config(run_root, **{**FAST, "acceptance_data": TWO_TRANSFORMS},
                      evaluate={**TINY_EVAL, "sampling_prompts": 0, "bandits": [], "stream_bandits": [],
                                "spectr_drafts": [], "cascades": [], "model_free_arms": [], "model_free_bandit": None,
                                "batch_sizes": [], "repeats": 1, "repeats_max": 1, "counted_costs": pinned})
    out = run_stage(cfg, "evaluate")
    metrics = json.loads((out / "metrics.json").read_text())
    cal, measured = metrics["calibration"], metrics["calibration"]["measured"]
    assert cal["cost_ratio"] == pinned["cost_ratio"] and cal["v"]["2"] == pytest.approx(1.5, abs=1e-3)
    assert measured["cost_ratio"] != pinned["cost_ratio"] and measured["v"]["2"] != cal["v"]["2"]
    assert measured["target_ms"]["1"] == cal["target_ms"]["1"]  # the unit stays this machine's 1-token forward
    ar = {r["prompt"]: r for r in metrics["runs"] if r["family"] == "ar" and r["mode"] == "greedy"}
    spec = [r for r in metrics["runs"] if r["mode"] == "greedy" and r["family"] in ("fixed", "specdecpp")]
    assert spec
    for r in spec:
        rounds = sum(1 + pinned["verify_slope"] * k for k in r["drafted"]) + r["N_target"] - len(r["drafted"])
        by_hand = (rounds + pinned["cost_ratio"] * r["N_draft"]) / ar[r["prompt"]]["N_target"]
        assert r["counted_s"] / ar[r["prompt"]]["counted_s"] == pytest.approx(by_hand, rel=1e-6), label(r)
    report = (out / "report.md").read_text()
    assert "c = 0.05 and v(K) = 1 + 0.25 K" in report
    pinned_row = next(line for line in report.splitlines() if line.startswith("| pinned"))
    measured_row = next(line for line in report.splitlines() if line.startswith("| calibrated on this machine"))
    assert f"| {measured['cost_ratio']:.3f} |" in measured_row and "| 0.050 |" in pinned_row


def test_stopping_time_regret_by_hand():
    from specdraft.decoding.metrics import GenerationMetrics
    from specdraft.pipelines.evaluate.aggregate import stopping_time_regret
    from specdraft.pipelines.evaluate.methods import MethodKey
    from specdraft.pipelines.evaluate.run import Record

    def rec(prompt, domain, family, drafter, rounds):
        key = MethodKey(family, drafter=drafter, k=4, bandit="ucb-bd" if family == "bandit" else None)
        return Record(key, prompt, "test", domain, GenerationMetrics(n_generated=20, n_target=rounds))

    def by_bandit(regret):
        return {e["key"]["bandit"]: e["per_domain"] for e in regret}

    records = [rec("a1", "a", "fixed", "x", 8), rec("a1", "a", "fixed", "y", 6),
               rec("a1", "a", "bandit", None, 9),
               rec("b1", "b", "fixed", "x", 5), rec("b1", "b", "fixed", "y", 7),
               rec("b1", "b", "bandit", None, 5),
               rec("b2", "b", "fixed", "x", 5), rec("b2", "b", "bandit", None, 9)]  # y never ran
    assert by_bandit(stopping_time_regret(records, 4, ["x", "y"])) == {"ucb-bd": {"a": 3.0, "b": 0.0, "all": 1.5}}
    # (1 + 0 + 4) / 3, rounded once
    assert by_bandit(stopping_time_regret(records, 4, ["x"])) == {"ucb-bd": {"a": 1.0, "b": 2.0, "all": 1.667}}


def test_corrupt_bundle_fails_without_report(run_root):
    weights = next((run_root / "bundle" / "drafters").rglob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(InputError, match="sha256|does not match its hash"):
        run_stage(_config(run_root), "evaluate")
    assert not (run_root / "report").exists()


def test_bad_config_is_one_line_error():
    with pytest.raises(InputError, match="evaluate.ks"):
        EvaluateSection(ks=[]).check()
    with pytest.raises(InputError, match="unknown prompt set"):
        EvaluateSection(sets=["tset"]).check()


COUNTS = ("N", "N_target", "N_draft", "N_discarded", "drafted", "arms", "run_drafter", "quality")


def _counts(metrics: dict) -> tuple[list, list]:
    """What no clock moves: every run's counts (in order) and every row's pooled counts and rates."""
    runs = [(r["prompt"], r["set"], json.dumps(key_of(r), sort_keys=True), [r[c] for c in COUNTS])
            for r in metrics["runs"]]
    rows = [(r["set"], r["domain"], json.dumps(key_of(r), sort_keys=True),
             [r.get(c) for c in ("prompts", "N", "N_target", "N_draft", "N_discarded", "MAT", "discard_rate",
                             "verification_rate", "quality")]) for r in metrics["rows"]]
    t = metrics["throughput"]  # the batch runs: each row's counts, and the rows pooled per batch size and method
    batches = [(r["batch"], json.dumps(key_of(r), sort_keys=True), r["row_prompts"], r["seed"], r["rows"])
               for r in t["runs"]]
    pooled = [(r["batch_size"], json.dumps(key_of(r), sort_keys=True),
               [r[c] for c in ("batches", "prompts", "N", "N_target", "N_draft", "N_discarded", "MAT")])
              for r in t["rows"]]
    return runs, rows, batches, pooled


@pytest.mark.slow  # two sharded evaluations and an unsharded one (~65 s); make test keeps the stage's units and merge in
# test_evaluate_plan.py (units split, run and merged back in plan order) and tests/readers/test_shard_readers.py
def test_shards_merge_to_the_counts_of_one_process(_exported, tmp_path, monkeypatch):
    """Two shards split the plan; a stream bandit's (set, domain) stays on one; a shard killed after
    some units reruns only its unfinished ones; --merge before every unit is done names what is
    missing; the last shard to finish merges, and every count equals an unsharded run's. The batch-aware
    rows read the cost table: one process profiles it for every shard (a fixed table here, its rules
    priced at fixed costs too, the same for the unsharded run: the counts, not the clock; the rules' timed
    prices differed between the two runs and moved a batch-aware row's decisions)."""
    import dataclasses

    import specdraft.decoding.costs.profile as cost_profile
    from tests.decoding.test_batch_decode import cost_table

    profiled = []
    monkeypatch.setattr(cost_profile, "profile_cost_table",
                        lambda *a, **k: profiled.append(1) or cost_table(k_max=a[3] - 1, batch_sizes=tuple(a[2])))
    rules = ("SpecDecPP", "LockstepSpecDecPP", "BatchAwareSpecDec", "LockstepBatchAwareSpecDec", "GlobalVerifyBudget")
    monkeypatch.setattr(cost_profile, "price_head_rules", lambda table, *a, **k: dataclasses.replace(
        table, rules=tuple((r, (0.02,) * len(table.batch_sizes), (0.01,) * len(table.batch_sizes)) for r in rules)))
    whole_out = run_stage(_config(fresh_copy(_exported, tmp_path, "whole")), "evaluate")
    whole = json.loads((whole_out / "metrics.json").read_text())
    root = fresh_copy(_exported, tmp_path, "sharded")
    cfg = _config(root)
    monkeypatch.setenv("SPECDRAFT_SHARD", "0/2")
    assert run_stage(cfg, "evaluate") is None  # shard 1's units are not done: nothing committed
    store = next((root / ".work").glob("report-*")) / "units"
    first = sorted(store.glob("unit-*.json"))
    assert first and all(int(p.stem.split("-")[1]) % 2 == 0 for p in first)
    names = [json.loads(p.read_text())["unit"] for p in first]
    assert any(n.startswith("stream ") for n in names)  # stream_bandits: a (set, domain) is one unit
    # a kill: one finished unit lost (a unit in flight never has a file); the rerun redoes that one only
    lost, kept = first[-1], {p: p.stat().st_mtime_ns for p in first[:-1]}
    lost_records = json.loads(lost.read_text())["records"]
    lost.unlink()
    assert run_stage(cfg, "evaluate") is None
    assert {p: p.stat().st_mtime_ns for p in first[:-1]} == kept and lost.is_file()
    def counted(records):
        return [{k: v for k, v in r["metrics"].items() if not k.startswith("time")} for r in records]

    assert counted(json.loads(lost.read_text())["records"]) == counted(lost_records)
    monkeypatch.setenv("SPECDRAFT_MERGE", "1")
    with pytest.raises(InputError, match="units have no records yet"):
        run_stage(cfg, "evaluate")
    monkeypatch.delenv("SPECDRAFT_MERGE")
    monkeypatch.setenv("SPECDRAFT_SHARD", "1/2")
    out = run_stage(cfg, "evaluate")  # the last shard to finish merges
    assert out == root / "report" and not store.exists()
    assert len(profiled) == 2  # the unsharded run and shard 0; shard 1 and the rerun read shard 0's table
    merged = json.loads((out / "metrics.json").read_text())
    assert _counts(merged) == _counts(whole)
    assert merged["calibration"]["reps"] == whole["calibration"]["reps"]  # every unit's samples pooled
    assert [ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("#")] == \
        [ln for ln in (whole_out / "report.md").read_text().splitlines() if ln.startswith("#")]


def test_a_shard_outside_its_count_is_a_one_line_error(capsys, monkeypatch):
    from specdraft.pipelines.cli import main

    monkeypatch.delenv("SPECDRAFT_SHARD", raising=False)
    assert main(["evaluate", "configs/demo.yaml", "--shard", "2/2"]) == 2
    assert "shard index 2 is outside 0..1; check --shard" in capsys.readouterr().err
    assert main(["evaluate", "configs/demo.yaml", "--shard", "half"]) == 2
    assert "--shard must look like 'i/N'" in capsys.readouterr().err
    assert "SPECDRAFT_SHARD" not in os.environ  # nothing set on bad input


@pytest.mark.slow  # about 40 s of subprocesses: `make test-slow`
def test_two_shard_processes_and_a_merge_write_the_report(run_root):
    """`python -m specdraft.pipelines.evaluate CONFIG --shard i/2` in two processes at once, then `--merge`:
    one report with every planned run once (the merge is a cache hit where the last shard merged)."""
    import subprocess
    import sys

    import yaml

    from specdraft.pipelines.config import to_dict

    cfg_file = run_root / "cfg.yaml"
    cfg_file.write_text(yaml.safe_dump(to_dict(_config(run_root))))
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDRAFT_SHARD", "SPECDRAFT_MERGE")}
    command = [sys.executable, "-m", "specdraft.pipelines.evaluate", str(cfg_file)]
    procs = [subprocess.Popen(command + ["--shard", f"{i}/2"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert any("shard 0/2" in o for o in outs) and any("shard 1/2" in o for o in outs)
    merge = subprocess.run(command + ["--merge"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=600)
    assert merge.returncode == 0, merge.stdout
    metrics = json.loads((run_root / "report" / "metrics.json").read_text())
    done = [(r["set"], r["prompt"], json.dumps(key_of(r), sort_keys=True)) for r in metrics["runs"]]
    done += [("batches", r["batch"], json.dumps(key_of(r), sort_keys=True)) for r in metrics["throughput"]["runs"]]
    assert len(done) == len(set(done)) == metrics["plan_runs"]


@pytest.mark.slow  # a second process of about 30 s: `make test-slow`
def test_processes_share_the_plan_and_the_one_that_started_them_merges(run_root):
    """evaluate.processes = 2: this process starts `specdraft evaluate --shard 1/2` on the run's config, runs
    shard 0, waits, and merges; every planned run once, the work dir gone (committed)."""
    cfg = tiny_config(run_root, **{**FAST, "acceptance_data": TWO_TRANSFORMS}, evaluate={**TINY_EVAL, "processes": 2})
    out = run_stage(cfg, "evaluate")
    assert out == run_root / "report" and not list((run_root / ".work").glob("report-*"))
    metrics = json.loads((out / "metrics.json").read_text())
    done = [(r["set"], r["prompt"], json.dumps(key_of(r), sort_keys=True)) for r in metrics["runs"]]
    done += [("batches", r["batch"], json.dumps(key_of(r), sort_keys=True)) for r in metrics["throughput"]["runs"]]
    assert len(done) == len(set(done)) == metrics["plan_runs"]


def test_a_failed_helper_process_ends_the_stage_with_its_last_line(tmp_path):
    from specdraft.pipelines.shards import wait_for_helpers

    class Done:
        def __init__(self, code):
            self.returncode = code

        def wait(self):
            return self.returncode

    ok, bad = tmp_path / "process-1.log", tmp_path / "process-2.log"
    ok.write_text("fine\n")
    bad.write_text("loading\nspecdraft: error: out of memory\n\n")
    wait_for_helpers([(Done(0), ok)], "evaluate")
    with pytest.raises(RuntimeError, match=r"process-2, started here for evaluate, failed \(exit 1\): specdraft: "
                                           r"error: out of memory; see .*process-2.log"):
        wait_for_helpers([(Done(0), ok), (Done(1), bad)], "evaluate")
    with pytest.raises(InputError, match="evaluate.processes must be >= 1, got 0"):
        tiny_config(tmp_path, evaluate={**TINY_EVAL, "processes": 0}).evaluate.check()


def test_processes_started_here_stop_when_this_ones_share_fails(tmp_path, monkeypatch):
    """A share that raises (a bug, Ctrl-C) terminates the processes this one started: none is left decoding for a
    stage that stopped (their finished units stay for the rerun)."""
    import types

    import specdraft.pipelines.evaluate as evaluate
    import specdraft.pipelines.shards as shards

    class Helper:
        terminated = False

        def terminate(self):
            self.terminated = True

    helper = Helper()
    monkeypatch.delenv("SPECDRAFT_SHARD", raising=False)
    monkeypatch.setattr(shards, "start_helpers", lambda ctx, stage, n: [(helper, tmp_path / "process-1.log")])
    monkeypatch.setattr(evaluate, "run_units", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    prompt = types.SimpleNamespace(set="test", domain="math", id="p0")
    plan = [types.SimpleNamespace(prompt=prompt, repeatable=True)]
    ctx = types.SimpleNamespace(work=tmp_path, cfg=types.SimpleNamespace(evaluate=types.SimpleNamespace(processes=2,
                                                                                                        repeats=1)))
    with pytest.raises(KeyboardInterrupt):
        evaluate._run_shard(ctx, plan, None, types.SimpleNamespace(take=dict))
    assert helper.terminated


def test_robustness_table_shows_only_the_sets_decoded():
    """A set left out of evaluate.sets (the demo leaves out the perturbed one) is no column of MetaSD's Table 6
    shape, not a column of dashes."""
    from specdraft.pipelines.evaluate.cells import decoded_sets
    from specdraft.pipelines.evaluate.tables import robustness_table

    key = {"bandit": None, "drafter": None, "family": "ar", "k": None, "mode": "greedy", "params": {}, "policy": None,
           "reward": None, "router": None, "stream": False}
    row = {"key": key, **{f"{s}_{v}": (None if s == "perturbed" else 1.0) for s in ("test", "perturbed", "ood")
                          for v in ("MAT", "counted_speedup")}}
    metrics = {"headline": [row]}
    assert decoded_sets(metrics) == ["test", "ood"]
    header = robustness_table(metrics).splitlines()[0]
    assert "OOD MAT" in header and "perturbed" not in header
    row.update({f"test_speedup{end}": 1.0 for end in ("", "_lo", "_hi")})
    assert "OOD counted speedup" in headline(metrics) and "perturbed" not in headline(metrics)
    row["perturbed_MAT"] = row["perturbed_counted_speedup"] = 2.0
    assert decoded_sets(metrics) == ["test", "perturbed", "ood"] and "perturbed MAT" in robustness_table(metrics)
