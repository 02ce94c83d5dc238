"""A decoder's first start on a fresh machine: `specdraft generate BUNDLE --prompt ...` with an empty cost-table
cache, timed from the command's start to its cost-table line (decoding starts right after) and to its exit;
then two starts launched together on one empty cache, each to its exit (issue 70: the first start decodes
within 30 s, two together finish within 1.5x the time of one).

    python benchmarks/predict/bench_first_start.py [--bundle runs/demo/bundle] [--runs 3]
        [--python new=.venv/bin/python,old=/elsewhere/.venv/bin/python]

--python names interpreters whose installed specdraft to compare (each an editable install of another
checkout, say); their runs take turns, run by run, so a drift in the box's load meets every one alike.
Wall-clock seconds (a start is what a user waits for), median and range over the runs.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from benchmarks.harness.publish import publish  # noqa: E402

PROMPT = "Question: Ava has 12 coins and gets 5 more. How many coins does she have?"
CLI = "import sys; from specdraft.pipelines.cli import main; sys.exit(main(sys.argv[1:]))"


def start(python: str, bundle: str, cache: str) -> subprocess.Popen:
    """One `specdraft generate` start on `cache`, its stderr piped (the cost-table line is read from it)."""
    env = {**os.environ, "SPECDRAFT_COST_CACHE": cache}
    return subprocess.Popen([python, "-c", CLI, "generate", bundle, "--prompt", PROMPT], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait(proc: subprocess.Popen, t0: float) -> tuple[float | None, float]:
    """(seconds to the cost-table line, seconds to exit); a failed start stops the benchmark."""
    table_at = None
    for line in proc.stderr:
        if table_at is None and line.startswith("cost table"):
            table_at = time.perf_counter() - t0
    if proc.wait() != 0:
        raise SystemExit(f"a start failed (exit {proc.returncode}); run it by hand to see why")
    return table_at, time.perf_counter() - t0


def one_run(python: str, bundle: str) -> dict[str, float]:
    """A lone start, then two together, each on an empty cache of its own."""
    with tempfile.TemporaryDirectory() as alone, tempfile.TemporaryDirectory() as shared:
        t0 = time.perf_counter()
        first_decode, exit_alone = wait(start(python, bundle, alone), t0)
        t0 = time.perf_counter()
        pair = [start(python, bundle, shared), start(python, bundle, shared)]
        # both read at once: a pipe left unread while the other is drained would stall its writer (and time it)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            both = [f.result()[1] for f in [pool.submit(wait, p, t0) for p in pair]]
    return {"first decode": first_decode, "one start": exit_alone, "two together (slower)": max(both)}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}..{max(values):.1f})"


def render(results: dict[str, list[dict]], argv: list[str], bundle: str) -> str:
    """The section: per interpreter the medians (ranges) and the ratio two together / one."""
    lines = [f"## First start with an empty cost-table cache ({datetime.date.today()}, this CPU box)", "",
             f"`python benchmarks/predict/bench_first_start.py {' '.join(argv)}`; bundle {bundle}, one prompt, "
             f"{len(next(iter(results.values())))} run(s) per interpreter taking turns; wall seconds, median (range).", "",
             "| specdraft | to the first decode | one start, to exit | two together, the slower to exit | "
             "two / one |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, runs in results.items():
        cols = {k: [r[k] for r in runs] for k in runs[0]}
        ratio = [r["two together (slower)"] / r["one start"] for r in runs]
        lines.append(f"| {name} | {spread(cols['first decode'])} | {spread(cols['one start'])} | "
                     f"{spread(cols['two together (slower)'])} | {spread(ratio)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default="runs/demo/bundle")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--python", default=f"this={sys.executable}", help="NAME=PYTHON[,NAME=PYTHON...]")
    ap.add_argument("--no-append", action="store_true", help="print only; leave RESULTS.md as it is")
    args = ap.parse_args(argv)
    pythons = dict(item.split("=", 1) for item in args.python.split(","))
    results: dict[str, list[dict]] = {name: [] for name in pythons}
    for i in range(args.runs):
        for name, python in pythons.items():
            results[name].append(one_run(python, args.bundle))
            print(f"run {i + 1} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    publish(render(results, argv, args.bundle), write=not args.no_append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
