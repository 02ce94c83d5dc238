"""The drafter/target cost ratio c and the (K+1)-token verify cost v, per target shape, on this CPU.

Why c depends on the target's shape: on a CPU a cached single-token forward of a small Llama
costs about a fixed amount per layer whatever the width, so c = t_draft / t_target is set mostly by the
ratio of depths. Random weights (the cost does not depend on them), the demo vocabulary (2048), the demo
drafter (1 layer x 128), context 120 tokens, K = 4, one thread unless --threads.

The costs are the evaluate stage's own calibration (`decoding.costs.calibration.calibrate`: process CPU time, 10%
quantile over interleaved passes), with the drafter timed two ways after each target forward: one lone
forward (how the calibration priced a drafted token before 2026-11-23) and a run of K forwards, as a round
drafts (how it does now). Only the first forward after the target's finds the drafter's weights evicted
from the CPU caches, so the lone forward overstates the cost of a drafted token. Each repeat measures every
shape once; the table gives the median over repeats and the min-max spread.

    python benchmarks/predict/bench_forward_costs.py [--repeats 3] [--passes 30] [--threads 1] [--no-append]
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.drafters.model import CausalLMConfig, build_causal_lm, preset  # noqa: E402
from specdraft.decoding.costs.calibration import calibrate  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

VOCAB = 2048
CONTEXT = 120
SHAPES = {  # name -> (layers, hidden, heads, MLP width)
    "6 x 192 (demo target)": (6, 192, 6, 512),
    "12 x 128": (12, 128, 4, 352),
    "16 x 128": (16, 128, 4, 352),
    "20 x 128": (20, 128, 4, 352),
    "24 x 96": (24, 96, 4, 256),
}


def measure(target, drafter, k: int, passes: int, seed: int) -> dict[str, float]:
    """ms per token of the target, per drafted token (lone forward / run of k), and v(k)."""
    lone = calibrate(target, {"d": drafter}, k + 1, CONTEXT, passes, "cpu", seed, draft_run=1)
    run = calibrate(target, {"d": drafter}, k + 1, CONTEXT, passes, "cpu", seed, draft_run=k)
    t_target = statistics.mean([lone.target(1), run.target(1)])
    return {"target": t_target * 1e3, "lone": lone.drafter_s["d"] * 1e3, "run": run.drafter_s["d"] * 1e3,
            "c_lone": lone.drafter_s["d"] / t_target, "c_run": run.drafter_s["d"] / t_target, "v": run.v(k)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--passes", type=int, default=30, help="calibration passes per shape and repeat")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    drafter = build_causal_lm(preset("demo-drafter", n_layers=1), VOCAB).eval()  # configs/demo.yaml's drafter
    targets = {name: build_causal_lm(CausalLMConfig(L, H, nh, I, 512, True), VOCAB).eval()
               for name, (L, H, nh, I) in SHAPES.items()}
    runs: dict[str, list[dict]] = {name: [] for name in SHAPES}
    for r in range(args.repeats):
        for name, target in targets.items():
            runs[name].append(measure(target, drafter, args.k, args.passes, seed=r))

    def cell(rs: list[dict], key: str) -> str:
        xs = [x[key] for x in rs]
        return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"

    rows = []
    for name, rs in runs.items():
        params = sum(p.numel() for p in {id(p): p for p in targets[name].parameters()}.values())
        rows.append(f"| {name} | {params / 1e6:.2f}M | " + " | ".join(
            cell(rs, key) for key in ("target", "lone", "run", "c_lone", "c_run", "v")) + " |")
    text = "\n".join([
        f"## Forward costs per target shape, as the evaluate stage calibrates them ({datetime.date.today()})", "",
        f"`python benchmarks/predict/bench_forward_costs.py --repeats {args.repeats} --passes {args.passes} --threads "
        f"{args.threads}`: this CPU box, cached forwards after {CONTEXT} tokens, drafter 1 x 128, K = {args.k}, "
        f"{args.threads} thread(s); process CPU time, 10% quantile over {args.passes} interleaved passes "
        f"(decoding.costs.calibration.calibrate); median over {args.repeats} repeats (min-max). Drafter per drafted token: "
        f"one lone forward after a target forward, or a run of {args.k} forwards after it (a round).", "",
        "| target | params | target ms/token | drafter ms, lone forward | drafter ms/token, run of K "
        "| c (lone) | c (run of K) | v(K) |",
        "|---|---|---|---|---|---|---|---|", *rows, ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
