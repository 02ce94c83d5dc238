"""Wall time of a stage in one process against `processes: N` on this machine, with the same output bytes.

    python benchmarks/pipeline/bench_stage_processes.py runs/demo [--config configs/demo.yaml]
        [--stages distill-data,train-heads] [--processes 1,2] [--runs 2] [--no-append]

For each stage it copies the finished run's inputs (every stage's output but this one's) into a temporary
root and runs `specdraft STAGE CONFIG run.root=ROOT SECTION.processes=N` for each N, the Ns of one run taking
turns (the order alternates between runs, so a drift of the box's speed falls on both). It reports each N's
wall time per run (the command, start to exit: loading included) and whether the output's content hash
equals the first N's: the stages seed every batch by its piece of work, so N processes must write the same
bytes as one. Wall clock on a shared machine: read differences within the runs' spread as noise.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from benchmarks.harness.publish import publish  # noqa: E402

# stage -> (its output directory under the run root, the config section that holds its `processes`)
STAGES = {"distill-data": ("distill_data", "distill_data"), "train-heads": ("heads", "train_heads")}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_root", help="a finished run's root (e.g. runs/demo after make demo)")
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--stages", default="distill-data,train-heads", help=f"comma-separated, of {', '.join(STAGES)}")
    p.add_argument("--processes", default="1,2", help="comma-separated process counts; the first is the reference")
    p.add_argument("--runs", type=int, default=2, help="runs of each process count per stage (interleaved)")
    p.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md as it is")
    args = p.parse_args(argv)
    args.stages = args.stages.split(",")
    unknown = [s for s in args.stages if s not in STAGES]
    if unknown:
        p.error(f"--stages: unknown stage {unknown[0]!r}; use {', '.join(STAGES)}")
    try:
        args.processes = [int(n) for n in args.processes.split(",")]
    except ValueError:
        p.error(f"--processes {args.processes!r}: give process counts like 1,2")
    if not args.processes or min(args.processes) < 1 or args.runs < 1:
        p.error("--processes: every count must be >= 1, and --runs >= 1")
    missing = [s for s in args.stages if not (Path(args.run_root) / STAGES[s][0] / "manifest.json").is_file()]
    if missing:
        p.error(f"{args.run_root} has no finished {missing[0]} output: run make demo first")
    return args


def run_stage_once(run_root: Path, config: str, stage: str, n: int, scratch: Path) -> dict:
    """The stage in a copy of the run without its output, in n processes: wall seconds and content hash."""
    out_dir, section = STAGES[stage]
    root = scratch / f"{stage}-{n}"
    shutil.copytree(run_root, root, symlinks=True,
                    ignore=shutil.ignore_patterns(out_dir, ".work", "report", "bundle", "reproduce"))
    cmd = [sys.executable, "-m", "specdraft.pipelines.cli", stage, config, f"run.root={root}",
           f"{section}.processes={n}"]
    log = root / "stage.log"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"{stage} in {n} process(es) exited {code}:\n{log.read_text()[-2000:]}")
    content = json.loads((root / out_dir / "manifest.json").read_text())["content_hash"]
    shutil.rmtree(root)
    return {"wall": wall, "content_hash": content}


def measure(args) -> dict[str, dict[int, list[dict]]]:
    """stage -> N -> one result per run, the Ns of a run in turns (reversed every other run)."""
    results = {s: {n: [] for n in args.processes} for s in args.stages}
    with tempfile.TemporaryDirectory(prefix="bench_processes_") as tmp:
        for stage in args.stages:
            for r in range(args.runs):
                for n in args.processes if r % 2 == 0 else args.processes[::-1]:
                    print(f"[bench] {stage}, run {r + 1}/{args.runs}, {n} process(es) ...", flush=True)
                    results[stage][n].append(run_stage_once(Path(args.run_root), args.config, stage, n, Path(tmp)))
    return results


def table(args, results) -> str:
    ref_n = args.processes[0]
    lines = [f"### stages in one process and in N ({time.strftime('%Y-%m-%d')}, {platform.machine()} "
             f"{platform.processor() or ''}, {os.cpu_count()} cores)".replace(" ,", ","), "",
             f"`python benchmarks/pipeline/bench_stage_processes.py {args.run_root} --config {args.config} --stages "
             f"{','.join(args.stages)} --processes {','.join(map(str, args.processes))} --runs {args.runs}`: "
             "each stage redone from the finished run's inputs, the process counts taking turns; wall time of the "
             "command (loading included).", "",
             f"| stage | processes | wall s per run | median | speedup over N = {ref_n} (median) | "
             f"output bytes equal to N = {ref_n} |", "| --- | ---: | --- | ---: | ---: | --- |"]
    for stage, by_n in results.items():
        ref = by_n[ref_n]
        for n, runs in by_n.items():
            walls = [r["wall"] for r in runs]
            same = sum(r["content_hash"] == ref[0]["content_hash"] for r in runs)
            lines.append(f"| {stage} | {n} | {', '.join(f'{w:.1f}' for w in walls)} | {statistics.median(walls):.1f} "
                         f"| {statistics.median(r['wall'] for r in ref) / statistics.median(walls):.2f}x "
                         f"| {same} of {len(runs)} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    publish(table(args, measure(args)), write=not args.no_append)


if __name__ == "__main__":
    main()
