"""Multi-drafter bandits and routers at a larger evaluation than the demo's own (MetaSD Tables 3/6/7).

The demo's evaluate stage decodes 3 prompts per domain for 48 tokens to fit its time budget; that is
too few to separate drafters whose MATs differ by a few percent. This script reruns the same stage
(`pipelines/evaluate/`, no other code path) on a scratch copy of a finished run's bundle and prompt
sets, with more prompts and longer generations, then prints:
  1. per domain, each bandit's MAT as a fraction of (a) the best single drafter of that domain chosen
     in hindsight and (b) the per-prompt hindsight-best drafter; against the OFA drafter; beside the
     one-pass ceiling (the bandits' round-robin pass, then each prompt's best drafter)
  2. BD vs BE: the best-arm ratio over bandit rounds (MetaSD Figure 3 / Table 7)
  3. stopping-time regret against each prompt's best drafter (MetaSD Definition 1)
  4. routers vs bandits on the test, perturbed and OOD sets (MetaSD Table 6)

    python benchmarks/adaptive/bench_multi_drafter.py runs/demo [--prompts 6] [--tokens 96] [--arms specialists] [--no-append]

The demo's 180-step target leaves its drafters nearly interchangeable. A world where they specialise, as
MetaSD's do, is the same run with a longer-trained target (about 10 more minutes on 2 CPU cores):

    specdraft run configs/demo.yaml run.root=runs/demo600 pretrain_target.train.max_steps=600 \
        'run.stages=[prepare-data,pretrain-target,distill-data,train-drafters,acceptance-data,train-heads,train-router,export]'
    python benchmarks/adaptive/bench_multi_drafter.py runs/demo600 --prompts 20

Writes the tables as this script's section of benchmarks/adaptive/RESULTS.md with the date and machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.pipelines.config import load_config  # noqa: E402
from specdraft.pipelines.evaluate.aggregate import method_keys, one, select  # noqa: E402
from specdraft.pipelines.evaluate.methods import key_of, label  # noqa: E402
from specdraft.pipelines.evaluate.tables import regret_table  # noqa: E402
from specdraft.pipelines.schema import RunConfig  # noqa: E402
from specdraft.pipelines.stage import run_stage  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402


def bandit_table(metrics: dict) -> list[str]:
    k, ofa = metrics["k"], metrics["drafters"]["ofa"]
    bandits = method_keys(metrics, ("bandit", "ceiling"), mode="greedy", set="test")
    domains = sorted({r["domain"] for r in select(metrics, mode="greedy", set="test")} - {"all"}) + ["all"]
    rows = ["| domain | rounds per prompt | best single drafter (MAT) | per-prompt best MAT | OFA MAT | "
            + " | ".join(f"{label(b)}: MAT / of single / of per-prompt" for b in bandits) + " |",
            "| --- | ---: | --- | ---: | ---: |" + " ---: |" * len(bandits)]
    for d in domains:
        fixed = select(metrics, mode="greedy", set="test", domain=d, family="fixed", k=k)
        single = max(fixed, key=lambda r: r["MAT"])
        hind = one(metrics, mode="greedy", set="test", domain=d, family="hindsight")
        o = one(metrics, mode="greedy", set="test", domain=d, drafter=ofa, family="fixed", k=k)
        cells = []
        for b in bandits:
            r = one(metrics, set="test", domain=d, **b)
            cells.append(f"{r['MAT']:.3f} / {r['MAT'] / single['MAT']:.3f} / {r['MAT'] / hind['MAT']:.3f}")
        rounds = hind["N_target"] / hind["prompts"]  # of the hindsight-best drafter: what a bandit has to learn in
        rows.append(f"| {d} | {rounds:.1f} | {single['drafter']} ({single['MAT']:.3f}) | {hind['MAT']:.3f} | "
                    f"{o['MAT'] if o else float('nan'):.3f} | " + " | ".join(cells) + " |")
    return rows


def best_arm_table(metrics: dict, points=(0, 2, 5, 6, 8, 10, 15, 20, 30)) -> list[str]:
    curves = {label(v["key"]): v["ratio"] for v in metrics["best_arm_ratio"]}
    counts = {label(v["key"]): v["prompts"] for v in metrics["best_arm_ratio"]}
    labels = sorted(curves)
    # prompts still decoding at round t: short generations drop out, so late rounds speak for long prompts only
    rows = ["| round | prompts | " + " | ".join(labels) + " |", "| ---: | ---: |" + " ---: |" * len(labels)]
    for t in points:
        if all(t >= len(curves[lab]) for lab in labels):
            break
        n = max(counts[lab][t] for lab in labels if t < len(counts[lab]))
        rows.append(f"| {t} | {n} | " + " | ".join(f"{curves[lab][t]:.2f}" if t < len(curves[lab]) else "-"
                                                   for lab in labels) + " |")
    return rows


def robustness_table(metrics: dict) -> list[str]:
    k, ofa = metrics["k"], metrics["drafters"]["ofa"]
    base = {"mode": "greedy", "stream": False, "params": {}}
    keys = [key_of({**base, "family": "domain", "k": k}), key_of({**base, "family": "fixed", "drafter": ofa, "k": k})]
    rows = ["| method | " + " | ".join(f"{s} MAT" for s in ("test", "perturbed", "ood")) + " | perturbed / test | ood / test |",
            "| --- |" + " ---: |" * 5]
    for key in keys + method_keys(metrics, ("router", "bandit"), mode="greedy"):
        m = label(key)
        cells = {s: one(metrics, set=s, domain="all", **key) for s in ("test", "perturbed", "ood")}
        mat = {s: (c["MAT"] if c else None) for s, c in cells.items()}
        ratio = [f"{mat[s] / mat['test']:.3f}" if mat[s] and mat["test"] else "-" for s in ("perturbed", "ood")]
        rows.append(f"| {m} | " + " | ".join(f"{v:.3f}" if v else "-" for v in mat.values()) + f" | {ratio[0]} | {ratio[1]} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default="runs/demo")
    ap.add_argument("--config", default="configs/demo.yaml")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per domain and set")
    ap.add_argument("--tokens", type=int, default=96, help="max_new_tokens")
    ap.add_argument("--arms", choices=("specialists", "all"), default="specialists",
                    help="evaluate.bandit_arms: the single-domain drafters (MetaSD Table 3) or every drafter")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    root = Path(args.root)
    scratch = Path(tempfile.mkdtemp(prefix="bench_multi_")) / "run"
    for d in ("prompts", "bundle"):  # evaluate's only inputs
        shutil.copytree(root / d, scratch / d)
    overrides = [f"run.root={scratch}", f"evaluate.prompts_per_domain={args.prompts}",
                 f"evaluate.max_new_tokens={args.tokens}", "evaluate.ks=[4]", "evaluate.sampling_prompts=0",
                 "evaluate.bandits=[ucb-bd, ucb-bd-argmax, ucb-be, ucbspec]",
                 "evaluate.stream_bandits=[ucb-bd, ucb-bd-argmax, ucb-be]", f"evaluate.bandit_arms={args.arms}"]
    cfg = load_config(RunConfig, args.config, overrides)
    t0 = time.time()
    out = run_stage(cfg, "evaluate")
    wall = time.time() - t0
    metrics = json.loads((out / "metrics.json").read_text())
    shutil.rmtree(scratch.parent)
    text = "\n".join([
        f"## Multi-drafter bandits and routers, larger evaluation ({time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()} {os.cpu_count()} cores, run {root})", "",
        f"`python benchmarks/adaptive/bench_multi_drafter.py {args.root} --prompts {args.prompts} --tokens {args.tokens} "
        f"--arms {args.arms}`: the evaluate stage with {metrics['prompts']} prompts ({args.prompts} per domain and set), "
        f"{args.tokens} new tokens, greedy, K = N_max = {metrics['k']}, bandit arms {', '.join(metrics['bandit_arms'])}; "
        f"{wall:.0f} s.", "",
        "Bandit MAT against the best single drafter of each domain (chosen in hindsight, OFA included) and against "
        "the per-prompt hindsight-best drafter (test set). 'one pass + hindsight drafter' is no bandit but the ceiling "
        "of one: the round-robin pass MetaSD-UCB and UCBSpec start with, then the prompt's best arm. Rounds per "
        "prompt are the hindsight-best drafter's:", "", *bandit_table(metrics), "",
        "Best-arm ratio by bandit round (the share of prompts whose bandit picked the prompt's hindsight-best "
        "drafter in that round; MetaSD Figure 3):", "", *best_arm_table(metrics), "",
        "Stopping-time regret against each prompt's best arm at fixed K (MetaSD Definition 1; mean target calls "
        "per prompt beyond that arm's, test set):", "", regret_table(metrics) or "(no per-arm runs)", "",
        "Routing vs bandits across prompt sets (MAT pooled over domains; MetaSD Table 6):", "",
        *robustness_table(metrics), ""])
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
