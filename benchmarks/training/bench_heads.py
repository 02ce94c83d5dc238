"""Time training the SpecDec++ head grid (D in 0..4 x w_rej in {1, 3, 6, 12} = 20 heads) on CPU.

Synthetic cached features of demo size (default 100k Y positions, hidden 64, fp16) with soft labels
from a hidden logistic teacher skewed towards acceptance, as real acceptance data is. Measures:
  stacked    all 20 heads in one Lightning run (heads/lit_head.py's default): the full recipe with
             eval and metrics, and 1 epoch on a subset
  separate   one Lightning run per head (20 runs), 1 epoch on the same subset
and prints the best head's eval KL next to the constant predictor's. Writes it as this script's
section of benchmarks/training/RESULTS.md unless --no-write.

    python benchmarks/training/bench_heads.py [--positions 100000] [--hidden 64] [--epochs 3] [--no-write]
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.heads.lit_head import DEPTHS, W_REJS, HeadSpec, HeadTrainConfig, train_head_grid, train_heads  # noqa: E402
from specdraft.heads.metrics import constant_baseline  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402


def synthetic(m: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.randn(hidden, generator=torch.Generator().manual_seed(1234)) / hidden**0.5  # one teacher for all splits
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(m, hidden, generator=g)
    labels = torch.sigmoid(2.5 * feats @ w + 1.5 + 0.5 * torch.randn(m, generator=g)).clamp(0, 1)
    return feats.half(), labels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--positions", type=int, default=100_000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--separate-positions", type=int, default=10_000, help="subset for timing separate runs")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    train = synthetic(args.positions, args.hidden, seed=0)
    dev = synthetic(max(args.positions // 10, 1000), args.hidden, seed=1)
    cfg = HeadTrainConfig(epochs=args.epochs)
    steps = args.epochs * -(-args.positions // cfg.batch_size)
    load = os.getloadavg()[0]

    t = time.perf_counter()
    heads = train_head_grid(train, dev, cfg=cfg)
    grid_s = time.perf_counter() - t

    # Same-size comparison on a subset (1 epoch): 20 separate Lightning runs vs one stacked run.
    sub = (train[0][: args.separate_positions], train[1][: args.separate_positions])
    sub_steps = -(-args.separate_positions // cfg.batch_size)
    one_epoch = HeadTrainConfig(epochs=1)
    t = time.perf_counter()
    for spec in (HeadSpec(d, w) for d in DEPTHS for w in W_REJS):
        train_heads(sub, None, [spec], one_epoch)
    sep_s = time.perf_counter() - t
    t = time.perf_counter()
    train_heads(sub, None, [HeadSpec(d, w) for d in DEPTHS for w in W_REJS], one_epoch)
    stacked_sub_s = time.perf_counter() - t

    base = constant_baseline(dev[1])
    best = min(heads, key=lambda h: h.eval_metrics["kl"])
    rows = [
        (f"stacked: 20 heads in 1 run, full recipe incl. eval and metrics ({steps} steps)", grid_s, grid_s / steps),
        (f"stacked: 20 heads in 1 run, {args.separate_positions} positions x 1 epoch", stacked_sub_s,
         stacked_sub_s / sub_steps),
        (f"separate: 20 runs, {args.separate_positions} positions x 1 epoch", sep_s, sep_s / sub_steps),
    ]
    lines = [
        f"## Acceptance-head grid training ({datetime.date.today().isoformat()}, 2-core CPU box)",
        "",
        f"`python benchmarks/training/bench_heads.py --positions {args.positions} --hidden {args.hidden} --epochs {args.epochs}`: "
        f"20 heads (D 0..4 x w_rej 1/3/6/12), {args.positions} cached fp16 positions, batch {cfg.batch_size}, "
        f"{steps} steps per head, torch {torch.__version__}, 1 torch thread; load average at start {load:.1f} "
        "(the box is shared, so times are upper bounds).",
        "",
        "| variant | wall s | ms per training step of all 20 heads (incl. startup) |",
        "| --- | ---: | ---: |",
        *[f"| {name} | {s:.1f} | {1000 * per:.2f} |" for name, s, per in rows],
        "",
        f"Stacking vs separate runs on the same subset: {sep_s / stacked_sub_s:.1f}x faster. Best head {best.spec.name}: eval KL "
        f"{best.eval_metrics['kl']:.4f} vs constant predictor {base['kl']:.4f}; rejection AUROC "
        f"{best.eval_metrics['auroc_reject']:.3f}.",
        "",
    ]
    publish("\n".join(lines), write=not args.no_write)
    print("per head eval KL:", ", ".join(f"{h.spec.name}={h.eval_metrics['kl']:.4f}" for h in heads))


if __name__ == "__main__":
    main()
