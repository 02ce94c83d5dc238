"""Issue 71's GPU run, prepared: one command on a lent GPU machine that measures the decoder against the bandwidth
floor, the batch curve to B = 64 with every length rule under CUDA graphs, `predict`'s decisions there, and runs
`make test-gpu`, within one device call (a cold machine's compiles need two: below).

    python3 benchmarks/gpu/gpu_check.py [--out DIR] [--budget-s 540] [--only STEP,...] [--smoke]

On the device machine, after `make gpu-wheels` here (the packages its image lacks, as wheels in .whl/):
    device run: command "PYTHONUNBUFFERED=1 python3 benchmarks/gpu/gpu_check.py --out $OUT", carry [".whl"], timeout 600

Steps, in this order (or in --only's), each a subprocess with its share of what is left of --budget-s (one that
overruns is stopped, its log kept, and the next one runs). The benchmarks profile each B's cost table right before
its decodes (--profile-each-batch) and print each B's rows as they finish, so a B = 64 whose CUDA graphs do not fit
leaves B = 1..16 in the log:
  install   the project (pip, no dependencies, no network) and the carried wheels into a scratch site directory
  floor     bench_gpu_floor.py: the copy bandwidth; the ~1B bf16 target's batch-1 step under CUDA graphs against
            weight bytes / bandwidth (goal: within 1.5x)
  test-gpu  make test-gpu with this interpreter
  predict   bench_predict.py on the ~1B pair (its first layer as drafter, c about 0.1), CUDA graphs, B = 1, 4, 16,
            64, fixed K in {1, 2, 4, 8}: predicted against measured, and the K predict chooses against the measured
            best (--decisions)
  curve     bench_batch_decoder.py part (b) on the same pair: AR, fixed K, SpecDec++ (an untrained head: its stops
            cost what a trained one's do), the batch-aware rule and the global verify budget (a cost table
            profiled there), at B = 1, 4, 16, 64 (--methods core: the rules the issue names, fewer graphs)
Each benchmark rewrites its own GPU section of benchmarks/gpu/RESULTS.md ("<script> (GPU)", device, torch and CUDA
named); the run copies RESULTS.md, every step's log and summary.md (each step's exit code and seconds) into --out.
Copy the GPU sections back here by hand (only they differ from the tree that was sent).

The first run (H200, 2026-11-29) found a cold compile and capture of the ~1B target at 35 s a graph, and every step
ended at its share (RESULTS.md, bench_gpu_floor.py (GPU)). Since: shapes compile as automatic dynamic ones (a
later batch size compiles nothing new: decoding/compilation.py), the floor's AR decode reuses its step's graph,
and the curve runs --methods core. Still, a cold curve compiles its graphs twice (B = 1, whose sizes stay
specialized, then B = 4, which makes them symbolic; later sizes compile nothing: bench_compile_shapes.py): by an
estimate from the 35 s a target graph took, some 400 s, more than one call leaves it beside test-gpu and predict
(not measured). The
floor is measured; a next lease (15 minutes; a start took ~35 s here) runs the rest in two calls, the second
within the machine's 30 s warm window, so it finds the first call's inductor cache:
    device run: "PYTHONUNBUFFERED=1 python3 benchmarks/gpu/gpu_check.py --only curve,predict --out $OUT" (timeout 600)
    device run: "PYTHONUNBUFFERED=1 python3 benchmarks/gpu/gpu_check.py --only test-gpu --budget-s 200 --out $OUT"

Without CUDA it stops at once: one line, exit 2. --smoke runs every step but test-gpu on this CPU instead, at the
demo shape, eager, B = 1 and 2, a few tokens, RESULTS.md left alone: the steps proven before GPU time is spent.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository: benchmarks.harness

from benchmarks.harness.machine import cuda_in  # noqa: E402  (asked in a subprocess: this driver imports no torch)

GPU_PAGE = pathlib.Path(__file__).resolve().with_name("RESULTS.md")  # every step's GPU section goes to this folder's page
SITE = pathlib.Path("/tmp/specdraft-site")  # the device machine's scratch site directory (it starts bare)

# (step, share of the budget, command after the interpreter); GPU figures: the ~1B pair in bf16 under CUDA graphs
GPU_PAIR = ["--shape", "1b", "--dtype", "bfloat16", "--device", "cuda"]
STEPS = [
    ("floor", 0.15, ["benchmarks/gpu/bench_gpu_floor.py", "--section", "bench_gpu_floor.py (GPU)"]),
    ("test-gpu", 0.2, None),  # make test-gpu
    ("predict", 0.25, ["benchmarks/predict/bench_predict.py", *GPU_PAIR, "--compile", "reduce-overhead",
                       "--batch-sizes", "1,4,16,64", "--ks", "1,2,4,8", "--decisions", "--profile-each-batch", "--runs", "2",
                       "--max-new-tokens", "32", "--section", "bench_predict.py (GPU)", "--page", str(GPU_PAGE)]),
    ("curve", 0.4, ["benchmarks/decoder/bench_batch_decoder.py", *GPU_PAIR, "--compile", "reduce-overhead", "--skip", "a,c",
                    "--compiled-batch-sizes", "1,4,16,64", "--compiled-ks", "1,2,4,8", "--goal-ks", "1,2,4,8",
                    "--batch-sizes", "1,4,16,64", "--n-prompts", "4", "--max-new-tokens", "32", "--runs", "2",
                    "--profile-each-batch", "--methods", "core",
                    "--section", "bench_batch_decoder.py (GPU)", "--page", str(GPU_PAGE)]),
]
# --smoke: the same scripts on this CPU, small and eager, printing only
SMOKE = {
    "floor": ["benchmarks/gpu/bench_gpu_floor.py", "--device", "cpu", "--shape", "demo", "--dtype", "float32",
              "--compile", "none", "--copy-mib", "16", "--steps", "5", "--tokens", "8", "--no-append"],
    "predict": ["benchmarks/predict/bench_predict.py", "--batch-sizes", "1,2", "--ks", "1,2", "--decisions", "--runs", "1",
                "--profile-each-batch",
                "--max-new-tokens", "8", "--no-append"],
    "curve": ["benchmarks/decoder/bench_batch_decoder.py", "--skip", "a,c", "--batch-sizes", "1,2", "--ks", "1,2",
              "--goal-ks", "1,2", "--k-max", "2", "--n-prompts", "2", "--max-new-tokens", "8", "--runs", "1",
              "--profile-each-batch", "--methods", "core",
              "--no-append"],
}


def install(python: str, log) -> int:
    """The project and the carried wheels into SITE, offline, no dependencies (the image has the rest)."""
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    pip = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(SITE)]
    for cmd in ([*pip, "--no-build-isolation", str(ROOT)], [*pip, *wheels] if wheels else None):
        if cmd and subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode:
            return 1
    return 0


def run_step(cmd: list[str], limit: float, log, env: dict) -> int:
    """`cmd` with at most `limit` seconds; its exit code, or 124 when stopped at the limit (as timeout(1))."""
    try:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
    except FileNotFoundError as err:  # e.g. no make on the machine: the step fails, the run goes on
        log.write(f"{err}\n")
        return 127
    try:
        return proc.wait(timeout=max(1.0, limit))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the whole group: pytest's workers, compile workers
        proc.wait()
        return 124


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/gpu_check"),
                    help="where the logs, summary.md and RESULTS.md go (default: $OUT, else runs/gpu_check)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="seconds for every step together (9 minutes)")
    ap.add_argument("--only", help="comma-separated steps to run, in that order, the others skipped (default: every "
                    "step: " + ", ".join(name for name, _, _ in STEPS) + ")")
    ap.add_argument("--smoke", action="store_true", help="every step but test-gpu on this CPU, small, printing only")
    args = ap.parse_args(argv)
    python = sys.executable
    only = args.only.split(",") if args.only else [name for name, _, _ in STEPS]
    unknown = sorted(set(only) - {name for name, _, _ in STEPS})
    if unknown:
        ap.error(f"--only {args.only}: no step named {', '.join(unknown)}; give some of "
                 + ", ".join(name for name, _, _ in STEPS))
    if not args.smoke and not cuda_in(python):
        print(f"gpu_check.py: {python}'s torch sees no CUDA device; run it on the GPU machine (see the module "
              "docstring), or give --smoke to prove the steps on this CPU", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    deadline = time.monotonic() + args.budget_s
    summary = ["| step | exit code | seconds |", "| --- | ---: | ---: |"]
    if not args.smoke:
        with open(out / "install.log", "w") as log:
            start = time.monotonic()
            code = install(python, log)
            summary.append(f"| install | {code} | {time.monotonic() - start:.0f} |")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH")]))
    # in --only's order: a rerun puts first the step whose figures matter most (each step's share is of what is left)
    by_name = {name: (share, cmd) for name, share, cmd in STEPS}
    steps = [(name, by_name[name][0], SMOKE[name] if args.smoke else by_name[name][1]) for name in only
             if not (args.smoke and name == "test-gpu")]
    for i, (name, share, cmd) in enumerate(steps):
        # each step's share of what is left, so time a step did not use goes to the later ones
        left = deadline - time.monotonic()
        limit = left * share / sum(s for _, s, _ in steps[i:])
        full = ["make", "test-gpu", f"GPU_PY={python}"] if cmd is None else [python, *cmd]
        start = time.monotonic()
        with open(out / f"{name}.log", "w") as log:
            log.write(f"$ {' '.join(full)}  (limit {limit:.0f} s)\n")
            log.flush()
            code = run_step(full, limit, log, env)
        summary.append(f"| {name} | {code}{' (stopped at its limit)' if code == 124 else ''} | "
                       f"{time.monotonic() - start:.0f} |")
        print(summary[-1], flush=True)
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    if not args.smoke:
        shutil.copy(GPU_PAGE, out / "RESULTS.md")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
