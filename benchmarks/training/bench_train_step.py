"""Tokens per second of one training step of the demo target at several batch sizes.

On a CPU the deep, narrow target's step time does not grow in proportion to the batch, so a smaller batch
can take more optimizer steps from the same tokens at about the same speed; this measures it. The model is
built from the config's `pretrain_target.model` with the tokenizer's vocabulary size (random weights: a
step's cost does not depend on them), then, per batch size and round, one warm-up step and `--steps` timed
AdamW steps on random tokens of `seq_len`. Rounds visit the batch sizes in turn, so a slow phase of a shared
box hits them all; the table gives each size's median and range over rounds.

    python benchmarks/training/bench_train_step.py [--config configs/demo.yaml] [--batches 16 8 4 2] [--steps 4]
        [--rounds 3] [--threads 2] [--no-append]
"""
from __future__ import annotations

import argparse
import datetime
import pathlib
import platform
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.drafters.model import build_causal_lm  # noqa: E402
from specdraft.pipelines.config import load_config  # noqa: E402
from specdraft.pipelines.schema import RunConfig  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 8, 4, 2])
    ap.add_argument("--steps", type=int, default=4, help="timed steps per batch size and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the demo's stages use the box's cores)")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)
    if min(args.batches) <= 0 or args.steps <= 0 or args.rounds <= 0:
        ap.error("--batches, --steps and --rounds must be positive")
    return args


def table(seq_len: int, rates: dict[int, list[float]]) -> str:
    """rates: batch -> tokens/s per round."""
    lines = [f"| batch x {seq_len} | s / step (median) | tokens / s (median) | tokens / s (range over rounds) |",
             "| ---: | ---: | ---: | --- |"]
    for b, r in rates.items():
        med = statistics.median(r)
        lines.append(f"| {b} | {b * seq_len / med:.3f} | {med:,.0f} | {min(r):,.0f}-{max(r):,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_config(RunConfig, args.config, [])
    pt = cfg.pretrain_target
    model = build_causal_lm(pt.model, pt.tokenizer.vocab_size, seed=cfg.run.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=pt.lr)
    gen = torch.Generator().manual_seed(cfg.run.seed)

    def step(x: torch.Tensor) -> None:
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    rates: dict[int, list[float]] = {b: [] for b in args.batches}
    for _ in range(args.rounds):
        for b in args.batches:
            x = torch.randint(0, pt.tokenizer.vocab_size, (b, pt.seq_len), generator=gen)
            step(x)  # warm-up: allocator and kernels for this shape
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(x)
            rates[b].append(b * pt.seq_len * args.steps / (time.perf_counter() - t0))
    m = pt.model
    text = "\n".join([
        f"## Training step of the demo target per batch size ({datetime.date.today()}, {platform.machine()}, "
        f"{args.threads} torch thread(s))", "",
        f"`python benchmarks/training/bench_train_step.py {' '.join(argv if argv is not None else sys.argv[1:])}`: "
        f"{args.config}'s target ({m.n_layers} x {m.hidden}, vocab {pt.tokenizer.vocab_size}), AdamW, "
        f"{args.steps} timed steps after one warm-up per batch size and round, {args.rounds} rounds interleaved.",
        "", table(pt.seq_len, rates), ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
