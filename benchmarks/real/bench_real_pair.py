"""The batched decoder on `make real`'s pair, SmolLM2-135M-Instruct and one of its bundle's drafters:
bench_batch_decoder.py's parts on a real target, in a RESULTS.md section of their own (bench_batch_decoder.py's
keeps the demo-shaped pair).

    python benchmarks/real/bench_real_pair.py [--run runs/real] [--drafter math] [bench_batch_decoder.py options]

By default (what its RESULTS.md section measured): (a) batch 1, eager: ours autoregressive and fixed K = 4 against
transformers' greedy generate and assisted generation at equal K, on the drafter's domain's test prompts in the
target's chat template; (b) the batch curve over B = 1, 2, 4, 8, 16 for fixed K in {1, 2, 4, 8}, SpecDec++ with
the drafter's greedy head from train-heads and UCBSpec lengths; (c) the cost of deciding at batch 1. Left out by
default, as each takes tens of minutes on 2 CPU cores: the rules that read a profiled cost table
(the batch-aware rule, the global verify budget: `--table-rules` profiles every B and width first) and the compiled
mode (`--compile none,default`: under it only part (a) runs, `--compiled-skip b,c`; its first compilation of the
30-layer target takes minutes, inductor's on-disk cache keeps it for later runs). Any bench_batch_decoder.py option
given after these overrides the defaults.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from benchmarks.decoder import bench_batch_decoder  # noqa: E402

DEFAULTS = ["--compile", "none", "--compiled-skip", "b,c", "--no-table-rules", "--batch-sizes", "1,2,4,8,16",
            "--ks", "1,2,4,8", "--n-prompts", "4", "--max-new-tokens", "32", "--runs", "2"]


def greedy_head(run: pathlib.Path, drafter: str) -> pathlib.Path:
    """The drafter's greedy head as train-heads chose it (the one export bundled), in train-heads' directory,
    where its acceptance summary lies beside it."""
    bundled = sorted((run / "bundle" / "heads" / drafter / "greedy").iterdir())
    if len(bundled) != 1:
        raise SystemExit(f"{run}/bundle/heads/{drafter}/greedy holds {len(bundled)} heads, not one; re-run export")
    return run / "heads" / drafter / "greedy" / bundled[0].name


def real_argv(run: pathlib.Path, drafter: str, rest: list[str]) -> list[str]:
    """bench_batch_decoder.py's command line for this pair: the run's paths, the defaults above, then `rest`."""
    info = json.loads((run / "bundle" / "drafters" / drafter / "drafter.json").read_text())
    domain = info["domains"][0] if len(info["domains"]) == 1 else "chat"
    return ["--target", str(run / "target"), "--drafter", str(run / "bundle" / "drafters" / drafter),
            "--head", str(greedy_head(run, drafter)), "--prompt-set", str(run / "prompts" / "sets"),
            "--domain", domain, *DEFAULTS, *rest]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", default="runs/real", help="a finished make real run (its bundle and train-heads)")
    parser.add_argument("--drafter", default="math", help="a drafter of the run's bundle")
    args, rest = parser.parse_known_args(argv)
    run = pathlib.Path(args.run)
    if not (run / "bundle" / "bundle.json").is_file():
        parser.error(f"{run} holds no exported bundle; run `make real` first (or give --run)")
    if not (run / "bundle" / "drafters" / args.drafter).is_dir():
        parser.error(f"{run}/bundle has no drafter {args.drafter!r}; choose one of "
                     f"{', '.join(sorted(p.name for p in (run / 'bundle' / 'drafters').iterdir()))}")
    return bench_batch_decoder.main(real_argv(run, args.drafter, rest), owner=pathlib.Path(__file__))


if __name__ == "__main__":
    sys.exit(main())
