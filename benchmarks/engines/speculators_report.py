"""bench_speculators.py's section: both drafters' acceptance lengths, their paired difference, what training cost,
the ablations of the speculators run and the settings both trainers share or do not."""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from benchmarks.engines.acceptance import paired_difference, pooled_mal
from benchmarks.harness.machine import vllm_unavailable
from benchmarks.harness.tables import interval, table

VLLM_COMMAND = ("make vllm && SPECDRAFT_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python -m pytest -q -rs -m vllm "
                "tests/engines/test_vllm_eagle3.py  # then serve each drafter directory with --speculative-config "
                "'{\"method\": \"eagle3\", \"model\": DIR, \"num_speculative_tokens\": K}' for K = 1..5")


def fmt_mal(rows: dict) -> str:
    """A drafter's pooled acceptance length at one K with its interval over prompts."""
    return interval(pooled_mal(rows["tokens"], rows["calls"]))


def mal_table(results: dict, ks: list[int]) -> list[str]:
    rows = []
    for label, by_k in results.items():
        equal = sum(sum(by_k[k]["equal"]) for k in ks)
        total = sum(len(by_k[k]["equal"]) for k in ks)
        judged = [t for k in ks for t in by_k[k].get("near_tie", []) if t is not None]
        ties = f" ({sum(judged)} near-ties, {len(judged) - sum(judged)} other)" if judged else ""
        rows.append([label, *(fmt_mal(by_k[k]) for k in ks), f"{equal}/{total}{ties}"])
    return table(["drafter", *(f"K={k}" for k in ks), "greedy output = target's"], rows)


def difference_table(results: dict, seeds: list[int], ks: list[int]) -> list[str]:
    rows = []
    for seed in seeds:
        a, b = results[f"specdraft s{seed}"], results[f"speculators s{seed}"]
        rows.append([seed, *(interval(paired_difference(a[k], b[k]), signed=True) for k in ks)])
    if len(seeds) > 1:  # each prompt's counts summed over the seeds: the interval resamples prompts, not seeds
        a, b = (seed_sum([results[f"{tool} s{seed}"] for seed in seeds], ks) for tool in ("specdraft", "speculators"))
        rows.append(["all, per prompt summed over seeds", *(interval(paired_difference(a[k], b[k]), signed=True)
                                                            for k in ks)])
    return table(["seed", *(f"K={k}" for k in ks)], rows)


def seed_sum(runs: list[dict], ks: list[int]) -> dict:
    """Per K, each prompt's generated tokens and target forwards summed over `runs` (the same prompts in order)."""
    return {k: {key: [sum(v) for v in zip(*(run[k][key] for run in runs))] for key in ("tokens", "calls")} for k in ks}


def cost_table(trained: dict, extract_cost: dict, stored: dict | None = None) -> list[str]:
    """Each trainer's optimizer steps (speculators': as its log says it ran them), tokens, wall time and memory;
    the offline signal each read: speculators' hidden states, and `stored` ({"seconds"}: the run's teacher-data
    stage) when specdraft's trainer read that."""
    rows = []
    for seed, info in trained.items():
        for name in ("speculators", "specdraft"):
            steps = info[name].get("steps", "?") if name == "speculators" else info["steps"]
            rows.append([seed, name, steps, f"{info['tokens']:,}", info[name]["seconds"],
                         f"{info[name]['peak_rss_mib']:,}"])
    rows.append(["all", f"speculators' offline hidden states (target forwards, transformers): {extract_cost['computed']} "
                 f"of {extract_cost['rows']} rows computed in this run, the rest cached", "-", "-",
                 extract_cost["seconds"], f"{extract_cost['peak_rss_mib']:,}"])
    if stored:
        rows.append(["all", "specdraft's stored signal (the run's stage teacher-data: the target's hidden states and "
                     "top-k of every train and dev row, bf16)", "-", "-", stored["seconds"], "-"])
    return table(["seed", "trainer", "optimizer steps", "training tokens", "wall s", "peak RSS MiB"], rows)


def settings_lines(meta: dict, ecfg, args, facts: dict, steps: list[int]) -> list[str]:
    """What both trainers share, and every setting left at a different value (with why); `steps`: specdraft's
    optimizer steps in the seeds."""
    norms = facts.get("peer_norms", {})
    online = ("specdraft's trainer reads the run's stored hidden states (stage teacher-data, timed apart: its row)"
              if facts.get("stored") else "specdraft's trainer runs the target online in every step (inside its wall "
              "time and memory)")
    return [
        f"- Shared: target {meta['target_config'].get('_model_name_or_path')} (runs/real/target), target layer ids "
        f"{meta['feature_layers']}, draft vocabulary {meta['draft_vocab_size']} (specdraft's most frequent response "
        f"tokens, given to speculators as d2t / t2d), {meta['n_layers']} decoder layer, lr {ecfg.lr}, "
        f"{ecfg.ttt_steps} TTT steps, the same rows in specdraft's sampled order ({' / '.join(map(str, steps))} steps "
        f"of {ecfg.train.batch_size} rows; speculators packs the same rows into at most as many batches), fp32 on CPU, "
        "loss = KL(target || draft) over the draft vocabulary on the response positions.",
        "- Left at each tool's own default (part of what is compared): optimizer (speculators: Muon on 2-D weights + "
        f"AdamW wd 0.01; specdraft: AdamW betas (0.9, 0.95) wd {ecfg.weight_decay}), schedule (linear, warmup 1% vs "
        f"cosine, warmup {ecfg.warmup_ratio}), TTT step weights (1.0 every step vs 0.8^s), lm_head (frozen target rows "
        "vs trained from them), final norm init (ones vs the target's), "
        f"speculators' norm_before_fc={norms.get('input_norm')}, norm_output={norms.get('norm_output')}, "
        f"norm_before_residual={norms.get('norm_before_residual')} (specdraft: none / no / {meta.get('norm_before_residual')}).",
        "- Could not match: batching (speculators packs rows into one sequence per step with document masks; "
        "specdraft pads batches of 8), so per-step token counts differ while the total is equal; speculators "
        "validates on the dev rows after its epoch (it refuses no validation split), "
        + (f"specdraft's measures its dev curve every {ecfg.eval_every_n_steps} steps (train_drafters.eagle"
           ".eval_every_n_steps, inside its wall time); " if ecfg.eval_every_n_steps else "specdraft's stage does not; ")
        + f"speculators' hidden states are computed offline (timed apart: extraction row), {online}; speculators "
        f"writes its checkpoint in bf16, specdraft in fp32 (both decoded here in the target's "
        f"{facts.get('dtype', 'float32')}); gradient clipping is 1.0 in both.",
        f"- Ablation flags given to speculators: {' '.join(args.peer_flag) or 'none'}.",
    ]


def ablation_lines(work: Path, ks: list[int], ours: dict | None) -> list[str]:
    """The speculators ablations found under WORK/ablation-NAME/results.json ({"train", "results", "flags"}: one
    retrain of its drafter with extra flags on seed 0's data, decoded as above), with specdraft's MAL minus theirs."""
    rows = []
    for path in sorted(work.glob("ablation-*/results.json")):
        saved = json.loads(path.read_text())
        res = {int(k): r for k, r in saved["results"].items()}
        flags = " ".join(saved.get("flags") or saved["train"]["flags"][-1:])
        diff = ", ".join(interval(paired_difference(ours[k], res[k]), signed=True) for k in ks) if ours else "-"
        rows.append([f"speculators s0 {flags}", saved["train"]["seconds"], f"{saved['train']['peak_rss_mib']:,}",
                     *(fmt_mal(res[k]) for k in ks), diff])
    if not rows:
        return []
    return ["", "Ablations of the speculators run (seed 0's data; wall s and peak RSS of its training; specdraft s0 "
            "minus it per K last, paired over prompts with its 90% bootstrap interval):", "",
            *table(["drafter", "wall s", "peak RSS MiB", *(f"K={k}" for k in ks), "specdraft minus it"], rows)]


def render(args, meta, ecfg, trained, extract_cost, results, facts) -> str:
    why_no_vllm = vllm_unavailable()
    lines = [f"## speculators 0.9.0 EAGLE-3 vs specdraft EAGLE-3 ({platform.machine()}, {os.cpu_count()} cores, "
             f"torch {torch.__version__})", "",
             f"Mean acceptance length (generated tokens per target forward, bonus token counted, pooled over "
             f"{facts['prompts']} test prompts of {', '.join(facts['domains'])}; 90% bootstrap interval over prompts), "
             f"greedy, fixed K, at most {args.tokens} new tokens, in specdraft's decoder (decode_batch), the target in "
             f"{facts.get('dtype', 'float32')}. The last column counts decodes whose output equals the target's plain "
             "greedy output token for token" + ("; below fp32 each divergence is judged at its first differing token: "
             "a near-tie of the target (two logits within the rounding of the shapes that compute them, "
             "decoding/near_ties.py) or other (a wrong draft accepted would be)"
             if facts.get("dtype", "float32") != "float32" else "") + ".", ""]
    lines += mal_table(results, args.k_list)
    lines += ["", "specdraft minus speculators (paired over prompts, 90% bootstrap interval):", ""]
    lines += difference_table(results, list(trained), args.k_list)
    lines += ["", "Training cost (each trainer a child process: wall clock and its peak resident memory):", ""]
    lines += cost_table(trained, extract_cost, facts.get("stored"))
    lines += ablation_lines(Path(args.work or Path(args.run) / "bench_speculators"), args.k_list, results.get("specdraft s0"))
    lines += [""] + settings_lines(meta, ecfg, args, facts, sorted({info["steps"] for info in trained.values()}))
    vllm = (f"not run: {why_no_vllm}. On a machine with AVX-512 or a GPU: `{VLLM_COMMAND}`" if why_no_vllm
            else f"not run by this script; the hardware allows it: `{VLLM_COMMAND}`")
    lines += [f"- vLLM serving of both drafters at K = 1..5 with vLLM's own acceptance counters: {vllm}.",
              f"- Reproduce: `make bench-speculators` (or `python benchmarks/engines/bench_speculators.py --seeds "
              f"{args.seeds} --prompts-per-domain {args.prompts_per_domain} --tokens {args.tokens}`)."]
    return "\n".join(lines) + "\n"
