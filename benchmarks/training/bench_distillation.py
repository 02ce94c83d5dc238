"""Does self-distillation help? The same drafters finetuned on the demo world's reference answers
instead of the target's own responses (same prompts, same steps), against the run's distilled drafters.

    python benchmarks/training/bench_distillation.py runs/demo [--config configs/demo.yaml] [--no-append]

Copies the run's prompts/, target/ and distill_data/ into a scratch run root, runs train-drafters with
`train_drafters.finetune_on=reference`, and prints each drafter's in-domain acceptance 1 - TV(p, q)
and greedy agreement for both, writing the table as this script's section of benchmarks/training/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import shutil
import tempfile
import time
from pathlib import Path

from specdraft.pipelines.config import load_config
from specdraft.pipelines.schema import RunConfig
from specdraft.pipelines.stage import run_stage

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness
from benchmarks.harness.publish import publish  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default="runs/demo")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    root = Path(args.root)
    distilled = json.loads((root / "drafters" / "alignment.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for d in ("prompts", "target", "distill_data"):
            shutil.copytree(root / d, Path(tmp) / d)
        cfg = load_config(RunConfig, args.config, [f"run.root={tmp}", "train_drafters.finetune_on=reference",
                                                   "train_drafters.finetune.train.wandb.mode=disabled",
                                                   "train_drafters.general.train.wandb.mode=disabled"])
        t0 = time.time()
        run_stage(cfg, "train-drafters")
        seconds = time.time() - t0
        reference = json.loads((Path(tmp) / "drafters" / "alignment.json").read_text())
    domains = [d for d in distilled if d in next(iter(distilled.values()))]
    lines = [f"## Self-distillation vs reference answers ({time.strftime('%Y-%m-%d')}, 2-core CPU box, run {root})", "",
             "In-domain acceptance 1 - TV(p, q) at T=1 / greedy agreement on held-out self-distilled dev responses; "
             "same drafter architecture, prompts and steps, finetuned on the target's responses (distilled) or on "
             f"the demo world's reference answers (reference). Reference run took {seconds:.0f}s.", "",
             "| drafter | distilled | reference | gain |", "| --- | ---: | ---: | ---: |"]
    for d in domains:
        a, b = distilled[d][d], reference[d][d]
        lines.append(f"| {d} | {a['acceptance']:.3f} / {a['agreement']:.3f} | {b['acceptance']:.3f} / "
                     f"{b['agreement']:.3f} | {a['acceptance'] - b['acceptance']:+.3f} / {a['agreement'] - b['agreement']:+.3f} |")
    text = "\n".join(lines)
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
