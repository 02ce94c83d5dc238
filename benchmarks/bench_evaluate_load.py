"""Does the evaluate stage's speed verdict survive a busy machine? (issue 13, acceptance)

Runs the evaluate stage twice, back to back, on scratch copies of a finished run's bundle and prompt
sets: first as the machine is, then with one core kept busy by a spinning process this script starts
(`python -c 'while True: pass'`) and ends by its pid. Compares, per method (greedy; every set, all
domains pooled), the pooled speedups of the two runs: counted (from counts and the per-machine
calibration) and timed (CPU time, interleaved, repeated; median over prompts); and the Eq. 3.1 cost
fit's R^2 of each run.

    python benchmarks/bench_evaluate_load.py runs/demo [--config configs/demo.yaml] [KEY=VALUE ...] [--no-append]

Extra KEY=VALUE arguments are config overrides for both runs (e.g. evaluate.repeats=3). Appends the table
to benchmarks/RESULTS.md with the date, the machine and its load average before each run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.config import load_config  # noqa: E402
from pipelines.report import label  # noqa: E402
from pipelines.schema import RunConfig  # noqa: E402
from pipelines.stage import run_stage  # noqa: E402
from publish import publish  # noqa: E402  (benchmarks/publish.py)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("overrides", nargs="*", help="config overrides for both runs, KEY=VALUE")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="keep both runs' metrics.json here (quiet.json, busy.json)")
    args = ap.parse_args()
    root = Path(args.root)
    quiet, quiet_s, quiet_load = evaluate_once(root, args.config, args.overrides, "quiet", args.keep)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # one core kept busy
    try:
        time.sleep(2)
        busy, busy_s, busy_load = evaluate_once(root, args.config, args.overrides, "busy", args.keep)
    finally:
        spinner.kill()  # only the process this script started
        spinner.wait()
    rows, summary = compare_table(quiet, busy)
    fa, fb = quiet["cost_fit"], busy["cost_fit"]
    ca, cb = quiet["calibration"], busy["calibration"]
    k = str(quiet["k"])
    text = "\n".join([
        f"## Evaluate under load: the same evaluation quiet and with one core busy ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{platform.machine()} {os.cpu_count()} cores, run {root})", "",
        f"`python benchmarks/bench_evaluate_load.py {' '.join([args.root, *args.overrides])}`: two evaluate runs back "
        f"to back, the second beside `python -c 'while True: pass'`. {quiet['prompts']} prompts, "
        f"{quiet['plan_runs']} planned runs, {quiet['repeats']} repeats, {quiet['threads']} thread(s), "
        f"timer: {quiet['timer']}. Load average (1 min) before the runs: {quiet_load:.1f} and {busy_load:.1f} "
        f"(the box is shared with other work; the busy run adds one spinning core). Stage time: {quiet_s:.0f} s and "
        f"{busy_s:.0f} s.", "",
        f"Worst relative difference between the runs over {summary['methods']} (set, method) pairs, all domains "
        f"pooled: counted speedup {summary['worst']['counted']:.1%} ({summary['within']['counted']} within 2%), "
        f"timed speedup {summary['worst']['timed']:.1%} ({summary['within']['timed']} within 10%). "
        f"Eq. 3.1 cost fit R^2 (robust times): {fb and fa['r2']} quiet, {fb and fb['r2']} busy (on wall time: "
        f"{fa['wall_r2']} and {fb['wall_r2']}). Calibrated v({k}): {ca['v'][k]} and {cb['v'][k]}; "
        f"t_target (1 token): {ca['target_ms']['1']} ms and {cb['target_ms']['1']} ms; mean t_draft "
        f"{ca['drafter_mean_ms']} ms and {cb['drafter_mean_ms']} ms.", "",
        *rows, ""])
    publish(text, append=not args.no_append)


if __name__ == "__main__":
    main()
