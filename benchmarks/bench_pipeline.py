"""The demo run's own numbers, read from its stage manifests: time per stage, target perplexity vs a
unigram model, drafter alignment (the specialisation diagonal), and the SpecDec++ head sweep against
the best fixed K and the greedy oracle.

    python benchmarks/bench_pipeline.py runs/demo [--no-append]

Prints the tables and makes them this script's section of benchmarks/RESULTS.md (machine named). Run `make demo` (or
`specdraft run configs/demo.yaml`) first; nothing here trains or decodes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from publish import publish  # noqa: E402  (benchmarks/publish.py)

STAGES = [("prepare-data", "prompts"), ("pretrain-target", "target"), ("distill-data", "distill_data"),
          ("train-drafters", "drafters"), ("acceptance-data", "acceptance_data"), ("train-heads", "heads"),
          ("train-router", "router"), ("export", "bundle"), ("evaluate", "report")]


def manifest(root: Path, out: str) -> dict | None:
    p = root / out / "manifest.json"
    return json.loads(p.read_text()) if p.is_file() else None


def stage_times(root: Path) -> list[str]:
    rows = ["| stage | wall s |", "| --- | ---: |"]
    total = 0.0
    for name, out in STAGES:
        m = manifest(root, out)
        if m:
            rows.append(f"| {name} | {m['wall_time_s']:.1f} |")
            total += m["wall_time_s"]
    rows.append(f"| total | {total:.1f} |")
    return rows


def perplexity(root: Path) -> list[str]:
    m = manifest(root, "target")
    if not m:
        return []
    rows = ["| domain | target ppl | unigram ppl | ratio |", "| --- | ---: | ---: | ---: |"]
    for d, r in m["metrics"]["dev_perplexity"].items():
        rows.append(f"| {d} | {r['target_ppl']:.2f} | {r['unigram_ppl']:.2f} | {r['unigram_ppl'] / r['target_ppl']:.1f}x |")
    met = m["metrics"]
    rows.append(f"\n{met['parameters'] / 1e6:.2f}M parameters, {met['steps']} steps, "
                f"{met['train_tokens_seen'] / 1e6:.2f}M tokens seen, pretrain-target wall {m['wall_time_s']:.0f}s.")
    return rows


def alignment(root: Path, metric: str) -> list[str]:
    p = root / "drafters" / "alignment.json"
    if not p.is_file():
        return []
    table = json.loads(p.read_text())
    domains = sorted({d for row in table.values() for d in row})
    rows = ["| drafter | " + " | ".join(domains) + " | own - best other |", "|---" * (len(domains) + 2) + "|"]
    for name, row in table.items():
        cells = []
        for d in domains:
            v = row[d][metric]
            best_col = max(table[n][d][metric] for n in table if n not in ("ofa", "base"))
            cells.append(f"**{v:.3f}**" if name == d or (v == best_col and name not in ("ofa", "base")) else f"{v:.3f}")
        margin = ""
        if name in domains:
            own_col_others = [table[n][name][metric] for n in table if n not in (name, "ofa", "base")]
            margin = f"{row[name][metric] - max(own_col_others):+.3f}" if own_col_others else ""
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {margin} |")
    return rows


def heads(root: Path) -> list[str]:
    p = root / "heads" / "sweep.json"
    if not p.is_file():
        return []
    sweep = json.loads(p.read_text())
    rows = ["| drafter | labels | c | best head | KL dev (const) | AUROC | lowest dev KL (head) | 1-TV predictor KL "
            "| h | SpecDec++ cost | best fixed K cost | speedup vs fixed K | greedy oracle ver. rate |",
            "| --- | --- | ---: | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, by_tag in sweep.items():
        for tag, s in by_tag.items():
            best = next(h for h in s["heads"] if h["head"] == s["best_head"])
            low = min(s["heads"], key=lambda h: h["eval"]["kl"])
            sim = best["simulated"]
            fk = s["best_fixed_k"]
            ref = s.get("overlap_reference")  # none for greedy labels: 1 - TV of one-hots is the label itself
            overlap = f"{ref['kl']:.4f}" if ref and tag != "greedy" else "-"
            rows.append(f"| {name} | {tag} | {s['cost']['cost_ratio']:.3f} | {best['head']} | {best['eval']['kl']:.4f} "
                        f"({s['constant_predictor']['eval']['kl']:.4f}) | {best['eval']['auroc_reject']:.3f} | "
                        f"{low['eval']['kl']:.4f} ({low['head']}) | {overlap} | "
                        f"{best['threshold']:g} | {sim['cost']:.1f} | "
                        f"{fk['cost']:.1f} ({fk['policy']}) | {fk['cost'] / sim['cost']:.3f}x | "
                        f"{s['oracle']['verification_rate']:.3f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default="runs/demo")
    ap.add_argument("--no-append", action="store_true")
    args = ap.parse_args()
    root = Path(args.root)
    machine = f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores".strip()
    parts = [f"## Demo pipeline ({time.strftime('%Y-%m-%d')}, {machine}, run root {root})", "",
             "Stage wall times (from manifest.json):", "", *stage_times(root), "",
             "Target dev perplexity vs an add-one unigram model of the training corpus:", "", *perplexity(root), "",
             "Drafter alignment on held-out self-distilled dev responses, 1 - TV(p, q) at T=1 "
             "(rows: drafters, columns: domain; `base` = the general-phase drafter without distillation):", "",
             *alignment(root, "acceptance"), "", "Greedy agreement (argmax match):", "", *alignment(root, "agreement"), "",
             "SpecDec++ heads (simulated on dev sequences, cost in target-forward units, c = t_draft/t_target):", "",
             *heads(root), ""]
    text = "\n".join(parts)
    publish(text, write=not args.no_append)


if __name__ == "__main__":
    main()
