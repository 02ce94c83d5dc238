"""The evaluation report: tables, sentences, plots and the headline, all from the one metrics dict of
aggregate.summarize with the claims of claims.judge in it (so every number in report.md is in
metrics.json, rounded once, there). It reads the claims; nothing reads it back.

Writes report/
  report.md            the tables (MetaSD Table 3 / 6 / 7 shapes, SpecDec++ vs fixed K vs oracle, Figure 3
                       as a table), the cost fit, and what the expected effects look like on this run
  metrics.json         the metrics dict itself
  *.png                the plots (plots.py)

report.md is assembled here from the rooms that write its parts: cells.py (numbers, intervals, the table),
tables.py (the tables of methods), verdicts.py (the effects and the papers' claims in words), plots.py.
"""
from __future__ import annotations

import json
from pathlib import Path

from specdraft.pipelines.evaluate.aggregate import select
from specdraft.pipelines.evaluate.cells import DISAGREE, SET_NAMES, ci, decoded_sets, fmt, table
from specdraft.pipelines.evaluate.methods import label
from specdraft.pipelines.evaluate.plots import write_plots
from specdraft.pipelines.evaluate.tables import (bd_be_table, best_arm_table, eagle_table, further_table,
                                                 per_domain_table, regret_table, robustness_table, speed_table,
                                                 stopping_table, throughput_section)
from specdraft.pipelines.evaluate.verdicts import effect_lines, render_verdicts


def render(metrics: dict) -> str:
    """report.md: the run and how to read it, then one section per kind of result."""
    parts = _opening(metrics)
    parts += _bandit_sections(metrics)
    parts += _further_sections(metrics)
    parts += _target_quality_section(metrics.get("target_quality") or {})
    parts += _calibration_section(metrics)
    parts += _cost_fit_section(metrics["cost_fit"])
    parts += ["## Plots", "", "![discard vs verification](pareto.png)", "", "![speedup](speedup.png)", ""]
    if metrics["notes"]:
        parts += ["## Notes", ""] + [f"- {n}" for n in metrics["notes"]] + [""]
    return "\n".join(parts)


def _opening(metrics: dict) -> list[str]:
    """The run, how its speedups are measured, the expected effects and verdicts, the speedup tables and
    SpecDec++ against fixed K and the oracle."""
    k = metrics["k"]
    cfg = metrics["config"]
    parts = [
        "# specdraft evaluation report", "",
        f"{metrics['prompts']} prompts ({', '.join(cfg['sets'])}; up to {cfg['prompts_per_domain']} per domain and set), "
        f"{cfg['max_new_tokens']} new tokens, device {metrics['device']}, {metrics['threads']} thread(s). "
        f"{metrics['plan_runs']} planned runs, each timed {metrics['repeats']} times with the methods of a prompt "
        f"interleaved (timer: {metrics['timer']}). MAT counts the bonus token. Fixed K = {k} unless named; bandits "
        f"draft N_max = {k} per round and choose among {', '.join(metrics.get('bandit_arms', []))}. "
        "Every number below is in metrics.json.", "", *target_line(metrics), *timing_lines(metrics),
        "Speedups are against the autoregressive target on the same prompts (its cost per token times the "
        "method's tokens), pooled over prompts as a ratio of totals with its bootstrap 90% interval. "
        "**Counted** speedup: the cost the run's counts predict "
        + ("(SpecDec++ Eq. 3.1 with the configured cost of each round's (K+1)-token verification forward and of a "
           "draft forward, evaluate.counted_costs); the counts are exact and nothing timed moves it"
           if cfg.get("counted_costs") else
           "on this machine (SpecDec++ Eq. 3.1 with the calibrated cost of each round's (K+1)-token verification "
           "forward and of a draft forward); the counts are exact and load moves it only through that calibration, "
           "far less than the timed one") + ", so it is the headline on CPU. **Timed** speedup: "
        "the same ratio of measured times (each run's mean over its passes), the check. An effect is claimed "
        "only where its "
        "interval clears the line.", "",
        "## What the expected effects look like here", "", *effect_lines(metrics), "",
        *render_verdicts(metrics),
        "## Speedup per method (greedy, test set, all domains pooled)", "", speed_table(metrics), "",
        *throughput_section(metrics),
        "## MAT / counted speedup / timed speedup per domain x method (greedy, test set; MetaSD Table 3 shape)", "",
        per_domain_table(metrics), "",
        "## SpecDec++ vs fixed K vs the hindsight oracle (greedy, test set)", "", stopping_table(metrics, "greedy"), "",
    ]
    if select(metrics, mode="sampling"):
        s = metrics["sampling"]
        parts += [f"## The same in sampling mode (T={s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}: "
                  "the heads' label transform; fewer prompts)", "", stopping_table(metrics, "sampling"), ""]
    return parts


def headline(metrics: dict) -> str:
    """A short markdown table for the end of `make demo`: counted speedup first (load moves it only
    through the calibration), the timed one beside it as the check."""
    rows = metrics["headline"]
    others = [s for s in decoded_sets(metrics) if s != "test"]
    return table(["method", "in-domain MAT", "in-domain counted speedup", "in-domain timed speedup [interval]"]
                 + [f"{SET_NAMES[s]} counted speedup" for s in others],
                 [[label(r["key"]), r["test_MAT"], r["test_counted_speedup"],
                   ci({"speedup": r["test_speedup"], "speedup_lo": r["test_speedup_lo"],
                        "speedup_hi": r["test_speedup_hi"]})] + [r[f"{s}_counted_speedup"] for s in others]
                  for r in rows])


def target_line(metrics: dict) -> list[str]:
    """Where the target ran and how it was loaded (device(s), dtype, quantization), and how the stages
    that trained against it loaded it, where that differs."""
    t = metrics.get("target_load")
    if not t:
        return []
    why = f" ({t['dtype_reason']})" if t.get("dtype_reason") else ""
    line = (f"Target on {', '.join(t['devices'])}, dtype {t['dtype']}{why}, quantization {t['quantization']}"
            + (f", device_map {t['device_map']}" if t.get("device_map") is not None else "") + "."
            + (f" Drafter LMs' linear weights (EAGLE drafters keep theirs): {t['draft_weights']}."
               if t.get("draft_weights") else ""))
    b = t.get("bundle") or {}
    differs = [f"{k} {b[k]}" for k in ("quantization", "device_map") if k in b and b[k] != t.get(k)]
    if differs:
        line += f" The bundle records that the stages loaded it with {', '.join(differs)}."
    return [line, ""]


def timing_lines(metrics: dict) -> list[str]:
    """How the runs were timed: the timer, warm-up, passes (planned, cap, taken), how many got narrow."""
    t = metrics.get("timing")
    if not t:
        return []
    flagged = sum(1 for r in metrics["rows"] if r.get("timed_counted_disagree"))
    return [f"Timing: {t['timer']}, one whole generation per timed call with its speculator built before it"
            + (", after one untimed warm-up per method and prompt-length class" if t["warmup"] else ", no warm-up")
            + passes_line(t)
            + (f"{flagged} rows' timed and counted speedup intervals do not overlap (marked \"{DISAGREE.strip()}\"): "
               "read their timed speedup with care." if flagged else
               "Timed and counted speedup intervals overlap on every row."), ""]


def passes_line(t: dict) -> str:
    """The passes per run and how many runs' own time is narrow; one pass gives a run no interval of its own."""
    if t["repeats_max"] == t["repeats"] == 1:
        return ". One timed pass per run (no interval of a run's own time: evaluate.repeats = 1). "
    return (f". {t['repeats']} interleaved passes per run"
            + (f", more (up to {t['repeats_max']}) while the 90% interval of a run's mean time is wider than "
               f"+-{t['repeat_ci']:.0%}: {t['passes_mean']} passes on average; "
               if t["repeats_max"] > t["repeats"] else " (no further passes: evaluate.repeats_max = repeats); ")
            + f"{fmt(t['narrow_share'])} of {t['runs']} runs have a 90% interval of their mean time within "
            f"+-{t['repeat_ci']:.0%}. ")


def _bandit_sections(metrics: dict) -> list[str]:
    """Bandits against routers and OFA across prompt sets, BD vs BE, stopping-time regret, best-arm ratio."""
    on = " / ".join(SET_NAMES[s] for s in decoded_sets(metrics))
    parts = [f"## Bandits vs routers vs OFA on {on} prompts (MetaSD Table 6 shape)", "",
             robustness_table(metrics), ""]
    parts += ["![robustness](robustness.png)", ""]
    bdbe = bd_be_table(metrics)
    if bdbe:
        parts += ["## Block divergence vs block efficiency reward (MetaSD Table 7 shape)", "", bdbe, ""]
    regret = regret_table(metrics)
    if regret:
        parts += ["## Stopping-time regret against the best fixed arm (MetaSD Definition 1; test set)", "",
                  "Mean over prompts of (target calls the bandit needed) - (target calls of the prompt's best arm at "
                  "fixed K), in rounds; greedy decoding makes both emit the same tokens.", "",
                  regret, "", "![stopping-time regret](regret.png)", ""]
    arms = best_arm_table(metrics)
    if arms:
        parts += ["## Best-arm ratio over rounds (MetaSD Figure 3; test set)", "",
                  "Fraction of prompts whose bandit picked the prompt's hindsight-best drafter in that round.", "",
                  arms, "", "![best-arm ratio](best_arm_ratio.png)", ""]
    return parts


def _further_sections(metrics: dict) -> list[str]:
    """SpecTr, cascades and model-free arms; EAGLE drafters against independent drafters."""
    parts: list[str] = []
    further = further_table(metrics)
    if further:
        parts += ["## SpecTr, speculative cascades and model-free arms (first test prompts per domain)", "",
                  "SpecTr: K drafts per round from the domain drafter, k-Seq selection; cascades: the domain drafter "
                  "verified towards the rule's lossy target at the configured alpha; model-free: prompt lookup, REST "
                  "and suffix decoding alone, and UCBSpec over them plus the domain drafter (throughput reward). "
                  "Sampling-mode rows are compared with the target sampling alone.", "", further, ""]
    eagle = eagle_table(metrics)
    if eagle:
        ms = measured_calibration(metrics).get("drafter_ms", {})
        costs = ", ".join(f"{n} {t:.3f} ms" for n, t in sorted(ms.items()))
        parts += ["## EAGLE drafters vs independent drafters (MetaSD Tables 4 / 7 shape; greedy)", "",
                  "EAGLE: one decoder layer over the target's features and the target's embedding (EAGLE-3, "
                  "vLLM's layout: three of the target's layers fused, its own LM head; EAGLE-1: the final hidden "
                  "state, the target's LM head); chain at K, and the EAGLE-2 dynamic tree verified in one tree-masked "
                  "target forward (its counted cost prices the verification by tree depth, as for SpecTr, so it "
                  "flatters the tree: read its MAT and timed speedup). The domain drafter row is the independent "
                  f"(SpS) drafter at K. One draft forward per drafter on this machine: {costs}.", "", eagle, ""]
        parts += _eagle_training_lines(metrics.get("eagle_training") or {})
    return parts


def _eagle_training_lines(training: dict) -> list[str]:
    """Each EAGLE drafter's training as train-drafters recorded it: steps on how many rows, and its dev curve
    (teacher-forced 1 - TV on the dev answers against optimizer steps) where one was taken."""
    lines = []
    for name, t in sorted(training.items()):
        if "steps" not in t:
            continue
        line = f"- **{name}** trained {t['steps']} steps" + (f" on {t['examples']} rows" if "examples" in t else "")
        if t.get("dev_curve"):
            line += "; dev acceptance (teacher-forced 1 - TV) against steps: " + ", ".join(
                f"{p['step']}: {p['acceptance']:.3f}" for p in t["dev_curve"])
        else:
            line += " (no dev curve: train_drafters.eagle.eval_every_n_steps is 0)"
        lines.append(line + ".")
    return ["Training (train-drafters):", "", *lines, ""] if lines else []


def _target_quality_section(quality: dict) -> list[str]:
    """The target alone on its tasks (greedy, test set) and one example per domain: how much of the
    drafters' acceptance a strong target would also give, and how much comes from a weak one's easy text."""
    if not quality:
        return []
    metric_names = sorted({k for q in quality.values() for k in q if k not in ("prompts", "example")})
    rows = [[d, q["prompts"]] + [q.get(m, "-") for m in metric_names] for d, q in quality.items()]
    parts = ["## The target on its tasks (greedy, test set; data/quality.py, 0-100)", "",
             "Every lossless method emits exactly these tokens, so this is the quality of every greedy row above.", "",
             table(["domain", "prompts"] + metric_names, rows), ""]
    for d, q in quality.items():
        ex = q["example"]
        block = ["prompt (its end):", ex["prompt"].strip(), "target:", ex["output"].strip(), "reference:",
                 ex["reference"].strip()]
        parts += [f"**{d}**, first test prompt:", "", "```",
                  *("  " + line for text in block for line in text.splitlines()), "```", ""]
    return parts


def measured_calibration(metrics: dict) -> dict:
    """The forward costs timed on this machine (beside the configured prices where evaluate.counted_costs
    pinned them, else the calibration the counted speedups are priced with)."""
    return metrics["calibration"].get("measured", metrics["calibration"])


def _calibration_section(metrics: dict) -> list[str]:
    """The costs the counted speedup is priced with: calibrated on this machine, or pinned by the config
    with this machine's calibration in the row beside them."""
    k, cfg, cal = metrics["k"], metrics["config"], metrics["calibration"]
    pinned, measured = cfg.get("counted_costs"), measured_calibration(metrics)
    ks = [kk for kk in sorted(map(int, measured["v"])) if kk in cfg["ks"] or kk == k]

    def row(name: str, c: dict) -> list:
        return [name, c["target_ms"]["1"], c["drafter_mean_ms"], c.get("cost_ratio"),
                metrics.get("bundle_cost_ratio")] + [c["v"][str(kk)] for kk in ks]

    rows = ([row("pinned (evaluate.counted_costs): the counted speedups' prices", cal)] if pinned else []) \
        + [row("calibrated on this machine" + (", beside" if pinned else ": the counted speedups' prices"), measured)]
    return ["## Calibration (the counted speedup's costs)", "",
            *([f"The counted speedups price every run's counts with evaluate.counted_costs: c = "
               f"{pinned['cost_ratio']} and v(K) = 1 + {pinned['verify_slope']} K, so their verdicts depend on the "
               "counts alone and repeat from run to run; this machine's 1-token target forward only sets their "
               "unit. What this machine measured is the row below them.", ""] if pinned else []),
            f"10% quantile of {measured['reps']} interleaved passes at a {measured['context']}-token context (load "
            "only adds time). v(K) = the target's (K+1)-token cached forward over its 1-token forward; t_draft = a "
            f"drafter's cost per drafted token, timed over {measured.get('draft_run', 1)} forwards in a row right "
            "after a target forward, as a round drafts.", "",
            "The bundle's c is the one train-heads measured (or export pinned), the price of a drafted token in "
            "every bandit's throughput reward.", "",
            table(["prices", "t_target 1 token (ms)", "mean t_draft (ms)", "c = t_draft / t_target", "bundle's c"]
                  + [f"v({kk})" for kk in ks], rows), ""]


def _cost_fit_section(fit: dict | None) -> list[str]:
    """The Eq. 3.1 fit of the runs' times to their counts (none when nothing was fitted)."""
    if not fit:
        return []
    return ["## Cost model fit (SpecDec++ Eq. 3.1, all greedy speculative runs, each run's mean time over "
            "its passes)", "",
            "T = t_draft N_draft + t_target N_target + a_prompt: Eq. 3.1 counts the decode's forwards, and "
            "what every method pays alike on a prompt (the prefill of both models, the context its forwards "
            "attend over) is that prompt's constant. R^2 is the whole model's; R^2 within prompts is the "
            "counts' share of the variation between the methods of a prompt, the stricter number.", "",
            table(["t_draft (ms)", "t_target (ms)", "t_draft / t_target", "R^2", "R^2 within prompts",
                   "R^2 on wall time", "runs", "prompts"],
                  [[fit["t_draft_ms"], fit["t_target_ms"], fit["cost_ratio"], fit["r2"], fit.get("r2_within"),
                    fit["wall_r2"], fit["runs"], fit.get("prompts")]]), ""]


def write_report(metrics: dict, out_dir: str | Path) -> Path:
    """metrics.json, report.md and the PNGs into out_dir (the stage's report/). Returns out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    (out / "report.md").write_text(render(metrics) + "\n")
    write_plots(metrics, out)
    return out
