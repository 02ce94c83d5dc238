"""The drafter/target cost ratio c and the (K+1)-token verify cost v, per target shape, on this CPU.

Why the demo target is deep and narrow (issue 22): on a CPU a cached single-token forward of a small
Llama costs about a fixed amount per layer whatever the width, so c = t_draft / t_target is set by the
ratio of depths. Random weights (the cost does not depend on them), the demo vocabulary (2048), the
demo drafter (1 layer x 128), context 120 tokens, K = 4, one thread unless --threads. Each repeat
measures every shape once (interleaved, `pipelines.forward_costs.measure_forward_costs`); the table
gives the median over repeats and the min-max spread, in wall time and in process CPU time (a busy
shared machine inflates wall time far more than CPU time).

    python benchmarks/bench_forward_costs.py [--repeats 3] [--reps 30] [--threads 1] [--no-append]
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from drafters.model import CausalLMConfig, build_causal_lm, preset  # noqa: E402
from pipelines.forward_costs import measure_forward_costs  # noqa: E402
from publish import publish  # noqa: E402  (benchmarks/publish.py)

VOCAB = 2048
SHAPES = {  # name -> (layers, hidden, heads, MLP width); 6 x 192 is the earlier demo target
    "6 x 192 (earlier demo target)": (6, 192, 6, 512),
    "12 x 128": (12, 128, 4, 352),
    "16 x 128 (demo target)": (16, 128, 4, 352),
    "20 x 128": (20, 128, 4, 352),
    "24 x 96": (24, 96, 4, 256),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30, help="timed calls per kind and repeat")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    drafter = build_causal_lm(preset("demo-drafter"), VOCAB).eval()
    targets = {name: build_causal_lm(CausalLMConfig(L, H, nh, I, 512, True), VOCAB).eval()
               for name, (L, H, nh, I) in SHAPES.items()}
    runs: dict[str, list[dict]] = {name: [] for name in SHAPES}
    for r in range(args.repeats):
        for name, target in targets.items():
            runs[name].append(measure_forward_costs(target, drafter, args.k, context=120, reps=args.reps, seed=r))

    def cell(xs: list[float]) -> str:
        return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"

    rows = []
    for name, rs in runs.items():
        params = sum(p.numel() for p in {id(p): p for p in targets[name].parameters()}.values())
        rows.append(f"| {name} | {params / 1e6:.2f}M | {cell([x['cpu_ms']['target'] for x in rs])} | "
                    f"{cell([x['cpu_ms']['drafter'] for x in rs])} | {cell([x['c_cpu'] for x in rs])} | "
                    f"{cell([x['v_cpu'] for x in rs])} | {cell([x['t_target_ms'] for x in rs])} | "
                    f"{cell([x['c'] for x in rs])} | {cell([x['v'] for x in rs])} |")
    text = "\n".join([
        f"## Forward costs per target shape ({datetime.date.today()})", "",
        f"`python benchmarks/bench_forward_costs.py --repeats {args.repeats} --reps {args.reps} --threads "
        f"{args.threads}`: cached forwards after 120 tokens, drafter 1 x 128, K = {args.k}, {args.threads} thread(s); "
        f"median over {args.repeats} interleaved repeats (min-max).", "",
        "| target | params | target CPU ms/token | drafter CPU ms/token | c (CPU) | v (CPU) | target wall ms/token "
        "| c (wall) | v (wall) |",
        "|---|---|---|---|---|---|---|---|---|", *rows, ""])
    publish(text, append=not args.no_append)


if __name__ == "__main__":
    main()
