"""Finetuning a drafter against the target's cached logits vs running the target at every step.

train-drafters distills with forward KL (the demo's `finetune.loss: fkl`): the loss needs the target's
distribution at every trained-on position. Without the cache each step runs the target on its batch; with it
(`train_drafters.finetune.teacher_cache_gb`) the stage runs the target once over the training rows and each
step reads its rows. This times one specialist's finetuning both ways on a finished run root, interleaved
over rounds (a slow phase of a shared box hits both), and checks that both give the same drafter.

    python benchmarks/training/bench_teacher_cache.py RUN_ROOT [--config configs/demo.yaml] [--domain code]
        [--steps 50] [--rounds 3] [--threads 2] [--no-append]

RUN_ROOT holds target/, distill_data/ and drafters/base/ (e.g. runs/demo after `make demo`).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

import torch  # noqa: E402

from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer  # noqa: E402
from specdraft.drafters.data import TEACHER_LOGITS  # noqa: E402
from specdraft.pipelines.config import load_config  # noqa: E402
from specdraft.pipelines.readers import load_distill_data  # noqa: E402
from specdraft.pipelines.schema import RunConfig  # noqa: E402
from specdraft.pipelines.train_drafters import _train, teacher_cache  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", help="a finished run root: target/, distill_data/, drafters/base/")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--domain", default="code", help="the specialist's domain (its distill_data train rows)")
    ap.add_argument("--steps", type=int, default=50, help="optimizer steps per fit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the stage uses the box's cores)")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args(argv)
    if args.steps <= 0 or args.rounds <= 0:
        ap.error("--steps and --rounds must be positive")
    return args


def table(steps: int, seconds: dict[str, list[float]], build_s: float) -> str:
    """seconds: mode -> seconds of one `steps`-step fit per round."""
    lines = [f"| teacher | s per {steps} steps (median) | range over rounds | s / step | vs live |",
             "| --- | ---: | --- | ---: | ---: |"]
    live = statistics.median(seconds["live"])
    for mode, xs in seconds.items():
        med = statistics.median(xs)
        lines.append(f"| {mode} | {med:.2f} | {min(xs):.2f}-{max(xs):.2f} | {med / steps:.4f} | {live / med:.2f}x |")
    lines.append(f"| (cache build, once per stage) | {build_s:.2f} | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    root = pathlib.Path(args.root)
    cfg = load_config(RunConfig, args.config, [])
    phase = cfg.train_drafters.finetune
    tok = load_tokenizer(root / "target")
    target = load_causal_lm(root / "target", "float32")
    rows = [dict(r) for r in load_distill_data(root / "distill_data")["train"] if r["domain"] == args.domain]
    if not rows:
        sys.exit(f"no distill_data train rows of domain {args.domain!r} under {root}")
    t0 = time.perf_counter()
    cached = teacher_cache(target, rows, phase, cfg.train_drafters.alignment_batch_size)
    build_s = time.perf_counter() - t0
    if not cached:
        sys.exit("the rows' logits do not fit train_drafters.finetune.teacher_cache_gb; raise it in --config")
    plain = [{"prompt_ids": r["prompt_ids"], "response_ids": r["response_ids"]} for r in rows]
    examples = {"live": plain, "cached": [{**e, TEACHER_LOGITS: cached[r["id"]]} for e, r in zip(plain, rows)]}

    # the stage's own fit (pipelines.train_drafters._train: its trainer, checkpoints and CSV log) in a fresh work
    # dir per fit, for `--steps` steps; W&B off: its logging is not what is compared
    fit_phase = dataclasses.replace(phase, train=dataclasses.replace(
        phase.train, max_steps=args.steps, wandb=dataclasses.replace(phase.train.wandb, mode="disabled")))

    def fit(mode: str) -> tuple[float, dict[str, torch.Tensor]]:
        model = load_causal_lm(root / "drafters" / "base", "float32").train()
        with tempfile.TemporaryDirectory() as work:
            _, _, timing = _train(model, examples[mode], fit_phase, tok.pad_token_id, cfg.run.seed, Path(work), target)
        return timing["seconds"], model.state_dict()

    seconds: dict[str, list[float]] = {"live": [], "cached": []}
    weights: dict[str, dict[str, torch.Tensor]] = {}
    for r in range(args.rounds):
        for mode in (("live", "cached") if r % 2 == 0 else ("cached", "live")):
            s, weights[mode] = fit(mode)
            seconds[mode].append(s)
    diff = max((weights["live"][k] - weights["cached"][k]).abs().max().item() for k in weights["live"])
    text = "\n".join([
        f"## Drafter finetuning with the target's cached logits vs the live target ({datetime.date.today()}, "
        f"{platform.machine()}, {args.threads} torch thread(s))", "",
        f"`python benchmarks/training/bench_teacher_cache.py {' '.join(argv if argv is not None else sys.argv[1:])}`: "
        f"the {args.domain} specialist ({len(rows)} rows, loss {phase.loss}, batch {phase.train.batch_size}) from "
        f"the run's base drafter, {args.steps} steps per fit, {args.rounds} rounds in alternating order. Both fits "
        f"end with the same weights up to {diff:.1e} (largest difference).", "",
        table(args.steps, seconds, build_s), ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
