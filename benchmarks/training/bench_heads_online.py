"""Cached features vs recomputing them online: the 20-head grid of one drafter, trained both ways.

    python benchmarks/training/bench_heads_online.py runs/demo [--drafter math] [--no-append]

Reads the run's acceptance_data/<drafter>/ (built with cache_features on) and trains the grid of
configs/demo.yaml's train_heads section twice: from the cached fp16 features, and with the frozen
drafter rerun on (prompt, Z) every epoch (heads/online.py). Prints wall times and the speedup of
caching, and writes them as this script's section of benchmarks/training/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from datasets import load_from_disk
from torch.utils.data import DataLoader

from specdraft.decoding.bundle.loading import load_tokenizer
from specdraft.decoding.bundle.loading import load_causal_lm
from specdraft.heads.lit_head import HeadTrainConfig, train_head_grid
from specdraft.heads.online import OnlineFeatures
from specdraft.pipelines.readers import load_features
from specdraft.pipelines.config import load_config
from specdraft.pipelines.schema import RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness
from benchmarks.harness.publish import publish  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default="runs/demo")
    ap.add_argument("--drafter", default="math")
    ap.add_argument("--transform", default="T1", help="label transform tag (a subdirectory of acceptance_data/<drafter>)")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    root, hcfg = Path(args.root), load_config(RunConfig, args.config).train_heads
    acc = root / "acceptance_data" / args.drafter / args.transform
    info = json.loads((acc / "info.json").read_text())
    tr, dev = load_features(acc, "train"), load_features(acc, "dev")
    cfg = HeadTrainConfig(lr=hcfg.lr, epochs=hcfg.epochs, batch_size=hcfg.batch_size)
    t0 = time.time()
    train_head_grid((tr["features"], tr["labels"]), (dev["features"], dev["labels"]), hcfg.depths, hcfg.w_rejs, cfg)
    cached = time.time() - t0
    drafter = load_causal_lm(root / "drafters" / args.drafter, "float32").eval()
    pad = load_tokenizer(root / "target").pad_token_id
    rows = [dict(r) for r in load_from_disk(str(acc / "sequences"))["train"]]
    loader = DataLoader(OnlineFeatures(drafter, rows, pad, hcfg.batch_size, max_length=info["max_length"]), batch_size=None)
    t0 = time.time()
    train_head_grid(None, (dev["features"], dev["labels"]), hcfg.depths, hcfg.w_rejs, cfg, train_loader=loader)
    online = time.time() - t0
    n = len(hcfg.depths) * len(hcfg.w_rejs)
    text = "\n".join([
        f"## Acceptance heads: cached features vs online ({time.strftime('%Y-%m-%d')}, 2-core CPU box, run {root})", "",
        f"`python benchmarks/training/bench_heads_online.py {args.root} --drafter {args.drafter}`: {n} heads, "
        f"{len(tr['labels'])} train positions from {len(rows)} sequences, {hcfg.epochs} epochs, batch {hcfg.batch_size}, "
        f"drafter hidden {info['hidden_size']}; wall time including the scoring pass.", "",
        "| features | wall s |", "| --- | ---: |", f"| cached (fp16, computed once by acceptance-data) | {cached:.1f} |",
        f"| online (drafter rerun every epoch) | {online:.1f} |", "",
        f"Caching is {online / cached:.2f}x faster for this drafter.", ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
