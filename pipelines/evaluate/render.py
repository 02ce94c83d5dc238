"""The evaluation report: tables, sentences, plots and the headline, all from the one metrics dict of
aggregate.summarize with the claims of claims.judge in it (so every number in report.md is in
metrics.json, rounded once, there). It reads the claims; nothing reads it back.

Writes report/
  report.md            the tables (MetaSD Table 3 / 6 / 7 shapes, SpecDec++ vs fixed K vs oracle, Figure 3
                       as a table), the cost fit, and what the expected effects look like on this run
  metrics.json         the metrics dict itself
  pareto.png           discard rate vs verification rate (SpecDec++ Figure 3 style)
  speedup.png          counted and timed speedup per domain x method with 90% intervals (test set, greedy)
  best_arm_ratio.png   fraction of prompts whose bandit picked the hindsight-best drafter, per round
  robustness.png       counted speedup on in-domain / perturbed / OOD prompts per method, with intervals
  regret.png           stopping-time regret per domain x bandit (MetaSD Definition 1)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from specdraft.decoding.cascades import DISPLAY_NAMES as CASCADE_NAMES
from specdraft.decoding.timing import Spread, verdict
from specdraft.pipelines.evaluate.aggregate import method_keys, one, select, set_domains
from specdraft.pipelines.evaluate.claims import HEADLINE_SETS, MIN_PROMPTS, NEAR_BEST, paper_verdicts
from specdraft.pipelines.evaluate.methods import key_of, label
from specdraft.pipelines.schema import BANDITS

PLOTS = ("pareto.png", "speedup.png", "best_arm_ratio.png", "robustness.png", "regret.png")
WORD = {"above": "yes", "below": "NO", "within noise": "within noise", "too few prompts": "too few prompts",
        "too few batches": "too few batches", None: "-"}


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def _ci(row: dict | None, name: str = "speedup") -> str:
    """'value [lo, hi]': a speedup with its bootstrap 90% interval over prompts."""
    if not row or row.get(name) is None:
        return "-"
    return f"{_fmt(row[name])} [{_fmt(row[name + '_lo'])}, {_fmt(row[name + '_hi'])}]"


DISAGREE = " (disagrees with counted)"


def _timed(row: dict | None) -> str:
    """The timed speedup with its interval, flagged where it and the counted one's intervals do not overlap."""
    return _ci(row) + (DISAGREE if row and row.get("timed_counted_disagree") else "")


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
            + f"{_fmt(t['narrow_share'])} of {t['runs']} runs have a 90% interval of their mean time within "
            f"+-{t['repeat_ci']:.0%}. ")


def table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)




def headline(metrics: dict) -> str:
    """A short markdown table for the end of `make demo`: counted speedup first (load moves it only
    through the calibration), the timed one beside it as the check."""
    rows = metrics["headline"]
    others = [s for s in decoded_sets(metrics) if s != "test"]
    return table(["method", "in-domain MAT", "in-domain counted speedup", "in-domain timed speedup [interval]"]
                 + [f"{SET_NAMES[s]} counted speedup" for s in others],
                 [[label(r["key"]), r["test_MAT"], r["test_counted_speedup"],
                   _ci({"speedup": r["test_speedup"], "speedup_lo": r["test_speedup_lo"],
                        "speedup_hi": r["test_speedup_hi"]})] + [r[f"{s}_counted_speedup"] for s in others]
                  for r in rows])


# --- report.md ---

def _per_domain_table(metrics: dict) -> str:
    """MetaSD Table 3 shape: domain x method, 'MAT / counted speedup / timed speedup'."""
    k = metrics["k"]
    keys = [key for key in method_keys(metrics, ("fixed", "router", "bandit", "ceiling", "hindsight"), mode="greedy",
                                       set="test") if key["k"] in (k, None)]
    rows = []
    for d in set_domains(metrics, "test"):
        row = [d]
        for key in keys:
            r = one(metrics, set="test", domain=d, **key)
            row.append(f"{_fmt(r['MAT'])} / {_fmt(r['counted_speedup'])} / {_fmt(r['speedup'])}"
                       + (" !" if r.get("timed_counted_disagree") else "") if r else "-")
        rows.append(row)
    return table(["domain"] + [label(key) for key in keys], rows) + \
        "\n\n! : the timed and counted speedup intervals of that cell do not overlap."


def _stopping_table(metrics: dict, mode: str) -> str:
    drafters = {x["drafter"] for x in select(metrics, mode=mode, family="specdecpp")} | \
        {x["drafter"] for x in select(metrics, mode=mode, family="oracle")}
    rows = []
    for r in metrics["rows"]:
        if r["mode"] == mode and r["set"] == "test" and r["domain"] != "all" \
                and r["family"] in ("fixed", "specdecpp", "oracle") and r["drafter"] in drafters:
            rows.append([r["domain"], r["drafter"], label(r), r["MAT"], r["verification_rate"], r["discard_rate"],
                         r["counted_speedup"], _timed(r)])
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    return table(["domain", "drafter", "method", "MAT", "verification rate", "discard rate", "counted speedup",
                  "timed speedup [interval]"], rows)


SET_NAMES = {"test": "in-domain", "perturbed": "perturbed", "ood": "OOD"}


def decoded_sets(metrics: dict) -> list[str]:
    """The headline's prompt sets this evaluation decoded (evaluate.sets may leave some out: the demo's)."""
    return [s for s in HEADLINE_SETS if any(r.get(f"{s}_MAT") is not None for r in metrics["headline"])]


def _robustness_table(metrics: dict) -> str:
    """MetaSD Table 6 shape: method x (in-domain, perturbed, OOD: the sets decoded), all domains pooled."""
    sets = decoded_sets(metrics)
    rows = [[label(r["key"])] + [r[f"{s}_{v}"] for s in sets for v in ("MAT", "counted_speedup")]
            for r in metrics["headline"]]
    return table(["method"] + [f"{SET_NAMES[s]} {v}" for s in sets for v in ("MAT", "counted speedup")], rows)


def _speed_table(metrics: dict) -> str:
    """Every greedy method pooled over the test set: counted speedup and timed speedup (CPU / CUDA time and
    wall time), each pooled over prompts (ratio of totals) with its bootstrap 90% interval."""
    rows = []
    for key in method_keys(metrics, ("fixed", "specdecpp", "oracle", "router", "bandit", "ceiling", "domain",
                                     "hindsight"), mode="greedy", set="test"):
        r = one(metrics, set="test", domain="all", **key)
        if r:
            rows.append([label(key), r["prompts"], r["MAT"], _ci(r, "counted_speedup"), _timed(r),
                         _ci(r, "wall_speedup")])
    return table(["method", "prompts", "MAT", "counted speedup [interval]", "timed speedup [interval]",
                  "wall-clock speedup [interval]"], rows)


FURTHER_FAMILIES = ("spectr", "cascade", "model_free")


def _further_table(metrics: dict) -> str | None:
    """SpecTr, speculative cascades and the model-free arms (BanditSpec Table 1's), pooled over the prompts
    they ran on, each speedup against the target alone in the same mode (cascades are lossy: their
    quality is in "The papers' claims" (claims.cascades) and benchmarks/bench_cascades.py)."""
    rows = []
    for mode in ("greedy", "sampling"):
        for key in method_keys(metrics, FURTHER_FAMILIES, mode=mode, set="test"):
            r = one(metrics, set="test", domain="all", **key)
            fixed = one(metrics, set="test", domain="all", family="fixed", mode=mode, drafter=key.get("drafter"),
                        k=key.get("k")) if key.get("drafter") else None
            if r:
                rows.append([label(key), mode, r["prompts"], r["MAT"], fixed["MAT"] if fixed else None,
                             _ci(r, "counted_speedup"), _timed(r)])
    if not rows:
        return None
    return table(["method", "mode", "prompts", "MAT (tokens per target call)", "MAT of its drafter alone at K",
                  "counted speedup [interval]", "timed speedup [interval]"], rows)


def _eagle_table(metrics: dict) -> str | None:
    """MetaSD Tables 4 / 7 for white-box drafters: each EAGLE drafter as a chain at K and as its EAGLE-2 tree,
    MetaEagle-UCB (BE, BD), beside the independent domain drafter at K (SpS), per set and domain (greedy)."""
    keys = method_keys(metrics, ("eagle",), mode="greedy")
    if not keys:
        return None
    k = metrics["k"]
    sps = key_of({"family": "domain", "mode": "greedy", "k": k, "stream": False, "params": {}})
    rows = []
    for s in [x for x in metrics["config"]["sets"] if select(metrics, mode="greedy", set=x, family="eagle")]:
        for d in set_domains(metrics, s):
            for key in [sps] + keys:
                r = one(metrics, set=s, domain=d, **key)
                if r:
                    rows.append([s, d, label(key), r["prompts"], r["MAT"], _ci(r, "counted_speedup"), _timed(r)])
    return table(["set", "domain", "method", "prompts", "MAT (tokens per target call)", "counted speedup [interval]",
                  "timed speedup [interval]"], rows)


def _bd_be_table(metrics: dict) -> str | None:
    """MetaSD Table 7 shape: MetaSD-UCB under each reward it ran with (BD, BD argmax, BE), MAT / speedup."""
    variants = [key for key in method_keys(metrics, ("bandit",), mode="greedy", set="test")
                if BANDITS.get(key["bandit"], ("", ""))[1] == "ucb" and not key["stream"]]
    if len(variants) < 2:
        return None
    rows = []
    for d in set_domains(metrics, "test"):
        cells = [one(metrics, set="test", domain=d, **key) for key in variants]
        rows.append([d] + [f"{_fmt(c['MAT'])} / {_fmt(c['counted_speedup'])}" if c else "-" for c in cells])
    return table(["domain"] + [f"{label(key)}: MAT / counted speedup" for key in variants], rows)


def regret_table(metrics: dict) -> str | None:
    """MetaSD Definition 1: mean stopping-time regret per prompt, in rounds, per domain x bandit."""
    regret = metrics.get("stopping_regret") or []
    if not regret:
        return None
    domains = [d for d in set_domains(metrics, "test") if any(d in v["per_domain"] for v in regret)]
    return table(["bandit"] + domains, [[label(v["key"])] + [v["per_domain"].get(d) for d in domains] for v in regret])


def _best_arm_table(metrics: dict) -> str | None:
    ratios = metrics["best_arm_ratio"]
    if not ratios:
        return None
    longest = max(len(v["ratio"]) for v in ratios)
    ts = [t for t in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48) if t <= longest]
    rows = [[label(v["key"])] + [v["ratio"][t - 1] if t <= len(v["ratio"]) else None for t in ts] for v in ratios]
    return table(["bandit"] + [f"round {t}" for t in ts], rows)


# a speedup's interval against 1, in the throughput lines' words
AGAINST_1 = {"above": "(above 1)", "below": "(below 1)", "within noise": "(within noise of 1)",
             "too few batches": "(too few batches for a verdict)", None: ""}


def throughput_section(metrics: dict) -> list[str]:
    """Throughput by batch size (docs/algorithms.md#batched-throughput): one table with B as a column, then
    where each method stops paying and whether the adaptive policies hold up where fixed K falls
    (claims.throughput_verdict)."""
    t = metrics.get("throughput")
    if not t:
        return []
    rows = [[r["batch_size"], label(r), r["batches"], r["prompts"], r["N"], r["MAT"], r["tokens_per_s"],
             _ci(r), _ci(r, "wall_speedup")] for r in t["rows"]]
    v = (metrics.get("verdicts") or paper_verdicts(metrics))["throughput"]
    lines = []
    for m in v["methods"]:
        cells = ", ".join(f"B={c['batch_size']}: {_said({'ratio': c['speedup'], **c})} {AGAINST_1[c['verdict']]}"
                          for c in m["by_b"])
        top = m["pays_up_to"]
        lines.append(f"- **{label(m['key'])}** pays (speedup interval above 1) "
                     + ("at no batch size" if top is None else f"up to B={top}, the largest measured"
                        if top == max(v["batch_sizes"]) else f"up to B={top}") + f": {cells}.")
    if v["fixed_falls_at"]:
        said = [f"{label(a['key'])} at B={a['batch_size']}: over batched AR {_said({'ratio': a['speedup'], **a})} "
                f"{AGAINST_1[a['verdict']]}, over the best fixed K={a['best_fixed_k']} there "
                f"{_said(a['vs_best_fixed'])} {AGAINST_1[(a['vs_best_fixed'] or {}).get('verdict')]}"
                for a in v["adaptive_where_fixed_falls"]]
        lines.append("- **Does the adaptive length hold up where fixed K falls?** No fixed K pays at B="
                     + ", ".join(map(str, v["fixed_falls_at"])) + " though one did at a smaller B. "
                     + ("; ".join(said) if said else "No SpecDec++ or UCBSpec rows ran") + ".")
    else:
        lines.append("- **Does the adaptive length hold up where fixed K falls?** Not tested here: "
                     + ("some fixed K pays at every batch size measured." if v["fixed_paid"] else
                        "no fixed K pays at any batch size measured, so there is no point where it falls."))
    ids = t["prompt_ids"]
    return ["## Throughput by batch size (batched decoder, greedy)", "",
            f"The same {len(ids)} test prompts (all domains pooled, round-robin over domains) at every batch size B, "
            "decoded in consecutive batches of B by the batched decoder (decoding.batched; ragged acceptance, each "
            "row its own accepted length; SpecDec++ stops each row alone, or, lockstep, the whole batch when its rows' "
            "mean predicted rejection probability exceeds h), with the all-domain drafter: a batch mixes domains "
            "and shares one drafter. Each batch is timed whole (a call's time is the batch's), the methods of a "
            f"batch interleaved, after one untimed warm-up per method and B; {t['passes_mean']} passes per batch on "
            "average. tokens/s = generated tokens / the batches' summed time; MAT = tokens per target forward per "
            "row (bonus counted); speedup = over batched AR at the same B, the ratio of totals over batches with "
            "its bootstrap 90% interval (resampling batches); a verdict needs at least "
            f"{MIN_PROMPTS} batches.", "",
            table(["B", "method", "batches", "prompts", "N", "MAT", "tokens/s", "speedup over batched AR [interval]",
                   "wall-clock speedup [interval]"], rows), "", *lines, "", *predicted_lines(t)]


def predicted_lines(t: dict) -> list[str]:
    """The same batch sizes as `specdraft predict` sees them before decoding (the bundle's acceptance summary and
    the cost table profiled at the stage's start), beside the measured tokens/s where a method is in both."""
    p = t.get("predicted")
    if not p:
        return []
    rows = [[x["batch"], x["method"], _fmt(x["tokens_per_s"]), _fmt(x["speedup"]), _fmt(x["mean_k"]),
             _fmt(x.get("measured_tokens_per_s")), _fmt(x.get("error"))] for x in p["predictions"]]
    c = t.get("cost_table") or {}
    return ["Predicted before decoding (`specdraft predict`'s model: the bundle's acceptance summary, "
            f"{p['rounds']} simulated batches of {p['new_tokens']} new tokens per method and B, priced with the decoder's "
            f"own step times profiled at this stage's start on {c.get('device', '?')}, compile {c.get('compile', '?')}; "
            f"prior: first-draft acceptance {_fmt(p['prior'])}, head odds {_fmt(p.get('odds'))}; the K per batch size it recommends: "
            + ", ".join(f"B={b}: {k}" for b, k in p["k_per_batch_size"].items()) + "):", "",
            table(["B", "method", "predicted tokens/s", "predicted speedup", "drafts per row-round",
                   "measured tokens/s", "predicted / measured - 1"], rows), ""]


def _said(c: dict | None) -> str:
    return f"{_fmt(c['ratio'])} [{_fmt(c['lo'])}, {_fmt(c['hi'])}]" if c else "-"


def _effect_lines(metrics: dict) -> list[str]:
    """Each effect is claimed only where its 90% interval over prompts clears the line; else 'within noise'."""
    e, lines = metrics["effects"], []
    spec = e["specialised_win_in_domain"]
    if spec:
        by = {v: [d for d, x in spec.items() if x["holds"] == v] for v in ("above", "below", "within noise")}
        parts = []
        if by["above"]:
            parts.append("yes on " + ", ".join(f"{d} ({_said(spec[d]['MAT_ratio'])})" for d in by["above"]))
        if by["below"]:
            parts.append("NOT on " + ", ".join(f"{d} (best: {spec[d]['best_other']}; own / best "
                                               f"{_said(spec[d]['MAT_ratio'])})" for d in by["below"]))
        if by["within noise"]:
            parts.append("within noise on " + ", ".join(f"{d} ({_said(spec[d]['MAT_ratio'])})"
                                                         for d in by["within noise"]))
        lines.append("- **Specialised drafters win in domain (MAT of the own drafter / the best other drafter at "
                     "fixed K, 90% interval over prompts):** " + "; ".join(parts) + ".")
    else:
        lines.append("- Specialised drafters in domain: not measured (no per-drafter runs on the test set).")
    lines += _alignment_lines(metrics.get("drafter_alignment") or {})
    band = e["bandits_near_best"]
    if band:
        for v in band:
            name, per = label(v["key"]), v["per_domain"]
            word = {"above": "yes", "below": "NO", "within noise": "within noise"}
            lines.append(
                f"- **{name} reaches >= 95% of the hindsight-best drafter's MAT:** per prompt: {word[v['holds']]} ("
                + ", ".join(f"{d} {_said(x['ratio'])}" for d, x in per.items())
                + f"); of the best single drafter per domain: {word[v['holds_vs_single']]} ("
                + ", ".join(f"{d} {_said(x['ratio_single'])}" for d, x in per.items())
                + "); beats OFA on all domains pooled: "
                + {"above": "yes", "below": "no", "within noise": "within noise", None: "-"}[v["beats_ofa"]]
                + f" ({_said(per.get('all', {}).get('vs_OFA'))})."
                + (" A ceiling, not a bandit: it knows each prompt's best drafter after its one pass; "
                   "generations here take " + ", ".join(f"{d} {x['rounds_per_prompt']}" for d, x in per.items()
                                                        if d != "all")
                   + f" rounds per prompt, {len(metrics['bandit_arms'])} of them the pass."
                   if v["key"]["family"] == "ceiling" else ""))
    else:
        lines.append("- Bandits vs the best drafter: not measured (no bandit rows; see the notes).")
    sd = e["specdecpp_beats_fixed_k"]
    if sd:
        by = {v: [x for x in sd if x["holds"] == v] for v in ("above", "below", "within noise")}
        lines.append(
            "- **SpecDec++ beats the best fixed K in counted cost per token (Eq. 3.1 with the calibrated v(K); "
            "speedup of SpecDec++ over that K, 90% interval over prompts):** "
            + "; ".join(f"{word} for {len(xs)} of {len(sd)} domain/drafter pairs"
                        + (": " + ", ".join(f"{x['domain']}/{x['drafter']} vs K={x['best_fixed_k']} "
                                            f"{_said(x['counted'])}" for x in xs) if xs else "")
                        for word, xs in (("yes", by["above"]), ("NO", by["below"]), ("within noise", by["within noise"]))
                        if xs) + ".")
    return lines


def _alignment_lines(alignment: dict[str, dict[str, dict]]) -> list[str]:
    """The specialists in their domains by train-drafters' teacher-forced alignment on the dev responses
    (drafters/alignment.py specialist_margins): own drafter / the best other there, 90% interval over responses."""
    lines = []
    for metric, name in (("acceptance", "1 - TV at T = 1"), ("agreement", "greedy agreement")):
        cells = {d: alignment[d][d] for d in alignment if f"{metric}_vs_best_other" in alignment[d].get(d, {})}
        if not cells:
            continue
        said = {}
        for d, c in cells.items():
            best = max((o for o in alignment if o != d and d in alignment[o]), key=lambda o: alignment[o][d][metric])
            lo, hi = c[f"{metric}_vs_best_other_lo"], c[f"{metric}_vs_best_other_hi"]
            word = {"above": "yes", "below": "NO"}.get(verdict(Spread(c[f"{metric}_vs_best_other"], lo, hi), 1.0),
                                                      "within noise")
            said.setdefault(word, []).append(f"{d} {c[metric]:.3f} vs {best} {alignment[best][d][metric]:.3f} "
                                             f"({c[f'{metric}_vs_best_other']:.4f} [{lo:.4f}, {hi:.4f}])")
        n = sum(c.get("sequences", 0) for c in cells.values())
        lines.append(f"- **Specialised drafters win in domain by {name} (teacher-forced on {n} dev responses at "
                     f"train-drafters; own / best other drafter, 90% interval over responses):** "
                     + "; ".join(f"{w} on " + ", ".join(said[w]) for w in ("yes", "NO", "within noise") if w in said)
                     + ".")
    return lines


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


def target_line(metrics: dict) -> list[str]:
    """Where the target ran and how it was loaded (device(s), dtype, quantization), and how the stages
    that trained against it loaded it, where that differs."""
    t = metrics.get("target_load")
    if not t:
        return []
    why = f" ({t['dtype_reason']})" if t.get("dtype_reason") else ""
    line = (f"Target on {', '.join(t['devices'])}, dtype {t['dtype']}{why}, quantization {t['quantization']}"
            + (f", device_map {t['device_map']}" if t.get("device_map") is not None else "") + ".")
    b = t.get("bundle") or {}
    differs = [f"{k} {b[k]}" for k in ("quantization", "device_map") if k in b and b[k] != t.get(k)]
    if differs:
        line += f" The bundle records that the stages loaded it with {', '.join(differs)}."
    return [line, ""]


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
        "**Counted** speedup: the cost the run's counts predict on this machine "
        "(SpecDec++ Eq. 3.1 with the calibrated cost of each round's (K+1)-token verification forward and of a "
        "draft forward); the counts are exact and load moves it only through that calibration, far less than the "
        "timed one, so it is the headline on CPU. **Timed** speedup: "
        "the same ratio of measured times (each run's mean over its passes), the check. An effect is claimed "
        "only where its "
        "interval clears the line.", "",
        "## What the expected effects look like here", "", *_effect_lines(metrics), "",
        *render_verdicts(metrics),
        "## Speedup per method (greedy, test set, all domains pooled)", "", _speed_table(metrics), "",
        *throughput_section(metrics),
        "## MAT / counted speedup / timed speedup per domain x method (greedy, test set; MetaSD Table 3 shape)", "",
        _per_domain_table(metrics), "",
        "## SpecDec++ vs fixed K vs the hindsight oracle (greedy, test set)", "", _stopping_table(metrics, "greedy"), "",
    ]
    if select(metrics, mode="sampling"):
        s = metrics["sampling"]
        parts += [f"## The same in sampling mode (T={s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}: "
                  "the heads' label transform; fewer prompts)", "", _stopping_table(metrics, "sampling"), ""]
    return parts


def _bandit_sections(metrics: dict) -> list[str]:
    """Bandits against routers and OFA across prompt sets, BD vs BE, stopping-time regret, best-arm ratio."""
    on = " / ".join(SET_NAMES[s] for s in decoded_sets(metrics))
    parts = [f"## Bandits vs routers vs OFA on {on} prompts (MetaSD Table 6 shape)", "",
             _robustness_table(metrics), ""]
    parts += ["![robustness](robustness.png)", ""]
    bdbe = _bd_be_table(metrics)
    if bdbe:
        parts += ["## Block divergence vs block efficiency reward (MetaSD Table 7 shape)", "", bdbe, ""]
    regret = regret_table(metrics)
    if regret:
        parts += ["## Stopping-time regret against the best fixed arm (MetaSD Definition 1; test set)", "",
                  "Mean over prompts of (target calls the bandit needed) - (target calls of the prompt's best arm at "
                  "fixed K), in rounds; greedy decoding makes both emit the same tokens.", "",
                  regret, "", "![stopping-time regret](regret.png)", ""]
    arms = _best_arm_table(metrics)
    if arms:
        parts += ["## Best-arm ratio over rounds (MetaSD Figure 3; test set)", "",
                  "Fraction of prompts whose bandit picked the prompt's hindsight-best drafter in that round.", "",
                  arms, "", "![best-arm ratio](best_arm_ratio.png)", ""]
    return parts


def _further_sections(metrics: dict) -> list[str]:
    """SpecTr, cascades and model-free arms; EAGLE drafters against independent drafters."""
    parts: list[str] = []
    further = _further_table(metrics)
    if further:
        parts += ["## SpecTr, speculative cascades and model-free arms (first test prompts per domain)", "",
                  "SpecTr: K drafts per round from the domain drafter, k-Seq selection; cascades: the domain drafter "
                  "verified towards the rule's lossy target at the configured alpha; model-free: prompt lookup, REST "
                  "and suffix decoding alone, and UCBSpec over them plus the domain drafter (throughput reward). "
                  "Sampling-mode rows are compared with the target sampling alone.", "", further, ""]
    eagle = _eagle_table(metrics)
    if eagle:
        ms = metrics["calibration"].get("drafter_ms", {})
        costs = ", ".join(f"{n} {t:.3f} ms" for n, t in sorted(ms.items()))
        parts += ["## EAGLE drafters vs independent drafters (MetaSD Tables 4 / 7 shape; greedy)", "",
                  "EAGLE: one decoder layer over the target's features and the target's embedding (EAGLE-3, "
                  "vLLM's layout: three of the target's layers fused, its own LM head; EAGLE-1: the final hidden "
                  "state, the target's LM head); chain at K, and the EAGLE-2 dynamic tree verified in one tree-masked "
                  "target forward (its counted cost prices the verification by tree depth, as for SpecTr, so it "
                  "flatters the tree: read its MAT and timed speedup). The domain drafter row is the independent "
                  f"(SpS) drafter at K. One draft forward per drafter on this machine: {costs}.", "", eagle, ""]
    return parts


def _calibration_section(metrics: dict) -> list[str]:
    """The costs the counted speedup is priced with, as calibrated on this machine."""
    k, cfg, cal = metrics["k"], metrics["config"], metrics["calibration"]
    vk = cal["v"]
    return ["## Calibration (this machine: the counted speedup's costs)", "",
            f"10% quantile of {cal['reps']} interleaved passes at a {cal['context']}-token context (load only adds "
            "time). v(K) = the target's (K+1)-token cached forward over its 1-token forward; t_draft = a drafter's "
            f"cost per drafted token, timed over {cal.get('draft_run', 1)} forwards in a row right after a target "
            "forward, as a round drafts.", "",
            "c = t_draft / t_target: calibrated here; the bundle's c is the one train-heads measured (or "
            "export pinned), the price of a drafted token in every bandit's throughput reward.", "",
            table(["t_target 1 token (ms)", "mean t_draft (ms)", "c = t_draft / t_target", "bundle's c"]
                  + [f"v({kk})" for kk in sorted(map(int, vk)) if kk in cfg["ks"] or kk == k],
                  [[cal["target_ms"]["1"], cal["drafter_mean_ms"], cal.get("cost_ratio"),
                    metrics.get("bundle_cost_ratio")]
                   + [vk[str(kk)] for kk in sorted(map(int, vk)) if kk in cfg["ks"] or kk == k]]), ""]


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


# --- plots ---

def _plots(metrics: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # SpecDec++ Figure 3 style: each policy is a point (discard rate, verification rate); lower-left is cheaper
    fig, ax = plt.subplots(figsize=(6, 4.5))
    markers = {"fixed": "o", "specdecpp": "*", "oracle": "s"}
    for fam, marker in markers.items():
        rows = select(metrics, mode="greedy", set="test", domain="all", family=fam)
        if rows:
            ax.scatter([r["discard_rate"] for r in rows], [r["verification_rate"] for r in rows], marker=marker,
                       s=80 if fam == "specdecpp" else 30, label={"fixed": "fixed K", "specdecpp": "SpecDec++",
                                                                    "oracle": "oracle"}[fam])
            for r in rows:
                ax.annotate(label(r), (r["discard_rate"], r["verification_rate"]), fontsize=6)
    ax.set_xlabel("discard rate (N_discarded / N)")
    ax.set_ylabel("verification rate (N_target / N)")
    ax.set_title("stopping policies, test set, greedy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=110)
    plt.close(fig)

    # counted and timed speedup per domain x method, each bar with its 90% interval over prompts
    k = metrics["k"]
    keys = [key for key in method_keys(metrics, ("fixed", "specdecpp", "router", "bandit"), mode="greedy", set="test")
            if key["k"] in (k, None)]
    domains = set_domains(metrics, "test")
    cells = [[one(metrics, set="test", domain=d, **key) or {} for d in domains] for key in keys]
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 0.12 * len(keys) * max(1, len(domains))), 8))
    for ax, name in zip(axes, ("counted_speedup", "speedup")):
        _grouped_bars(ax, plt, [label(key) for key in keys], domains,
                      [[c.get(name) or 0.0 for c in row] for row in cells],
                      f"{'counted' if name.startswith('counted') else 'timed'} speedup over autoregressive",
                      ref=1.0, errors=[[_err(c, name) for c in row] for row in cells])
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in metrics["best_arm_ratio"]:
        ax.plot(range(1, len(v["ratio"]) + 1), v["ratio"], label=label(v["key"]))
    if not metrics["best_arm_ratio"]:
        ax.text(0.5, 0.5, "no bandit runs (see the report's notes)", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("round")
    ax.set_ylabel("best-arm ratio")
    ax.set_ylim(0, 1.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "best_arm_ratio.png", dpi=110)
    plt.close(fig)

    sets = [(s, SET_NAMES[s]) for s in decoded_sets(metrics)]
    heads = metrics["headline"]
    fig, ax = plt.subplots(figsize=(max(6, 0.12 * len(heads) * 3), 4.5))
    _grouped_bars(ax, plt, [label(h["key"]) for h in heads], [name for _, name in sets],
                  [[h.get(f"{s}_counted_speedup") or 0.0 for s, _ in sets] for h in heads],
                  "counted speedup (all domains pooled)", ref=1.0,
                  errors=[[_err({"v": h.get(f"{s}_counted_speedup"), "v_lo": h.get(f"{s}_counted_speedup_lo"),
                                 "v_hi": h.get(f"{s}_counted_speedup_hi")}, "v") for s, _ in sets] for h in heads])
    fig.tight_layout()
    fig.savefig(out / "robustness.png", dpi=110)
    plt.close(fig)
    regret = metrics.get("stopping_regret") or []
    domains = [d for d in set_domains(metrics, "test") if any(d in v["per_domain"] for v in regret)]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    _grouped_bars(ax, plt, [label(v["key"]) for v in regret], domains,
                  [[v["per_domain"].get(d) or 0.0 for d in domains] for v in regret],
                  "stopping-time regret (rounds per prompt)", ref=0.0)
    fig.tight_layout()
    fig.savefig(out / "regret.png", dpi=110)
    plt.close(fig)
    verdicts = metrics.get("verdicts") or {}
    if verdicts.get("cascades"):
        _cascades_plot(plt, verdicts["cascades"], verdicts.get("quality_gap"), out / "cascades.png")


def _cascades_plot(plt, v: dict, gap: dict | None, path: Path) -> None:
    """Faster Cascades Figure 2: per scored domain, quality vs counted latency relative to the target sampling
    alone (1 / counted speedup), one line per rule over its alphas (annotated), the target at (1, its quality)
    and, where evaluate.drafter_quality ran, each drafter's greedy quality alone as a dotted line."""
    domains = list(v["per_domain"])
    fig, axes = plt.subplots(1, len(domains), figsize=(4.6 * len(domains), 4.2), squeeze=False)
    for ax, d in zip(axes[0], domains):
        e = v["per_domain"][d]
        for rule in v["rules"]:
            pts = sorted((p for p in e["points"] if p["rule"] == rule and p["counted"]), key=lambda p: p["alpha"])
            if not pts:
                continue
            xs, ys = [1.0 / p["counted"]["ratio"] for p in pts], [p["quality"] for p in pts]
            ax.plot(xs, ys, marker="o", ms=4, label=CASCADE_NAMES.get(rule, rule))
            for p, x, y in zip(pts, xs, ys):
                ax.annotate(f"{p['alpha']:g}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
        ax.scatter([1.0], [e["target_quality"]], marker="*", s=120, color="black", zorder=5, label="target (sampled)")
        for name, q in (((gap or {}).get("per_domain", {}).get(d) or {}).get("drafters") or {}).items():
            ax.axhline(q["mean"], ls=":", lw=1, color="grey")
            ax.annotate(f"{name} alone (greedy)", (ax.get_xlim()[0], q["mean"]), fontsize=6, color="grey")
        ax.set_title(d)
        ax.set_xlabel("counted latency relative to the target (1 / speedup)")
        ax.set_ylabel("quality (0-100)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _err(cell: dict, name: str) -> tuple[float, float]:
    """(below, above) the median: the error bar of its 90% interval (0, 0 where there is none)."""
    if not cell or cell.get(name) is None or cell.get(name + "_lo") is None:
        return 0.0, 0.0
    return max(0.0, cell[name] - cell[name + "_lo"]), max(0.0, cell[name + "_hi"] - cell[name])


def _grouped_bars(ax, plt, series: list[str], groups: list[str], values: list[list[float]], ylabel: str,
                  ref: float, errors: list[list[tuple[float, float]]] | None = None) -> None:
    """One bar per series in each group (values[series][group]), with error bars where given; an empty
    axis says there is nothing."""
    width = 0.8 / max(1, len(series))
    for j, (name, vals) in enumerate(zip(series, values)):
        yerr = None
        if errors is not None:
            yerr = [[e[0] for e in errors[j]], [e[1] for e in errors[j]]]
        ax.bar([i + j * width for i in range(len(groups))], vals, width, label=name, color=plt.cm.tab20(j % 20),
               yerr=yerr, capsize=1.5, error_kw={"elinewidth": 0.6})
    if not series or not groups:
        ax.text(0.5, 0.5, "nothing measured (see the report's notes)", ha="center", va="center",
                transform=ax.transAxes)
    ax.axhline(ref, color="k", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups)
    ax.set_ylabel(ylabel)
    if series:
        ax.legend(fontsize=6, ncol=2)


def write_report(metrics: dict, out_dir: str | Path) -> Path:
    """metrics.json, report.md and the PNGs into out_dir (the stage's report/). Returns out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    (out / "report.md").write_text(render(metrics) + "\n")
    _plots(metrics, out)
    return out


# --- the papers' claims, in words ---------------------------------------------------------------------

def _verdict_counts(items: list[tuple[str, dict | None]]) -> str:
    """'yes for 2 (a, b); within noise for 3 (...)' from (name, comparison) pairs."""
    by: dict[str, list[str]] = {}
    for name, c in items:
        by.setdefault(c["verdict"] if c else None, []).append(f"{name} {_said(c)}")
    return "; ".join(f"{WORD[v]} for {len(xs)} of {len(items)} ({', '.join(xs)})"
                     for v, xs in sorted(by.items(), key=lambda x: tuple(WORD).index(x[0])))


def _render_specdecpp(v: list[dict]) -> list[str]:
    rows = []
    for e in v:
        for name, p in (("SpecDec++", e["specdecpp"]), (f"best fixed K={e['best_fixed_k']}", e["best_fixed"]),
                        ("oracle", e.get("oracle"))):
            if p:
                rows.append([e["domain"], e["drafter"], name, p["prompts"], p["draft_per_token"], p["MAT"],
                             p["counted_ms_per_token"]])
    return ["### SpecDec++ against the best fixed K and the hindsight oracle (greedy, test set)", "",
            table(["domain", "drafter", "policy", "prompts", "N_draft per token", "MAT", "counted ms per token"],
                  rows), "",
            "- **SpecDec++ is cheaper than the best fixed K (counted speedup of SpecDec++ over it, 90% interval):** "
            + _verdict_counts([(f"{e['domain']}/{e['drafter']} vs K={e['best_fixed_k']}", e["vs_best_fixed"])
                               for e in v]) + ".",
            "- **SpecDec++ against the hindsight oracle (its counted speed as a share of the oracle's; the oracle "
            "stops exactly at the first rejection, so it is the bound):** "
            + ", ".join(f"{e['domain']}/{e['drafter']} {_said(e.get('vs_oracle'))}" for e in v) + ".", ""]


def _render_spectr(v: dict) -> list[str]:
    ks = v["ks"]
    rows = [[d] + [f"{_fmt(c['MAT'])} / {_fmt(c['counted_speedup']['ratio'] if c.get('counted_speedup') else None)}"
                   if (c := e["by_k"].get(kk)) else "-" for kk in ks]
            for d, e in v["per_domain"].items()]
    verdicts = [(d, e["rise"]) for d, e in v["per_domain"].items() if e["rise"]]
    pooled = v["per_domain"].get("all", {})
    rise = pooled.get("rise")
    said = {"above": "yes: block efficiency rises with K beyond the spread, as in SpecTr Table 1",
            "below": "NO: it falls with K", "within noise": "within noise: no rise beyond the spread",
            "too few prompts": "too few prompts for a verdict"}
    return [f"### SpecTr: block efficiency vs K drafts (T = 1, L = {v['L']}, test set)", "",
            "MAT (tokens per target call, bonus counted) / counted speedup over the target sampling alone, per "
            "domain and K; K = 1 is plain speculative sampling. SpecTr Table 1 reports 2.4 -> 3.1 (L = 4) and "
            "2.9 -> 4.0 (L = 8) from K = 1 to 8.", "",
            table(["domain"] + [f"K={kk}" for kk in ks], rows), "",
            f"- **Block efficiency rises with K (MAT at K={pooled.get('top_k')} over K=1, all domains pooled):** "
            + (f"{said[rise['verdict']]} ({_said(rise)})" if rise else "not measured")
            + ("; " if pooled.get("monotone") else "; not ") + "monotone in the point estimates"
            + ". Per domain: " + _verdict_counts([(d, c) for d, c in verdicts if d != "all"]) + ".", ""]


def _render_quality_gap(v: dict) -> list[str]:
    rows, lines = [], []
    for d, e in v["per_domain"].items():
        t = e["target"]
        rows.append([d, e["prompts"], "target", f"{_fmt(t['mean'])} [{_fmt(t['lo'])}, {_fmt(t['hi'])}]", "-", "-"])
        for n, q in e["drafters"].items():
            rows.append([d, e["prompts"], f"{n} alone", f"{_fmt(q['mean'])} [{_fmt(q['lo'])}, {_fmt(q['hi'])}]",
                         f"{_fmt(q['gap'])} [{_fmt(q['gap_lo'])}, {_fmt(q['gap_hi'])}]", WORD[q["verdict"]]])
        lines.append((d, [(n, q) for n, q in e["drafters"].items()]))
    all_above = all(q["verdict"] == "above" for _, qs in lines for _, q in qs)
    return ["### What a cascade trades: the target's quality against its drafters alone (greedy, test set)", "",
            "Quality: data/quality.py's primary metric per domain (0-100), mean over prompts [bootstrap 90% interval]; "
            "gap: target - drafter paired per prompt [90% interval]; target better beyond the interval: yes / NO / "
            "within noise.", "",
            table(["domain", "prompts", "decoder", "quality [interval]", "gap [interval]", "target better"], rows), "",
            "- **The target beats every drafter on measured quality:** "
            + ("yes, in every domain, beyond the interval" if all_above else "not everywhere: "
               + "; ".join(f"{d}: " + ", ".join(f"{n} {WORD[q['verdict']]}" for n, q in qs) for d, qs in lines))
            + ". A lossy cascade can only trade quality where this gap exists.", ""]


def _render_cascades(v: dict) -> list[str]:
    out = ["### Speculative cascades: quality vs counted speedup (Faster Cascades Figure 2 / Table 2)", "",
           "Quality: data/quality.py's primary metric (0-100) of the sampled text against the test reference, mean "
           "over prompts [bootstrap 90% interval]; speedup: counted (Eq. 3.1) and timed, over the target sampling "
           "alone on the same prompts [90% interval].", ""]
    for d, e in v["per_domain"].items():
        out += [f"{d}: the target alone scores {_fmt(e['target_quality'])} on {e['target_prompts']} prompts.", "",
                table(["rule", "alpha", "prompts", "quality [interval]", "counted speedup [interval]",
                       "timed speedup [interval]"],
                      [[CASCADE_NAMES.get(p["rule"], p["rule"]), p["alpha"], p["prompts"],
                        f"{_fmt(p['quality'])} [{_fmt(p['quality_lo'])}, {_fmt(p['quality_hi'])}]",
                        _said(p["counted"]), _said(p["timed"])] for p in e["points"]]), ""]
    rules = v["rules"]
    out += ["Table 2 shape: per domain and rule, the best counted speedup at a quality >= the target's (alpha) / "
            "the best quality at a counted speedup >= 1 (alpha); measured points only.", "",
            table(["domain"] + [CASCADE_NAMES.get(r, r) for r in rules],
                  [[d] + [f"{_fmt(t['speedup_at_target_quality'])} ({_fmt(t['alpha_at_target_quality'])}) / "
                          f"{_fmt(t['best_quality_within_target_latency'])} ({_fmt(t['alpha_best_quality'])})"
                          for t in (e["table2"][r] for r in rules)] for d, e in v["per_domain"].items()]), ""]
    leads = {r: sum(e["ranking"][0] == r for e in v["per_domain"].values()) for r in rules}
    second = {r: sum(len(e["ranking"]) > 1 and e["ranking"][1] == r for e in v["per_domain"].values()) for r in rules}
    n = len(v["per_domain"])
    token = v.get("token")
    shows = token is not None and "opt" in rules and leads[token] == n and second["opt"] == n
    floor = max(e["target_quality"] for e in v["per_domain"].values())
    out += ["- **The paper's ordering (SpecCascade [Token] first, [OPT] second at the target's quality):** "
            + ("shows" if shows else "does not show") + " here: leads per domain "
            + ", ".join(f"{CASCADE_NAMES.get(r, r)} {leads[r]}" for r in rules) + f" of {n}; second "
            + ", ".join(f"{CASCADE_NAMES.get(r, r)} {second[r]}" for r in rules) + f" of {n}. "
            "Quality intervals over this many prompts are wide (exact-match metrics are 0 or 100 per prompt), so "
            "an ordering is only as firm as the intervals in the table above."
            + (f" The target alone scores at most {_fmt(floor)} of 100 in any domain: quality is at its floor and "
               "cannot separate the rules, so the table ranks them by speed alone and the paper's claim is not "
               "tested here." if floor < 5.0 else ""), ""]
    if token is not None:
        name = CASCADE_NAMES[token]
        out += [f"- **{name} dominates the others' quality-latency trade-off (Figure 2):** a point is beaten where "
                "another has at least its mean quality, is not slower beyond the counted speedups' intervals, and is "
                "better in one (higher mean quality, or faster beyond the intervals); the frontier is the points "
                "nothing beats. " + "; ".join(
                    f"{d}: frontier " + ", ".join(f"{CASCADE_NAMES.get(r, r)} a={a:g}" for r, a in e["frontier"])
                    + "; beaten by it " + ", ".join(f"{CASCADE_NAMES.get(r, r)} {k}/{m}"
                                                     for r, (k, m) in e["beaten_by_token"].items())
                    for d, e in v["per_domain"].items()) + ".", ""]
    return out


def _render_banditspec(v: dict) -> list[str]:
    rows, lines = [], []
    for d, e in v["per_domain"].items():
        for a, s in e["arms"].items():
            rows.append([d, a + (" (best)" if a == e["best_arm"] else ""), s["prompts"], s["MAT"],
                         s["counted_tokens_per_s"], s["timed_tokens_per_s"], None])
        for b, s in e["bandits"].items():
            rows.append([d, b, s["prompts"], s["MAT"], s["counted_tokens_per_s"], s["timed_tokens_per_s"], s["regret"]])
    for b in v["bandits"]:
        items = [(f"{d} vs {e['best_arm']}", e["bandits"][b]["vs_best_counted"]) for d, e in v["per_domain"].items()
                 if b in e["bandits"]]
        timed = [(d, e["bandits"][b]["vs_best_timed"]) for d, e in v["per_domain"].items() if b in e["bandits"]]
        lines.append(f"- **{b} beats the best single arm (counted tokens/s over the arm's, 90% interval):** "
                     + _verdict_counts(items) + ". Timed: " + _verdict_counts(timed) + ".")
    return ["### BanditSpec Table 1: model-free arms, the domain drafter, and bandits over them (greedy)", "",
            "Each arm alone and each bandit (throughput reward) on the same test prompts; counted tokens/s from the "
            "calibrated forward costs (retrieval time not counted), timed from process CPU time; regret: the "
            "bandit's target calls per prompt beyond the prompt's best single arm (BanditSpec §4).", "",
            table(["domain", "method", "prompts", "MAT", "counted tokens/s", "timed tokens/s",
                   "stopping-time regret (target calls / prompt)"], rows), "", *lines, ""]


def _render_metaeagle(v: dict) -> list[str]:
    per = v["per_domain"]
    rows = [[d, e["own"] or "-", e["MAT"].get(e["own"]) if e["own"] else None, e["best"], e["MAT"][e["best"]],
             e["ucb_bd_MAT"], e["ucb_be_MAT"]] for d, e in per.items()]
    own = [(f"{d} vs {e['best_other']}", e["own_vs_best_other"]) for d, e in per.items() if "best_other" in e]
    near = [(d, e["ucb_vs_best"]) for d, e in per.items()]
    bdbe = [(d, e["bd_vs_be"]) for d, e in per.items()]
    gaps = ", ".join(f"{d} EAGLE {_said(e['bd_vs_be'])} vs SpS {_said(e['sps_bd_vs_be'])}" for d, e in per.items())
    return ["### MetaSD with EAGLE drafters: MetaEagle (MetaSD Tables 4 / 7; greedy, test set, chain at K)", "",
            table(["domain", "own EAGLE drafter", "its MAT", "best EAGLE drafter (hindsight)", "its MAT",
                   "MetaEagle-UCB (BD) MAT", "MetaEagle-UCB (BE) MAT"], rows), "",
            "- **Specialised EAGLE drafters win their domain (MAT of the own drafter over the best other one, 90% "
            "interval):** " + _verdict_counts(own) + ".",
            f"- **MetaEagle-UCB (BD) reaches >= {NEAR_BEST:.0%} of the hindsight-best EAGLE drafter's MAT:** "
            + _verdict_counts(near) + ".",
            "- **BD >= BE (MAT of MetaEagle-UCB with BD over with BE):** " + _verdict_counts(bdbe)
            + ". The same ratio for EAGLE and for the independent drafters (MetaSD: the gap is smaller for EAGLE): "
            + gaps + ".", ""]


def render_verdicts(metrics: dict) -> list[str]:
    v = metrics.get("verdicts") or paper_verdicts(metrics)
    parts = []
    if v.get("specdecpp"):
        parts += _render_specdecpp(v["specdecpp"])
    if v.get("spectr"):
        parts += _render_spectr(v["spectr"])
    if v.get("quality_gap"):
        parts += _render_quality_gap(v["quality_gap"])
    if v.get("cascades"):
        parts += _render_cascades(v["cascades"])
    if v.get("banditspec"):
        parts += _render_banditspec(v["banditspec"])
    if v.get("metaeagle"):
        parts += _render_metaeagle(v["metaeagle"])
    return ["## The papers' claims on this bundle", "",
            "Each claim is checked on this run's own numbers; the interval is a bootstrap 90% interval over prompts, "
            "and a claim is called only where it clears the line.", "", *parts] if parts else []
