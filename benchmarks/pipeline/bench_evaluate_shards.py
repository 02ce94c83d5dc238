"""Wall time of the evaluate stage run whole and in N shards on this machine, with the same counts.

    python benchmarks/pipeline/bench_evaluate_shards.py runs/demo [--config configs/demo.yaml] [--shards 1,2] [--no-append]

For each N it copies the finished run (every stage's output but the report) into a temporary root and
starts N `specdraft evaluate CONFIG --shard i/N` processes at once; the shard that finishes last merges
the records into the report (so the merge is inside the slowest shard's time, not timed apart). It
reports the wall time until every process has exited, each shard's own wall time, and whether every
run's counts (N, N_target, N_draft, N_discarded) equal those of the N = 1 run. Counts are exact; times
are wall clock on a shared machine: one run each, so read differences under ~10% as noise.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from benchmarks.harness.publish import publish  # noqa: E402

COUNTS = ("N", "N_target", "N_draft", "N_discarded")
IDENTITY = ("set", "domain", "prompt", "family", "drafter", "policy", "k", "mode", "bandit", "router", "params")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_root", help="a finished run's root (e.g. runs/demo after make demo)")
    p.add_argument("--config", default="configs/demo.yaml")
    p.add_argument("--shards", default="1,2", help="comma-separated shard counts; the first is the reference")
    p.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md as it is")
    args = p.parse_args(argv)
    try:
        args.shards = [int(n) for n in args.shards.split(",")]
    except ValueError:
        p.error(f"--shards {args.shards!r}: give shard counts like 1,2")
    if not args.shards or min(args.shards) < 1:
        p.error("--shards: every shard count must be >= 1")
    if not (Path(args.run_root) / "bundle" / "bundle.json").is_file():
        p.error(f"{args.run_root} holds no exported bundle (bundle/bundle.json): run make demo first")
    return args


def counts_by_run(report: Path) -> dict[tuple, tuple]:
    runs = json.loads((report / "metrics.json").read_text())["runs"]
    return {tuple(json.dumps(r.get(k), sort_keys=True) for k in IDENTITY): tuple(r[c] for c in COUNTS) for r in runs}


def evaluate_in_shards(run_root: Path, config: str, n: int, scratch: Path) -> dict:
    root = scratch / f"shards{n}"
    shutil.copytree(run_root, root, ignore=shutil.ignore_patterns("report", ".work", "reproduce"), symlinks=True)
    cmd = [sys.executable, "-m", "specdraft.pipelines.cli", "evaluate", config, f"run.root={root}"]
    logs = [open(root / f"shard{i}.log", "w") for i in range(n)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd + (["--shard", f"{i}/{n}"] if n > 1 else []), stdout=logs[i],
                              stderr=subprocess.STDOUT) for i in range(n)]
    ends = [None] * n
    while any(e is None for e in ends):
        for i, p in enumerate(procs):
            if ends[i] is None and p.poll() is not None:
                ends[i] = time.perf_counter() - t0
        time.sleep(0.2)
    for f in logs:
        f.close()
    bad = [i for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        tail = (root / f"shard{bad[0]}.log").read_text()[-2000:]
        raise SystemExit(f"shard {bad[0]}/{n} exited {procs[bad[0]].returncode}:\n{tail}")
    return {"n": n, "wall": max(ends), "shards": ends, "counts": counts_by_run(root / "report")}


def main(argv=None) -> None:
    args = parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_shards_") as tmp:
        for n in args.shards:
            print(f"[bench] evaluate in {n} shard(s) ...", flush=True)
            results.append(evaluate_in_shards(Path(args.run_root), args.config, n, Path(tmp)))
    ref = results[0]
    lines = [f"### evaluate whole and in shards ({time.strftime('%Y-%m-%d')}, {platform.machine()} "
             f"{platform.processor() or ''}, {os.cpu_count()} cores)".replace(" ,", ","), "",
             f"`python benchmarks/pipeline/bench_evaluate_shards.py {args.run_root} --config {args.config} "
             f"--shards {','.join(map(str, args.shards))}`: the demo plan, N processes started at once; the "
             "last to finish merges the report (its time includes the merge).", "",
             "| shards | wall s (all done, merged) | each shard's wall s | runs | counts equal to N = "
             f"{ref['n']} |", "| ---: | ---: | --- | ---: | --- |"]
    for r in results:
        same = sum(r["counts"].get(k) == v for k, v in ref["counts"].items())
        lines.append(f"| {r['n']} | {r['wall']:.1f} | {', '.join(f'{s:.1f}' for s in r['shards'])} | "
                     f"{len(r['counts'])} | {same} of {len(ref['counts'])} |")
    lines += ["", f"Speedup of the wall time over N = {ref['n']}: " +
              ", ".join(f"N = {r['n']}: {ref['wall'] / r['wall']:.2f}x" for r in results[1:]) + "."]
    publish("\n".join(lines), write=not args.no_append)


if __name__ == "__main__":
    main()
