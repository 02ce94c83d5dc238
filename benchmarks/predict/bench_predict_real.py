"""`specdraft predict` judged on `make real`'s pair, SmolLM2-135M-Instruct and its bundle's OFA drafter:
bench_predict.py on a real target, in a RESULTS.md section of its own (bench_predict.py's keeps the demo bundle).

    python benchmarks/predict/bench_predict_real.py [--run runs/real] [bench_predict.py options]

By default (what its RESULTS.md section measured): the bundle's all-domain drafter and its greedy head on the run's
first 16 test prompts in the target's chat template (code, math, then summarisation), rows ending at EOS or 16 new
tokens, B = 1, 2, 4, 8, 16; each B's cost table profiled right before its decodes (--profile-each-batch), then AR,
fixed K in {1, 2, 4, 8}, SpecDec++, the batch-aware rule and the K predict chooses from that table decoded over 2
interleaved passes and a warm-up, with --decisions (the chosen K's rate over each pass's best fixed K, AR counted as
K = 0). Fewer tokens and passes than bench_predict.py's defaults, and one table per B rather than --paired's one per
pass: a 135M target decodes ~12 tokens/s at batch 1 on one core, its table at B = 16 and widths to 9 takes minutes,
and every pass decodes 8 methods over 16 prompts at every B (about 95 minutes in all on 2 CPU cores). Any
bench_predict.py option given after these overrides the defaults.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from benchmarks.predict import bench_predict  # noqa: E402

DEFAULTS = ["--batch-sizes", "1,2,4,8,16", "--ks", "1,2,4,8", "--profile-each-batch", "--decisions",
            "--max-new-tokens", "16", "--runs", "2"]


def real_argv(run: pathlib.Path, rest: list[str]) -> list[str]:
    """bench_predict.py's command line for this run: its bundle and test prompts, the defaults above, then `rest`."""
    return ["--bundle", str(run / "bundle"), "--prompt-set", str(run / "prompts" / "sets"), *DEFAULTS, *rest]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/real", help="a finished make real run (its bundle and prompts)")
    args, rest = parser.parse_known_args(argv)
    run = pathlib.Path(args.run)
    if not (run / "bundle" / "bundle.json").is_file():
        parser.error(f"{run} holds no exported bundle; run `make real` first (or give --run)")
    if not (run / "prompts" / "sets").is_dir():
        parser.error(f"{run}/prompts/sets is missing; run `make real` first (or give --run)")
    return bench_predict.main(real_argv(run, rest), owner=pathlib.Path(__file__))


if __name__ == "__main__":
    sys.exit(main())
