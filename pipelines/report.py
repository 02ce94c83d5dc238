"""The evaluation report: tables, plots and the headline, all from the one metrics dict of
pipelines/evaluate.py (so every number in report.md is in metrics.json, rounded once, there).

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
from specdraft.core.hashing import derive_seed
from specdraft.decoding.timing import Spread, bootstrap_rate_ratio, verdict
from specdraft.pipelines.schema import BANDITS

PLOTS = ("pareto.png", "speedup.png", "best_arm_ratio.png", "robustness.png", "regret.png")


def select(metrics: dict, **where) -> list[dict]:
    return [r for r in metrics["rows"] if all(r.get(k) == v for k, v in where.items())]


def one(metrics: dict, **where) -> dict | None:
    rows = select(metrics, **where)
    return rows[0] if rows else None


KEY_FIELDS = ("family", "mode", "drafter", "k", "policy", "router", "bandit", "reward", "stream", "params")
CEILING = "one pass + hindsight drafter"


def key_of(row: dict) -> dict:
    """The method key fields of a row, a run or a key dict: pass it back as `one(metrics, **key)`."""
    return {f: row.get(f) for f in KEY_FIELDS}


def label(key: dict) -> str:
    """The display name of a method: made here, when the report renders, and nowhere else."""
    fam, d, k = key.get("family"), key.get("drafter"), key.get("k")
    if fam == "ar":
        return "AR"
    if fam == "fixed":
        return f"{d} K={k}"
    if fam == "specdecpp":
        return f"{d} SpecDec++"
    if fam == "oracle":
        return f"{d} oracle"
    if fam == "router":
        return f"router:{key.get('router')}"
    if fam == "bandit":
        name = BANDITS[key["bandit"]][0] if key.get("bandit") in BANDITS else str(key.get("bandit"))
        return name + (" (stream)" if key.get("stream") else "")
    if fam == "ceiling":
        return CEILING
    if fam == "domain":
        return "domain drafter SpecDec++" if key.get("policy") == "specdecpp" else f"domain drafter K={k}"
    if fam == "hindsight":
        return f"hindsight-best drafter K={k}"
    if fam == "spectr":
        return f"SpecTr {d} K={dict(key.get('params') or {}).get('drafts')} L={k}"
    if fam == "cascade":
        ps = dict(key.get("params") or {})
        return f"{CASCADE_NAMES.get(ps.get('rule'), ps.get('rule'))} {d} alpha={ps.get('alpha')}"
    if fam == "model_free":
        return str(dict(key.get("params") or {}).get("arm"))
    if fam == "eagle":
        draft = dict(key.get("params") or {}).get("draft")
        if key.get("bandit"):
            return "MetaEagle-UCB (" + {"be": "BE", "bd": "BD"}.get(key.get("reward"), str(key.get("reward"))) + ")"
        return f"EAGLE {d} K={k}" if draft == "chain" else f"EAGLE {d} {draft}"
    # a family this module has no name for (a new decoder): its key fields, so it still renders
    parts = [str(fam)] + ([d] if d else []) + ([f"K={k}"] if k is not None else [])
    parts += [f"{n}={v}" for n, v in sorted((key.get("params") or {}).items())]
    return " ".join(parts)


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


def table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _domains(metrics: dict, set_name: str, mode: str = "greedy") -> list[str]:
    return sorted({r["domain"] for r in select(metrics, mode=mode, set=set_name)} - {"all"}) + ["all"]


def method_keys(metrics: dict, families: tuple[str, ...], **where) -> list[dict]:
    """Key dicts of the methods of the given families in first-seen order, families in the given order."""
    seen: dict[tuple, tuple[int, dict]] = {}
    for r in metrics["rows"]:
        if r["family"] in families and all(r.get(k) == v for k, v in where.items()):
            key = key_of(r)
            seen.setdefault(json.dumps(key, sort_keys=True), (families.index(r["family"]), key))
    return [key for _, key in sorted(seen.values(), key=lambda x: (x[0], label(x[1])))]


# --- per-prompt comparisons with their spread ---

def runs_of(metrics: dict, key: dict, set_name: str, domain: str) -> dict[str, dict]:
    """prompt -> the raw run of method `key` on it (metrics["runs"]; domain "all": every domain)."""
    return {r["prompt"]: r for r in metrics["runs"] if r["set"] == set_name and key_of(r) == key
            and (domain == "all" or r["domain"] == domain)}


def compare(a: dict[str, dict], b: dict[str, dict], value: str, seed: int) -> dict[str, Any] | None:
    """b's pooled `value` per token over a's, on their shared prompts (value "N_target": the MAT of a over
    the MAT of b; "counted_s" or "time_s": the speedup of a over b), with its bootstrap 90% interval over
    prompts and the verdict against 1. Pooled before dividing, so it is the ratio of the tables' pooled
    numbers (under greedy both emit the same tokens and it is sum b / sum a)."""
    shared = sorted(set(a) & set(b))
    if not shared:
        return None
    s = bootstrap_rate_ratio([(b[p][value], b[p]["N"], a[p][value], a[p]["N"]) for p in shared], seed)
    return {"ratio": round(s.median, 3), "lo": round(s.lo, 3), "hi": round(s.hi, 3), "prompts": len(shared),
            "verdict": verdict(s, 1.0)}


def _seed(*parts) -> int:
    return derive_seed("report", *parts)


def _hindsight_runs(metrics: dict, k: int, set_name: str, domain: str) -> dict[str, dict]:
    """Per prompt, the fixed-K run with the highest MAT where every drafter ran (the hindsight-best drafter)."""
    by: dict[str, list[dict]] = {}
    for r in metrics["runs"]:
        if r["set"] == set_name and r["mode"] == "greedy" and r["family"] == "fixed" and r["k"] == k \
                and (domain == "all" or r["domain"] == domain):
            by.setdefault(r["prompt"], []).append(r)
    # first on ties, as pipelines/evaluate.derived picks
    return {p: max(v, key=lambda r: r["N"] / r["N_target"]) for p, v in by.items() if len(v) == metrics["n_drafters"]}


# --- derived comparisons (stored in metrics["effects"], so the report's sentences have their numbers) ---

def effects(metrics: dict) -> dict[str, Any]:
    k, own, ofa = metrics["k"], metrics["drafters"]["own"], metrics["drafters"]["ofa"]
    out: dict[str, Any] = {}
    # 1. specialised drafters win in their domain (test set, greedy, fixed K): MAT and counted speed, each
    #    against the best other drafter, with its interval over the domain's prompts
    spec = {}
    for d, name in sorted(own.items()):
        rows = select(metrics, mode="greedy", set="test", domain=d, family="fixed", k=k)
        if len(rows) < 2 or not any(r["drafter"] == name for r in rows):
            continue
        own_row = next(r for r in rows if r["drafter"] == name)
        other = max((r for r in rows if r["drafter"] != name), key=lambda r: r["MAT"])
        a, b = runs_of(metrics, key_of(own_row), "test", d), runs_of(metrics, key_of(other), "test", d)
        mat = compare(a, b, "N_target", _seed("spec", d))
        speed = compare(a, b, "counted_s", _seed("spec-speed", d))
        spec[d] = {"own": name, "own_MAT": own_row["MAT"], "own_counted_speedup": own_row["counted_speedup"],
                   "best_other": other["drafter"], "best_other_MAT": other["MAT"],
                   "best_other_counted_speedup": other["counted_speedup"], "MAT_ratio": mat, "speed_ratio": speed,
                   "holds": mat["verdict"] if mat else None}
    out["specialised_win_in_domain"] = spec
    # 2. bandits approach the hindsight-best drafter and beat OFA (test set, greedy, MAT)
    band = []
    # the one-pass ceiling is listed with them: what any bandit that first tries every drafter once can reach
    for key in method_keys(metrics, ("bandit", "ceiling"), mode="greedy", set="test"):
        per = {}
        for d in _domains(metrics, "test"):
            b = one(metrics, set="test", domain=d, **key)
            best = one(metrics, mode="greedy", set="test", domain=d, family="hindsight")
            o = one(metrics, mode="greedy", set="test", domain=d, drafter=ofa, family="fixed", k=k) if ofa else None
            # the best single drafter for the whole domain, chosen in hindsight (MetaSD Table 3's yardstick);
            # the per-prompt hindsight-best above is stricter: it switches drafter for every prompt
            single = max(select(metrics, mode="greedy", set="test", domain=d, family="fixed", k=k),
                         key=lambda r: r["MAT"], default=None)
            if b is None or best is None:
                continue
            mine = runs_of(metrics, key, "test", d)
            vs_best = compare(mine, _hindsight_runs(metrics, k, "test", d), "N_target", _seed("band", d))
            vs_single = compare(mine, runs_of(metrics, key_of(single), "test", d), "N_target",
                                _seed("single", d)) if single else None
            vs_ofa = compare(mine, runs_of(metrics, key_of(o), "test", d), "N_target", _seed("ofa", d)) if o else None
            per[d] = {"MAT": b["MAT"], "best_MAT": best["MAT"], "ratio": vs_best,
                      "best_single": single["drafter"] if single else None,
                      "best_single_MAT": single["MAT"] if single else None, "ratio_single": vs_single,
                      "OFA_MAT": o["MAT"] if o else None, "vs_OFA": vs_ofa,
                      "rounds_per_prompt": round(b["N_target"] / b["prompts"], 1)}
        if per:
            def holds(name: str) -> str:
                verdicts = [verdict(Spread(v[name]["ratio"], v[name]["lo"], v[name]["hi"]), 0.95)
                            if v[name] else "within noise" for v in per.values()]
                return "below" if "below" in verdicts else ("above" if set(verdicts) == {"above"} else "within noise")
            ofa_all = per.get("all", {}).get("vs_OFA")
            band.append({"key": key, "per_domain": per, "holds": holds("ratio"), "holds_vs_single": holds("ratio_single"),
                         "beats_ofa": ofa_all["verdict"] if ofa_all else None})
    out["bandits_near_best"] = band
    # 3. SpecDec++ beats the best fixed K in cost: the counted cost per token (Eq. 3.1 with the calibrated
    #    v(K), i.e. Eq. 5.1 with the verification forward's real cost), per domain/drafter, over prompts
    sdpp = []
    for r in select(metrics, mode="greedy", set="test", family="specdecpp"):
        if r["domain"] == "all":
            continue
        fixed = [f for f in select(metrics, mode="greedy", set="test", domain=r["domain"], drafter=r["drafter"],
                                   family="fixed") if f["k"] in metrics["config"]["ks"]]
        if not fixed:
            continue
        best = min(fixed, key=lambda f: f["counted_s"] / f["N"])
        mine, theirs = runs_of(metrics, key_of(r), "test", r["domain"]), runs_of(metrics, key_of(best), "test",
                                                                                  r["domain"])
        counted = compare(mine, theirs, "counted_s", _seed("sdpp", r["domain"], r["drafter"]))
        timed = compare(mine, theirs, "time_s", _seed("sdpp-t", r["domain"], r["drafter"]))
        sdpp.append({"domain": r["domain"], "drafter": r["drafter"], "best_fixed_k": best["k"],
                     "counted_ms_per_token": round(r["counted_s"] / r["N"] * 1e3, 3),
                     "best_fixed_counted_ms_per_token": round(best["counted_s"] / best["N"] * 1e3, 3),
                     "counted": counted, "timed": timed, "holds": counted["verdict"] if counted else None})
    out["specdecpp_beats_fixed_k"] = sdpp
    return out


HEADLINE_SETS = ("test", "perturbed", "ood")


def headline_rows(metrics: dict) -> list[dict]:
    """One row per key method: MAT, counted and timed speedup in domain (test), on perturbed and OOD prompts."""
    k, ofa = metrics["k"], metrics["drafters"]["ofa"]
    keys = [key_of({"family": "ar", "mode": "greedy", "stream": False, "params": {}})]
    if ofa:
        keys.append(key_of({"family": "fixed", "mode": "greedy", "drafter": ofa, "k": k, "stream": False, "params": {}}))
    keys += [key_of({"family": "domain", "mode": "greedy", "k": k, "stream": False, "params": {}}),
             key_of({"family": "domain", "mode": "greedy", "policy": "specdecpp", "stream": False, "params": {}}),
             key_of({"family": "hindsight", "mode": "greedy", "k": k, "stream": False, "params": {}})]
    keys += method_keys(metrics, ("router", "bandit"), mode="greedy")
    out = []
    for key in keys:
        cells = {s: one(metrics, set=s, domain="all", **key) for s in HEADLINE_SETS}
        if not any(cells.values()):
            continue
        out.append({"key": key, **{f"{s}_{v}": (c[v] if c else None) for s, c in cells.items()
                                   for v in ("MAT", "speedup", "speedup_lo", "speedup_hi", "counted_speedup",
                                             "counted_speedup_lo", "counted_speedup_hi")}})
    return out


def headline(metrics: dict) -> str:
    """A short markdown table for the end of `make demo`: counted speedup first (load moves it only
    through the calibration), the timed one beside it as the check."""
    rows = metrics["headline"]
    return table(["method", "in-domain MAT", "in-domain counted speedup", "in-domain timed speedup [interval]",
                  "perturbed counted speedup", "OOD counted speedup"],
                 [[label(r["key"]), r["test_MAT"], r["test_counted_speedup"],
                   _ci({"speedup": r["test_speedup"], "speedup_lo": r["test_speedup_lo"],
                        "speedup_hi": r["test_speedup_hi"]}), r["perturbed_counted_speedup"],
                   r["ood_counted_speedup"]] for r in rows])


# --- report.md ---

def _per_domain_table(metrics: dict) -> str:
    """MetaSD Table 3 shape: domain x method, 'MAT / counted speedup / timed speedup'."""
    k = metrics["k"]
    keys = [key for key in method_keys(metrics, ("fixed", "router", "bandit", "ceiling", "hindsight"), mode="greedy",
                                       set="test") if key["k"] in (k, None)]
    rows = []
    for d in _domains(metrics, "test"):
        row = [d]
        for key in keys:
            r = one(metrics, set="test", domain=d, **key)
            row.append(f"{_fmt(r['MAT'])} / {_fmt(r['counted_speedup'])} / {_fmt(r['speedup'])}" if r else "-")
        rows.append(row)
    return table(["domain"] + [label(key) for key in keys], rows)


def _stopping_table(metrics: dict, mode: str) -> str:
    drafters = {x["drafter"] for x in select(metrics, mode=mode, family="specdecpp")} | \
        {x["drafter"] for x in select(metrics, mode=mode, family="oracle")}
    rows = []
    for r in metrics["rows"]:
        if r["mode"] == mode and r["set"] == "test" and r["domain"] != "all" \
                and r["family"] in ("fixed", "specdecpp", "oracle") and r["drafter"] in drafters:
            rows.append([r["domain"], r["drafter"], label(r), r["MAT"], r["verification_rate"], r["discard_rate"],
                         r["counted_speedup"], _ci(r)])
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    return table(["domain", "drafter", "method", "MAT", "verification rate", "discard rate", "counted speedup",
                  "timed speedup [interval]"], rows)


def _robustness_table(metrics: dict) -> str:
    """MetaSD Table 6 shape: method x (in-domain, perturbed, OOD), all domains pooled."""
    rows = [[label(r["key"])] + [r[f"{s}_{v}"] for s in HEADLINE_SETS for v in ("MAT", "counted_speedup")]
            for r in metrics["headline"]]
    return table(["method", "in-domain MAT", "in-domain counted speedup", "perturbed MAT", "perturbed counted speedup",
                  "OOD MAT", "OOD counted speedup"], rows)


def _speed_table(metrics: dict) -> str:
    """Every greedy method pooled over the test set: counted speedup and timed speedup (CPU / CUDA time and
    wall time), each pooled over prompts (ratio of totals) with its bootstrap 90% interval."""
    rows = []
    for key in method_keys(metrics, ("fixed", "specdecpp", "oracle", "router", "bandit", "ceiling", "domain",
                                     "hindsight"), mode="greedy", set="test"):
        r = one(metrics, set="test", domain="all", **key)
        if r:
            rows.append([label(key), r["prompts"], r["MAT"], _ci(r, "counted_speedup"), _ci(r, "speedup"),
                         _ci(r, "wall_speedup")])
    return table(["method", "prompts", "MAT", "counted speedup [interval]", "timed speedup [interval]",
                  "wall-clock speedup [interval]"], rows)


FURTHER_FAMILIES = ("spectr", "cascade", "model_free")


def _further_table(metrics: dict) -> str | None:
    """SpecTr, speculative cascades and the model-free arms (BanditSpec Table 1's), pooled over the prompts
    they ran on, each speedup against the target alone in the same mode (cascades are lossy: their
    quality is in "The papers' claims" (pipelines/verdicts.py) and benchmarks/bench_cascades.py)."""
    rows = []
    for mode in ("greedy", "sampling"):
        for key in method_keys(metrics, FURTHER_FAMILIES, mode=mode, set="test"):
            r = one(metrics, set="test", domain="all", **key)
            fixed = one(metrics, set="test", domain="all", family="fixed", mode=mode, drafter=key.get("drafter"),
                        k=key.get("k")) if key.get("drafter") else None
            if r:
                rows.append([label(key), mode, r["prompts"], r["MAT"], fixed["MAT"] if fixed else None,
                             _ci(r, "counted_speedup"), _ci(r, "speedup")])
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
        for d in _domains(metrics, s):
            for key in [sps] + keys:
                r = one(metrics, set=s, domain=d, **key)
                if r:
                    rows.append([s, d, label(key), r["prompts"], r["MAT"], _ci(r, "counted_speedup"),
                                 _ci(r, "speedup")])
    return table(["set", "domain", "method", "prompts", "MAT (tokens per target call)", "counted speedup [interval]",
                  "timed speedup [interval]"], rows)


def _bd_be_table(metrics: dict) -> str | None:
    """MetaSD Table 7 shape: MetaSD-UCB under each reward it ran with (BD, BD argmax, BE), MAT / speedup."""
    variants = [key for key in method_keys(metrics, ("bandit",), mode="greedy", set="test")
                if BANDITS.get(key["bandit"], ("", ""))[1] == "ucb" and not key["stream"]]
    if len(variants) < 2:
        return None
    rows = []
    for d in _domains(metrics, "test"):
        cells = [one(metrics, set="test", domain=d, **key) for key in variants]
        rows.append([d] + [f"{_fmt(c['MAT'])} / {_fmt(c['counted_speedup'])}" if c else "-" for c in cells])
    return table(["domain"] + [f"{label(key)}: MAT / counted speedup" for key in variants], rows)


def _regret_table(metrics: dict) -> str | None:
    """MetaSD Definition 1: mean stopping-time regret per prompt, in rounds, per domain x bandit."""
    regret = metrics.get("stopping_regret") or []
    if not regret:
        return None
    domains = [d for d in _domains(metrics, "test") if any(d in v["per_domain"] for v in regret)]
    return table(["bandit"] + domains, [[label(v["key"])] + [v["per_domain"].get(d) for d in domains] for v in regret])


def _best_arm_table(metrics: dict) -> str | None:
    ratios = metrics["best_arm_ratio"]
    if not ratios:
        return None
    longest = max(len(v["ratio"]) for v in ratios)
    ts = [t for t in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48) if t <= longest]
    rows = [[label(v["key"])] + [v["ratio"][t - 1] if t <= len(v["ratio"]) else None for t in ts] for v in ratios]
    return table(["bandit"] + [f"round {t}" for t in ts], rows)


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


def _paper_verdicts(metrics: dict) -> list[str]:
    from specdraft.pipelines.verdicts import render_verdicts  # it builds on this module's helpers

    return render_verdicts(metrics)


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


def render(metrics: dict) -> str:
    k, fit = metrics["k"], metrics["cost_fit"]
    cfg, cal = metrics["config"], metrics["calibration"]
    parts = [
        "# specdraft evaluation report", "",
        f"{metrics['prompts']} prompts ({', '.join(cfg['sets'])}; up to {cfg['prompts_per_domain']} per domain and set), "
        f"{cfg['max_new_tokens']} new tokens, device {metrics['device']}, {metrics['threads']} thread(s). "
        f"{metrics['plan_runs']} planned runs, each timed {metrics['repeats']} times with the methods of a prompt "
        f"interleaved (timer: {metrics['timer']}). MAT counts the bonus token. Fixed K = {k} unless named; bandits "
        f"draft N_max = {k} per round and choose among {', '.join(metrics.get('bandit_arms', []))}. "
        "Every number below is in metrics.json.", "",
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
        *_paper_verdicts(metrics),
        "## Speedup per method (greedy, test set, all domains pooled)", "", _speed_table(metrics), "",
        "## MAT / counted speedup / timed speedup per domain x method (greedy, test set; MetaSD Table 3 shape)", "",
        _per_domain_table(metrics), "",
        "## SpecDec++ vs fixed K vs the hindsight oracle (greedy, test set)", "", _stopping_table(metrics, "greedy"), "",
    ]
    if select(metrics, mode="sampling"):
        s = metrics["sampling"]
        parts += [f"## The same in sampling mode (T={s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}: "
                  "the heads' label transform; fewer prompts)", "", _stopping_table(metrics, "sampling"), ""]
    parts += ["## Bandits vs routers vs OFA on in-domain / perturbed / OOD prompts (MetaSD Table 6 shape)", "",
              _robustness_table(metrics), ""]
    parts += ["![robustness](robustness.png)", ""]
    bdbe = _bd_be_table(metrics)
    if bdbe:
        parts += ["## Block divergence vs block efficiency reward (MetaSD Table 7 shape)", "", bdbe, ""]
    regret = _regret_table(metrics)
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
    further = _further_table(metrics)
    if further:
        parts += ["## SpecTr, speculative cascades and model-free arms (first test prompts per domain)", "",
                  "SpecTr: K drafts per round from the domain drafter, k-Seq selection; cascades: the domain drafter "
                  "verified towards the rule's lossy target at the configured alpha; model-free: prompt lookup, REST "
                  "and suffix decoding alone, and UCBSpec over them plus the domain drafter (throughput reward). "
                  "Sampling-mode rows are compared with the target sampling alone.", "", further, ""]
    eagle = _eagle_table(metrics)
    if eagle:
        ms = cal.get("drafter_ms", {})
        costs = ", ".join(f"{n} {t:.3f} ms" for n, t in sorted(ms.items()))
        parts += ["## EAGLE drafters vs independent drafters (MetaSD Tables 4 / 7 shape; greedy)", "",
                  "EAGLE: one decoder layer of the target's architecture over the target's features (its own "
                  "embedding and LM head); chain at K, and the EAGLE-2 dynamic tree verified in one tree-masked "
                  "target forward (its counted cost prices the verification by tree depth, as for SpecTr, so it "
                  "flatters the tree: read its MAT and timed speedup). The domain drafter row is the independent "
                  f"(SpS) drafter at K. One draft forward per drafter on this machine: {costs}.", "", eagle, ""]
    parts += _target_quality_section(metrics.get("target_quality") or {})
    vk = cal["v"]
    parts += ["## Calibration (this machine: the counted speedup's costs)", "",
              f"10% quantile of {cal['reps']} interleaved passes at a {cal['context']}-token context (load only adds "
              "time). v(K) = the target's (K+1)-token cached forward over its 1-token forward; t_draft = a drafter's "
              f"cost per drafted token, timed over {cal.get('draft_run', 1)} forwards in a row right after a target "
              "forward, as a round drafts.", "",
              table(["t_target 1 token (ms)", "mean t_draft (ms)", "c = t_draft / t_target"]
                    + [f"v({kk})" for kk in sorted(map(int, vk)) if kk in cfg["ks"] or kk == k],
                    [[cal["target_ms"]["1"], cal["drafter_mean_ms"], cal.get("cost_ratio")]
                     + [vk[str(kk)] for kk in sorted(map(int, vk)) if kk in cfg["ks"] or kk == k]]), ""]
    if fit:
        parts += ["## Cost model fit (SpecDec++ Eq. 3.1, all greedy speculative runs, each run's mean time over "
                  "its passes)", "",
                  "T = t_draft N_draft + t_target N_target + a_prompt: Eq. 3.1 counts the decode's forwards, and "
                  "what every method pays alike on a prompt (the prefill of both models, the context its forwards "
                  "attend over) is that prompt's constant. R^2 is the whole model's; R^2 within prompts is the "
                  "counts' share of the variation between the methods of a prompt, the stricter number.", "",
                  table(["t_draft (ms)", "t_target (ms)", "t_draft / t_target", "R^2", "R^2 within prompts",
                         "R^2 on wall time", "runs", "prompts"],
                        [[fit["t_draft_ms"], fit["t_target_ms"], fit["cost_ratio"], fit["r2"], fit.get("r2_within"),
                          fit["wall_r2"], fit["runs"], fit.get("prompts")]]), ""]
    parts += ["## Plots", "", "![discard vs verification](pareto.png)", "", "![speedup](speedup.png)", ""]
    if metrics["notes"]:
        parts += ["## Notes", ""] + [f"- {n}" for n in metrics["notes"]] + [""]
    return "\n".join(parts)


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
    domains = _domains(metrics, "test")
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

    sets = [("test", "in-domain"), ("perturbed", "perturbed"), ("ood", "OOD")]
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
    domains = [d for d in _domains(metrics, "test") if any(d in v["per_domain"] for v in regret)]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    _grouped_bars(ax, plt, [label(v["key"]) for v in regret], domains,
                  [[v["per_domain"].get(d) or 0.0 for d in domains] for v in regret],
                  "stopping-time regret (rounds per prompt)", ref=0.0)
    fig.tight_layout()
    fig.savefig(out / "regret.png", dpi=110)
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
