"""What a (K+1)-row verify costs against a 1-row step, at the level of the matrix products: fp32 linear layers of
a real target's shapes (SmolLM2-135M: width 576, MLP 1536, vocabulary 49152) applied to 1..9 rows, on this CPU.

Why: speculative decoding assumes the target's forward is bound by reading its weights, so that K + 1 positions
cost about one. On the real pair (bench_real_pair.py) a 5-token verify costs about 2 one-token forwards. This
times the products alone, with no model, cache or decoder around them: a stack of `--layers` distinct weights
(more bytes than the CPU's caches hold, as in a forward) applied in turn to the same input of M rows; the
stacks and row counts take turns within each repeat. One row runs a matrix-vector product; two or more a
matrix-matrix one (the BLAS's choice, not ours).

    python benchmarks/real/bench_matmul_rows.py [--rows 1,2,3,5,9] [--layers 30] [--repeats 15] [--threads 1] [--no-append]
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.core.devices import device_name  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

SHAPES = {  # name -> (in, out, weights in the stack: a real forward's count where it fits in memory)
    "MLP up / gate 576 -> 1536": (576, 1536, None),
    "MLP down 1536 -> 576": (1536, 576, None),
    "LM head 576 -> 49152": (576, 49152, 4),
}


def stack_time(weights: list[torch.Tensor], x: torch.Tensor) -> float:
    """Seconds to apply every weight of the stack to x, one after another."""
    start = time.perf_counter()
    for w in weights:
        torch.nn.functional.linear(x, w)
    return time.perf_counter() - start


def measure(rows: list[int], layers: int, repeats: int, seed: int) -> dict:
    """{(shape, M): [ms per weight, one per repeat]}, every (shape, M) once per repeat, after a warm-up pass."""
    gen = torch.Generator().manual_seed(seed)
    stacks = {name: [torch.randn(o, i, generator=gen) for _ in range(n or layers)] for name, (i, o, n) in SHAPES.items()}
    inputs = {(name, m): torch.randn(m, SHAPES[name][0], generator=gen) for name in SHAPES for m in rows}
    out = {key: [] for key in inputs}
    with torch.inference_mode():
        for rep in range(repeats + 1):
            for (name, m), x in inputs.items():
                ms = stack_time(stacks[name], x) * 1e3 / len(stacks[name])
                if rep:  # the first pass warms every kernel up
                    out[(name, m)].append(ms)
    return out


def table(samples: dict, rows: list[int]) -> list[str]:
    lines = ["| product | " + " | ".join(f"M = {m} ms" for m in rows) + " | " + " | ".join(f"M = {m} / M = 1" for m in rows[1:])
             + " | GB/s at M = 1 |", "| --- |" + " ---: |" * (2 * len(rows))]
    for name, (i, o, _) in SHAPES.items():
        med = {m: statistics.median(samples[(name, m)]) for m in rows}
        spread = {m: (min(samples[(name, m)]), max(samples[(name, m)])) for m in rows}
        cells = [f"{med[m]:.3f} ({spread[m][0]:.3f}-{spread[m][1]:.3f})" for m in rows]
        ratios = [f"{med[m] / med[rows[0]]:.2f}" for m in rows[1:]]
        gbps = i * o * 4 / (med[rows[0]] * 1e-3) / 1e9
        lines.append(f"| {name} | " + " | ".join(cells + ratios) + f" | {gbps:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,2,3,5,9", help="row counts M (the first is the baseline: 1)")
    ap.add_argument("--layers", type=int, default=30, help="weights per stack (SmolLM2-135M has 30 layers)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)
    try:
        rows = [int(m) for m in args.rows.split(",")]
    except ValueError:
        ap.error("--rows takes comma-separated integers")
    if not rows or rows[0] != 1 or min(rows) < 1 or args.layers < 1 or args.repeats < 1:
        ap.error("--rows must start at 1 and hold positive counts; --layers and --repeats must be >= 1")
    torch.set_num_threads(args.threads)
    samples = measure(rows, args.layers, args.repeats, args.seed)
    text = "\n".join([
        f"## fp32 linear layers at M rows ({datetime.date.today()}, {device_name('cpu')}, torch {torch.__version__}, "
        f"{args.threads} thread(s))", "",
        f"`python benchmarks/real/bench_matmul_rows.py --rows {args.rows} --layers {args.layers} --repeats {args.repeats} "
        f"--threads {args.threads}`: ms per weight (median over {args.repeats} repeats, min-max), each weight of a stack "
        f"of {args.layers} (the LM head: {SHAPES['LM head 576 -> 49152'][2]}) applied in turn to the same M rows; "
        "GB/s: the weight's bytes over its 1-row time.", "", *table(samples, rows), ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
