"""Run `speculators train` (vLLM's speculators 0.9.0) on a CPU, from outside the package.

    .venv-speculators/bin/python benchmarks/engines/speculators_launch.py --steps-per-epoch 24 -- TRAIN FLAGS...

Run by the speculators venv's python (benchmarks/engines/bench_speculators.py starts it as a child process). Nothing
of speculators is edited or vendored; two of its names are replaced in memory, before its trainer is built:

- `speculators.train.trainer.get_local_rank` returns "cpu": the trainer moves the model and every batch with
  `.to(self.local_rank)`, and an integer rank is a CUDA device index.
- `Trainer.device_type` is set to "cpu" (it falls back to "cuda" when `torch.accelerator` finds none), so its
  `torch.autocast` is a CPU autocast; with `--hidden-states-dtype float32` that autocast is a no-op and the
  run is fp32, as specdraft's CPU training is.
- `torch.accelerator.synchronize` (its step timer calls it on every logged step) does nothing when no
  accelerator exists, instead of raising: CPU work is already finished when the call returns.

--steps-per-epoch N picks `--total-seq-len` (speculators packs rows into batches of at most that many
tokens) as the smallest budget whose packing of the train split is at most N batches, with speculators' own sampler
and seed: one epoch then takes as many optimizer steps over the same rows as specdraft's run took, or fewer where
no budget packs them into exactly N; the log's `--total-seq-len` line says how many.
"""
from __future__ import annotations

import argparse
import sys


def patch_for_cpu() -> None:
    """Point speculators' trainer at the CPU (see the module docstring for why each name)."""
    import speculators.train.trainer as trainer_module
    import torch

    trainer_module.get_local_rank = lambda: "cpu"
    original = trainer_module.Trainer.setup_trainer

    def setup_trainer(self):
        self.device_type = "cpu"  # set in __init__ just before this call; autocast reads it at every step
        return original(self)

    trainer_module.Trainer.setup_trainer = setup_trainer
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda device=None: None


def flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in argv."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def packed_budget(data_path: str, ratio: float, seed: int, steps: int) -> tuple[int, int]:
    """The smallest token budget per batch whose packing of the train split is at most `steps` batches, and the
    number of batches that packing makes (the optimizer steps an epoch runs: fewer than `steps` where no budget
    packs the rows into exactly `steps`)."""
    from datasets import load_from_disk
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    lengths = list(load_from_disk(data_path).with_format(None)["seq_len"])
    lengths = lengths[: int(len(lengths) * ratio)]  # ArrowDataset's train split: the first rows

    def batches(budget: int) -> int:
        return len(MultipackDistributedBatchSamplerV2(budget, lengths, num_replicas=1, rank=0, seed=seed))

    lo, hi = max(lengths), sum(lengths)
    if batches(lo) <= steps:
        return lo, batches(lo)
    while hi - lo > 1:  # batches(lo) > steps >= batches(hi); the count falls as the budget grows
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if batches(mid) <= steps else (mid, hi)
    return hi, batches(hi)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    parser.add_argument("train_flags", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    flags = [f for f in args.train_flags if f != "--"]
    if args.steps_per_epoch is not None:
        if flag(flags, "--total-seq-len") is not None:
            sys.exit("give --steps-per-epoch or --total-seq-len, not both")
        budget, packed = packed_budget(flag(flags, "--data-path", "./output"),
                                       float(flag(flags, "--train-data-ratio", "0.9")), int(flag(flags, "--seed", "42")),
                                       args.steps_per_epoch)
        # the steps an epoch runs, as bench_speculators.py reads them back from this log (speculators_peer.steps_run)
        print(f"[speculators_launch] --total-seq-len {budget}: {packed} packed batches an epoch", flush=True)
        flags += ["--total-seq-len", str(budget)]
    patch_for_cpu()
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    train_main(TrainConfig.resolve(flags))


if __name__ == "__main__":
    main(sys.argv[1:])
