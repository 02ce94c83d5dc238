"""`specdraft predict`'s acceptance side against counting, no clock: the MAT (tokens per row per target call) that
`predict_throughput` simulates for fixed K and SpecDec++ beside the MAT the batched decoder counts decoding the same
prompts, at every B, on `make real`'s pair (or any bundle).

    python benchmarks/predict/bench_predict_mat.py [--run runs/real] [--seeds 5] [bench_predict.py options]

The acceptance summary is bench_predict.py's: for each decoded prompt, whether the drafter's greedy token agrees
with the target's greedy continuation at each position (P_i in {0, 1}) and the head's sigma there. The simulation
runs static batches of `--rounds` (bench_predict.py's default 40, rounded up to whole passes over the prompts) from
each of `--seeds` seeds; the decoder runs the prompts once in consecutive batches of B. A fixed K's and SpecDec++'s
rounds do not read the cost table (each row's length is its own cap, its drafts' agreement and its head), so a flat
table prices them here; the batch-aware rule, whose lengths do read it, is left to bench_predict.py. Defaults as
bench_predict_real.py's: 16 test prompts, 16 new tokens, B = 1, 2, 4, 8, 16, K in {1, 2, 4, 8}; a few minutes.
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from benchmarks.predict import bench_predict  # noqa: E402
from benchmarks.predict.bench_predict_real import real_argv  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402
from specdraft.decoding.costs.model import CostTable  # noqa: E402
from specdraft.decoding.costs.throughput import FIXED_KS  # noqa: E402


def flat_table(batch_sizes: list[int], k_max: int) -> CostTable:
    """A table that prices every step alike: the MAT of the rules measured here does not read it."""
    widths = tuple(range(1, k_max + 2))
    return CostTable(batch_sizes=tuple(batch_sizes), widths=widths, verify=tuple((1.0,) * len(widths) for _ in batch_sizes),
                     draft=(0.1,) * len(batch_sizes), catchup=(0.1,) * len(batch_sizes), device="flat (unpriced)",
                     torch_version=torch.__version__, compile="none", target_id="-", drafter_id="-")


def counted_mat(fn, groups) -> float:
    """Tokens over target calls, pooled over every row of every batch."""
    out = [r for g in groups for r in fn(g, 0)]
    return sum(len(r.tokens) for r in out) / sum(r.metrics.n_target for r in out)


def batch_size_rows(s, table: CostTable, fns: dict, names: list[str], b: int, seeds: int) -> tuple[list[str], float]:
    """The table rows at batch size b and their worst |predicted / counted - 1| over the seeds."""
    groups = [s.prompts[i:i + b] for i in range(0, len(s.prompts), b)]
    predicted = [bench_predict.predicted_at(s, table, groups, b, seed=seed) for seed in range(seeds)]
    rows, worst = [], 0.0
    for name in names:
        counted = counted_mat(fns[name], groups)
        p = [by_method[name]["mat"] for by_method in predicted]
        err = max((x / counted - 1 for x in p), key=abs)
        worst = max(worst, abs(err))
        rows.append(f"| {name} | {b} | {p[0]:.4f} | {min(p):.4f}-{max(p):.4f} | {counted:.4f} | {err:+.2%} |")
    return rows, worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/real", help="a finished make real run (its bundle and test prompts)")
    parser.add_argument("--seeds", type=int, default=5, help="simulation seeds (the spread of the prediction)")
    args, rest = parser.parse_known_args(argv)
    run = pathlib.Path(args.run)
    if not (run / "bundle" / "bundle.json").is_file() or not (run / "prompts" / "sets").is_dir():
        parser.error(f"{run} holds no exported bundle and test prompts; run `make real` first (or give --run)")
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    ap = bench_predict.build_parser()
    bargs = ap.parse_args(real_argv(run, rest))
    torch.set_num_threads(bargs.threads)
    sizes = bargs.sizes = [int(x) for x in bargs.batch_sizes.split(",")]
    ks = [int(x) for x in bargs.ks.split(",")]
    if not set(ks) <= set(FIXED_KS):
        parser.error(f"--ks {bargs.ks}: the prediction simulates fixed K in {', '.join(map(str, FIXED_KS))}; choose among them")
    target, drafter, head, prior, prompts, pair, eos = bench_predict.load_pair(ap, bargs)
    s, agree = bench_predict.prepare(bargs, ks, target, drafter, head, prior, prompts, eos)
    table = flat_table(sorted({1, *sizes}), s.k_max)
    fns = bench_predict.methods(s, table)
    names = [f"K={k}" for k in ks] + (["SpecDec++"] if head is not None else [])
    lines = [f"## Predicted vs counted MAT ({datetime.date.today()}, torch {torch.__version__})", "",
             f"`{' '.join(['python benchmarks/predict/bench_predict_mat.py', *(argv if argv is not None else sys.argv[1:])])}`; {pair}; "
             f"mean greedy agreement {float(torch.cat(agree).mean()):.3f}; the first {max(sizes)} prompts, "
             f"{bargs.max_new_tokens} new tokens; predicted: {bargs.rounds} static batches (rounded up to whole passes) "
             f"from each of seeds 0..{args.seeds - 1}; counted: the prompts decoded once in consecutive batches of B.", "",
             "| method | B | predicted MAT, seed 0 | predicted, min-max over seeds | counted MAT | predicted / counted - 1, "
             "worst seed |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    worst = 0.0
    for b in sizes:
        rows, err = batch_size_rows(s, table, fns, names, b, args.seeds)
        worst = max(worst, err)
        lines += rows
        print("\n".join(rows), flush=True)
    lines += ["", f"Worst |predicted / counted - 1| over every method, B and seed: {worst:.2%}."]
    publish("\n".join(lines), write=not bargs.no_append, script=pathlib.Path(__file__).name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
