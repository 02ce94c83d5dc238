"""Does the evaluate stage's speed verdict survive a busy machine?

Runs the evaluate stage twice, back to back, on scratch copies of a finished run's bundle and prompt
sets: first as the machine is, then with one core kept busy by a spinning process this script starts
(`python -c 'while True: pass'`) and ends by its pid. Compares, per method (greedy; every set and
domain pooled) and per (set, method) (all domains pooled), the pooled speedups of the two runs: counted
(from counts and the per-machine calibration) and timed (CPU time, interleaved, repeated; a ratio of
totals over prompts); and the Eq. 3.1 cost fit's R^2 of each run.

    python benchmarks/pipeline/bench_evaluate_load.py runs/demo [--config configs/demo.yaml] [KEY=VALUE ...] [--no-append]

Extra KEY=VALUE arguments are config overrides for both runs (e.g. evaluate.repeats=3). Writes the table
as this script's section of benchmarks/pipeline/RESULTS.md with the date, the machine and its load average before each run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.pipelines.config import load_config  # noqa: E402
from specdraft.pipelines.evaluate.methods import label  # noqa: E402
from specdraft.pipelines.schema import RunConfig  # noqa: E402
from specdraft.pipelines.stage import run_stage  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402


def evaluate_once(root: Path, config: str, overrides: list[str], name: str,
                  keep: Path | None = None) -> tuple[dict, float, float]:
    """(metrics, seconds, load average before) of one evaluate run on a scratch copy of root; with `keep`,
    its metrics.json is kept there as NAME.json (for comparing estimators offline on the same runs)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"bench_eval_{name}_")) / "run"
    for d in ("prompts", "bundle"):  # evaluate's only inputs
        shutil.copytree(root / d, scratch / d)
    cfg = load_config(RunConfig, config, [f"run.root={scratch}", *overrides])
    load = os.getloadavg()[0]
    t0 = time.time()
    out = run_stage(cfg, "evaluate")
    wall = time.time() - t0
    metrics = json.loads((out / "metrics.json").read_text())
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "metrics.json", keep / f"{name}.json")
    shutil.rmtree(scratch.parent)
    return metrics, wall, load


def pooled(metrics: dict) -> dict[str, dict]:
    """(set, method label) -> its all-domains greedy row."""
    return {f"{r['set']} / {label(r)}": r for r in metrics["rows"]
            if r["mode"] == "greedy" and r["domain"] == "all" and r["family"] != "ar"}


def compare_table(a: dict, b: dict) -> tuple[list[str], dict]:
    pa, pb = pooled(a), pooled(b)
    rows = ["| set / method | counted (quiet) | counted (busy) | rel. diff | timed (quiet) [interval] "
            "| timed (busy) [interval] | rel. diff |", "| --- |" + " ---: |" * 6]
    worst = {"counted": 0.0, "timed": 0.0}
    within = {"counted": 0, "timed": 0}
    for name in pa:
        if name not in pb:
            continue
        x, y = pa[name], pb[name]
        diffs = {}
        for v in ("counted", "timed"):
            field = "counted_speedup" if v == "counted" else "speedup"
            diffs[v] = abs(y[field] - x[field]) / x[field]
            worst[v] = max(worst[v], diffs[v])
            within[v] += diffs[v] <= (0.02 if v == "counted" else 0.10)
        rows.append(f"| {name} | {x['counted_speedup']:.3f} | {y['counted_speedup']:.3f} | {diffs['counted']:.1%} "
                    f"| {x['speedup']:.3f} [{x['speedup_lo']:.3f}, {x['speedup_hi']:.3f}] "
                    f"| {y['speedup']:.3f} [{y['speedup_lo']:.3f}, {y['speedup_hi']:.3f}] | {diffs['timed']:.1%} |")
    return rows, {"worst": worst, "within": within, "methods": len(rows) - 2}


def per_method(metrics: dict) -> dict[str, tuple[float, float, int]]:
    """method label -> (counted, timed speedup, runs), greedy, pooled over every set, domain and prompt as a
    ratio of totals (evaluate's estimator: each run's mean time over its passes; AR's per-token cost times the
    method's tokens); a method then rests on all its prompts, not on one set's few."""
    ar = {(r["set"], r["prompt"]): r for r in metrics["runs"] if r["family"] == "ar" and r["mode"] == "greedy"}
    sums: dict[str, list[float]] = {}
    for r in metrics["runs"]:
        base = ar.get((r["set"], r["prompt"]))
        if r["mode"] != "greedy" or r["family"] == "ar" or base is None or r.get("stream") or not r["N"]:
            continue
        scale = r["N"] / base["N"]
        acc = sums.setdefault(label(r), [0.0, 0.0, 0.0, 0.0, 0])
        acc[0] += base["counted_s"] * scale
        acc[1] += r["counted_s"]
        acc[2] += statistics.fmean(t["time_s"] for t in base["repeats"]) * scale
        acc[3] += statistics.fmean(t["time_s"] for t in r["repeats"])
        acc[4] += 1
    return {k: (a / b, c / d, n) for k, (a, b, c, d, n) in sums.items()}


def per_method_table(a: dict, b: dict) -> tuple[list[str], dict]:
    pa, pb = per_method(a), per_method(b)
    rows = ["| method (all sets pooled) | runs | counted (quiet) | counted (busy) | rel. diff | timed (quiet) "
            "| timed (busy) | rel. diff |", "| --- |" + " ---: |" * 7]
    diffs = {"counted": [], "timed": []}
    for name in sorted(pa, key=lambda k: -pa[k][2]):
        if name not in pb:
            continue
        (ca, ta, n), (cb, tb, _) = pa[name], pb[name]
        dc, dt = abs(cb - ca) / ca, abs(tb - ta) / ta
        diffs["counted"].append(dc)
        diffs["timed"].append(dt)
        rows.append(f"| {name} | {n} | {ca:.3f} | {cb:.3f} | {dc:.1%} | {ta:.3f} | {tb:.3f} | {dt:.1%} |")
    summary = {"methods": len(diffs["timed"]), "worst": {k: max(v) for k, v in diffs.items()},
               "within": {"counted": sum(d <= 0.02 for d in diffs["counted"]),
                          "timed": sum(d <= 0.10 for d in diffs["timed"])}}
    return rows, summary


# Timed-speedup estimators, compared on the same two runs' raw repeat times (metrics["runs"]): how a run's
# time is taken from its repeats, and how per-prompt times pool into one speedup per method.
def _run_time(run: dict, how: str, repeats: int) -> float:
    ts = sorted(r["time_s"] for r in run["repeats"][:repeats])
    if how == "min":
        return ts[0]
    if how == "median":
        return statistics.median(ts)
    if how == "mean":
        return statistics.fmean(ts)
    raise ValueError(how)


def _pooled_timed(metrics: dict, how: str, pool: str, repeats: int) -> dict[str, float]:
    """(set / method label) -> timed speedup of the greedy measured methods, all domains pooled. pool
    "median": the median over prompts of per-prompt speedups (evaluate's estimator before it pooled ratios of totals);
    "ratio": the ratio of totals, sum over prompts of AR's time (per token, times the method's tokens) over the
    sum of the method's times (every prompt's repeats feed one number, so one noisy prompt moves it less)."""
    ar = {r["prompt"]: r for r in metrics["runs"] if r["family"] == "ar" and r["mode"] == "greedy"}
    groups: dict[str, list[tuple[float, float]]] = {}
    for r in metrics["runs"]:
        base = ar.get(r["prompt"])
        if r["mode"] != "greedy" or r["family"] == "ar" or base is None or r.get("stream") or not r["N"]:
            continue
        if how == "paired":  # per pass, AR and the method timed in the same interleaved pass; median over passes
            ratios = [a["time_s"] / b["time_s"] * base["N"] / r["N"]
                      for a, b in zip(base["repeats"][:repeats], r["repeats"][:repeats])]
            groups.setdefault(f"{r['set']} / {label(r)}", []).append((statistics.median(ratios), 1.0))
            continue
        t_ar = _run_time(base, how, repeats) * r["N"] / base["N"]
        groups.setdefault(f"{r['set']} / {label(r)}", []).append((t_ar, _run_time(r, how, repeats)))
    if pool == "median":
        return {k: statistics.median(a / b for a, b in v) for k, v in groups.items()}
    return {k: sum(a for a, _ in v) / sum(b for _, b in v) for k, v in groups.items()}


ESTIMATORS = (("min", "median", 2), ("min", "median", 3), ("median", "median", 3), ("paired", "median", 3),
              ("min", "ratio", 2), ("min", "ratio", 3), ("median", "ratio", 3), ("mean", "ratio", 3))


def estimator_table(quiet: dict, busy: dict) -> list[str]:
    """Per estimator: how many (set, method) cells agree within 10% between the quiet and the busy run."""
    rows = ["| run time from repeats | pooled over prompts | repeats used | cells | within 10% | worst | median diff |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    n_rep = min(quiet["repeats"], busy["repeats"])
    for how, pool, reps in ESTIMATORS:
        if reps > n_rep:
            continue
        a, b = _pooled_timed(quiet, how, pool, reps), _pooled_timed(busy, how, pool, reps)
        diffs = [abs(b[k] - a[k]) / a[k] for k in a if k in b]
        pooling = "median of per-prompt ratios" if pool == "median" else "ratio of totals"
        rows.append(f"| {how} | {pooling} | {reps} | {len(diffs)} | {sum(d <= 0.10 for d in diffs)} "
                    f"| {max(diffs):.1%} | {statistics.median(diffs):.1%} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("overrides", nargs="*", help="config overrides for both runs, KEY=VALUE")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="keep both runs' metrics.json here (quiet.json, busy.json)")
    ap.add_argument("--estimators", action="store_true",
                    help="only compare timed-speedup estimators on the runs kept in ROOT (quiet.json, busy.json)")
    args = ap.parse_args()
    root = Path(args.root)
    if args.estimators:
        print("\n".join(estimator_table(*(json.loads((root / f"{n}.json").read_text()) for n in ("quiet", "busy")))))
        return
    quiet, quiet_s, quiet_load = evaluate_once(root, args.config, args.overrides, "quiet", args.keep)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # one core kept busy
    try:
        time.sleep(2)
        busy, busy_s, busy_load = evaluate_once(root, args.config, args.overrides, "busy", args.keep)
    finally:
        spinner.kill()  # only the process this script started
        spinner.wait()
    rows, summary = compare_table(quiet, busy)
    method_rows, by_method = per_method_table(quiet, busy)
    fa, fb = quiet["cost_fit"], busy["cost_fit"]
    ca, cb = quiet["calibration"], busy["calibration"]
    k = str(quiet["k"])
    text = "\n".join([
        f"## Evaluate under load: the same evaluation quiet and with one core busy ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{platform.machine()} {os.cpu_count()} cores, run {root})", "",
        f"`python benchmarks/pipeline/bench_evaluate_load.py {' '.join([args.root, *args.overrides])}`: two evaluate runs back "
        f"to back, the second beside `python -c 'while True: pass'`. {quiet['prompts']} prompts, "
        f"{quiet['plan_runs']} planned runs, {quiet['repeats']} repeats, {quiet['threads']} thread(s), "
        f"timer: {quiet['timer']}. Load average (1 min) before the runs: {quiet_load:.1f} and {busy_load:.1f} "
        f"(the box is shared with other work; the busy run adds one spinning core). Stage time: {quiet_s:.0f} s and "
        f"{busy_s:.0f} s.", "",
        f"Worst relative difference between the runs over {summary['methods']} (set, method) pairs, all domains "
        f"pooled: counted speedup {summary['worst']['counted']:.1%} ({summary['within']['counted']} within 2%), "
        f"timed speedup {summary['worst']['timed']:.1%} ({summary['within']['timed']} within 10%). "
        f"Per method, every set pooled ({by_method['methods']} methods): counted {by_method['worst']['counted']:.1%} "
        f"worst ({by_method['within']['counted']} within 2%), timed {by_method['worst']['timed']:.1%} worst "
        f"({by_method['within']['timed']} within 10%). "
        f"Eq. 3.1 cost fit with a constant per prompt, R^2 (robust times): {fa['r2']} quiet, {fb['r2']} busy (within "
        f"prompts: {fa.get('r2_within')} and {fb.get('r2_within')}; on wall time: "
        f"{fa['wall_r2']} and {fb['wall_r2']}). Calibrated v({k}): {ca['v'][k]} and {cb['v'][k]}; "
        f"t_target (1 token): {ca['target_ms']['1']} ms and {cb['target_ms']['1']} ms; mean t_draft "
        f"{ca['drafter_mean_ms']} ms and {cb['drafter_mean_ms']} ms.", "",
        *method_rows, "", *rows, ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
