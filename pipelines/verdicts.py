"""The papers' verdicts on an evaluated bundle: each paper's table in its shape, and one sentence per claim,
all from metrics.json (pipelines/evaluate.py) and nothing else.

  SpecDec++ (§5, Table 2's comparison)    the head's stopping against the best fixed K and against the
                                          hindsight oracle (Thm 4.1): draft forwards per token, MAT, counted
                                          cost per token (Eq. 3.1 with the calibrated v(K))
  SpecTr (Table 1)                        block efficiency (MAT) vs the number of drafts K, K = 1 being plain
                                          speculative sampling; does it rise with K, as in the paper
  Faster Cascades (Table 2 / Figure 2)    quality (data/quality.py) vs counted speedup per deferral rule and
                                          alpha; the latency reduction at the target's quality, the best quality
                                          within the target's latency, and the rules' ordering
  MetaSD with EAGLE (Tables 4 / 7)        own EAGLE drafter vs the best other, MetaEagle-UCB (BD) near the
                                          best EAGLE drafter, BD vs BE beside the same ratio for SpS drafters
  BanditSpec (Table 1)                    each arm alone (prompt lookup, REST, suffix decoding, the domain
                                          drafter) and UCBSpec / EXP3Spec over them, per domain: MAT, counted and
                                          timed tokens/s, stopping-time regret; do the bandits beat the best arm

Every comparison is a ratio over the prompts both methods ran on, with its bootstrap 90% interval
(`pipelines.report.compare`); a claim is made only where the interval clears the line, else the sentence
says "within noise". `paper_verdicts` returns the numbers (stored in metrics["verdicts"]); `render_verdicts`
makes the markdown.
"""
from __future__ import annotations

import statistics
from typing import Any, Callable

from specdraft.decoding.cascades import DISPLAY_NAMES as CASCADE_NAMES
from specdraft.pipelines.report import _fmt, _said, _seed, compare, key_of, one, runs_of, select, table

WORD = {"above": "yes", "below": "NO", "within noise": "within noise", "too few prompts": "too few prompts", None: "-"}
MIN_PROMPTS = 3  # below this a bootstrap interval over prompts is degenerate: no claim either way


def _compare(a: dict[str, dict], b: dict[str, dict], value: str, seed: int) -> dict[str, Any] | None:
    """specdraft.pipelines.report.compare, with no verdict from fewer than MIN_PROMPTS shared prompts."""
    c = compare(a, b, value, seed)
    if c is not None and c["prompts"] < MIN_PROMPTS:
        c["verdict"] = "too few prompts"
    return c


def _runs(metrics: dict, domain: str, keep: Callable[[dict], bool], set_name: str = "test") -> dict[str, dict]:
    """prompt -> run, for the runs of `set_name` (domain "all": every domain) that `keep` accepts; a method
    whose key names a per-domain drafter pools over domains this way."""
    return {r["prompt"]: r for r in metrics["runs"] if r["set"] == set_name and keep(r)
            and (domain == "all" or r["domain"] == domain)}


def _domains_of(runs: list[dict]) -> list[str]:
    return sorted({r["domain"] for r in runs}) + (["all"] if runs else [])


def _param(r: dict, name: str) -> Any:
    return (r.get("params") or {}).get(name)


def _pooled(runs: dict[str, dict]) -> dict[str, float | None]:
    """Counts and speeds of a set of runs as ratios of totals."""
    vals = list(runs.values())
    n, nt, nd = (sum(r[f] for r in vals) for f in ("N", "N_target", "N_draft"))
    counted, timed = sum(r["counted_s"] for r in vals), sum(r["time_s"] for r in vals)
    return {"prompts": len(vals), "MAT": round(n / nt, 3) if nt else None,
            "draft_per_token": round(nd / n, 3) if n else None,
            "counted_ms_per_token": round(counted / n * 1e3, 3) if n else None,
            "counted_tokens_per_s": round(n / counted, 1) if counted else None,
            "timed_tokens_per_s": round(n / timed, 1) if timed else None}


# --- SpecDec++: the head against the best fixed K and the oracle ----------------------------------------

def specdecpp(metrics: dict) -> list[dict]:
    """Per (domain, drafter) with a SpecDec++ row (greedy, test set), for the domain's own drafter and the OFA
    one (the pairs the papers compare; a sweep over every drafter adds off-domain pairs): its counts beside the
    best fixed K's (lowest counted cost per token, chosen in hindsight) and the oracle's; SpecDec++'s counted
    speedup over each (> 1: SpecDec++ is cheaper)."""
    own, ofa = metrics["drafters"]["own"], metrics["drafters"]["ofa"]
    out = []
    for r in select(metrics, mode="greedy", set="test", family="specdecpp"):
        d, n = r["domain"], r["drafter"]
        if d == "all" or n not in (own.get(d), ofa):
            continue
        fixed = [f for f in select(metrics, mode="greedy", set="test", domain=d, drafter=n, family="fixed")
                 if f["k"] in metrics["config"]["ks"]]
        oracle = one(metrics, mode="greedy", set="test", domain=d, drafter=n, family="oracle")
        if not fixed:
            continue
        best = min(fixed, key=lambda f: f["counted_s"] / f["N"])
        mine = runs_of(metrics, key_of(r), "test", d)
        entry = {"domain": d, "drafter": n, "specdecpp": _pooled(mine), "best_fixed_k": best["k"],
                 "best_fixed": _pooled(runs_of(metrics, key_of(best), "test", d)),
                 "vs_best_fixed": _compare(mine, runs_of(metrics, key_of(best), "test", d), "counted_s",
                                          _seed("v-sdpp", d, n))}
        if oracle:
            theirs = runs_of(metrics, key_of(oracle), "test", d)
            entry["oracle"] = _pooled(theirs)
            entry["vs_oracle"] = _compare(mine, theirs, "counted_s", _seed("v-sdpp-oracle", d, n))
        out.append(entry)
    return out


# --- SpecTr: block efficiency vs K ------------------------------------------------------------------------

def spectr(metrics: dict) -> dict | None:
    """Per domain (and pooled), MAT and counted speedup for each K drafts; the largest K against K = 1 (the
    SpecTr K = 1 row, else the same drafter's plain sampling row at the same L)."""
    runs = [r for r in metrics["runs"] if r["family"] == "spectr" and r["set"] == "test"]
    if not runs:
        return None
    ks = sorted({_param(r, "drafts") for r in runs})
    length = runs[0]["k"]

    drafter_of = {r["domain"]: r["drafter"] for r in runs}

    def at(kk: int) -> Callable[[dict], bool]:
        if kk == 1 and 1 not in ks:  # plain speculative sampling with the same drafter and L
            return lambda r: r["family"] == "fixed" and r["mode"] == "sampling" and r["k"] == length and \
                r["drafter"] == drafter_of.get(r["domain"])
        return lambda r: r["family"] == "spectr" and _param(r, "drafts") == kk

    sweep = sorted(set(ks) | {1})
    per: dict[str, Any] = {}
    for d in _domains_of(runs):
        by_k = {kk: _runs(metrics, d, at(kk)) for kk in sweep}
        ar = _runs(metrics, d, lambda r: r["family"] == "ar" and r["mode"] == "sampling")
        cells = {}
        for kk, rs in by_k.items():
            if rs:
                cells[kk] = {**_pooled(rs), "counted_speedup": _compare(rs, ar, "counted_s", _seed("v-spectr", d, kk))}
        top = max(k for k in cells) if cells else None
        rise = _compare(by_k[top], by_k[1], "N_target", _seed("v-spectr-rise", d)) \
            if top and top > 1 and by_k[1] else None
        per[d] = {"by_k": cells, "top_k": top, "rise": rise,
                  "monotone": all(cells[a]["MAT"] <= cells[b]["MAT"] for a, b in zip(sorted(cells), sorted(cells)[1:]))}
    return {"L": length, "ks": sweep, "per_domain": per}


# --- Faster Cascades: quality vs latency -------------------------------------------------------------------

def cascades(metrics: dict) -> dict | None:
    """Per scored domain: the target's quality (T as the sampling mode) and, per rule and alpha, quality (mean
    over prompts, bootstrap 90% interval from the rows) and counted / timed speedup over the target on the
    same prompts; then Table 2: per rule, the best counted speedup among its alphas at a quality >= the
    target's, and the best quality at a counted speedup >= 1; and the rules ranked by the former."""
    runs = [r for r in metrics["runs"]
            if r["family"] == "cascade" and r["set"] == "test" and r.get("quality") is not None]
    if not runs:
        return None
    rules = sorted({_param(r, "rule") for r in runs})
    per: dict[str, Any] = {}
    for d in sorted({r["domain"] for r in runs}):
        ar = _runs(metrics, d, lambda r: r["family"] == "ar" and r["mode"] == "sampling"
                   and r.get("quality") is not None)
        if not ar:
            continue
        target_q = round(statistics.fmean(r["quality"] for r in ar.values()), 3)
        points = []
        for rule in rules:
            for alpha in sorted({_param(r, "alpha") for r in runs if _param(r, "rule") == rule}):
                rs = _runs(metrics, d, lambda r, rule=rule, alpha=alpha: r["family"] == "cascade" and
                           _param(r, "rule") == rule and _param(r, "alpha") == alpha)
                if not rs:
                    continue
                row = one(metrics, set="test", domain=d, **key_of(next(iter(rs.values()))))
                points.append({"rule": rule, "alpha": alpha, "prompts": len(rs),
                               "quality": round(statistics.fmean(r["quality"] for r in rs.values()), 3),
                               "quality_lo": row.get("quality_lo") if row else None,
                               "quality_hi": row.get("quality_hi") if row else None,
                               "counted": _compare(rs, ar, "counted_s", _seed("v-casc", d, rule, alpha)),
                               "timed": _compare(rs, ar, "time_s", _seed("v-casc-t", d, rule, alpha))})
        table2 = {}
        for rule in rules:
            mine = [p for p in points if p["rule"] == rule and p["counted"]]
            matched = [p for p in mine if p["quality"] >= target_q]
            within = [p for p in mine if p["counted"]["ratio"] >= 1.0]
            fast = max(matched, key=lambda p: p["counted"]["ratio"], default=None)
            good = max(within, key=lambda p: p["quality"], default=None)
            table2[rule] = {"speedup_at_target_quality": fast and fast["counted"]["ratio"],
                            "alpha_at_target_quality": fast and fast["alpha"],
                            "best_quality_within_target_latency": good and good["quality"],
                            "alpha_best_quality": good and good["alpha"]}
        ranking = sorted(rules, key=lambda r: -(table2[r]["speedup_at_target_quality"] or 0.0))
        per[d] = {"target_quality": target_q, "target_prompts": len(ar), "points": points, "table2": table2,
                  "ranking": ranking}
    return {"rules": rules, "per_domain": per} if per else None


# --- BanditSpec Table 1: model-free arms, the drafter, and bandits over them ---------------------------

def banditspec(metrics: dict) -> dict | None:
    """Per domain over the prompts the model-free family ran on (greedy, test set): each arm alone, each
    bandit over them; the best single arm by counted tokens/s; each bandit's speedup over it (counted and
    timed, interval over prompts) and its stopping-time regret (target calls beyond the prompt's best arm)."""
    mf = [r for r in metrics["runs"] if r["family"] == "model_free" and r["set"] == "test"]
    bandits = sorted({r["bandit"] for r in mf if r.get("bandit")})
    if not mf or not bandits:
        return None
    own = metrics["drafters"]["own"]
    k = metrics["k"]
    arms = sorted({_param(r, "arm") for r in mf if not r.get("bandit")})
    prompts = {r["prompt"] for r in mf}

    def arm_filter(arm: str) -> Callable[[dict], bool]:
        if arm == "drafter":  # the domain drafter at K alone: the bandits' parametric arm
            return lambda r: r["family"] == "fixed" and r["mode"] == "greedy" and r["k"] == k and \
                r["drafter"] == own.get(r["domain"]) and r["prompt"] in prompts
        return lambda r: r["family"] == "model_free" and not r.get("bandit") and _param(r, "arm") == arm

    per: dict[str, Any] = {}
    for d in _domains_of(mf):
        single = {a: _runs(metrics, d, arm_filter(a)) for a in arms + ["drafter"]}
        single = {a: rs for a, rs in single.items() if rs}
        stats = {a: _pooled(rs) for a, rs in single.items()}
        best = max(stats, key=lambda a: stats[a]["counted_tokens_per_s"] or 0.0)
        entry: dict[str, Any] = {"arms": stats, "best_arm": best, "bandits": {}}
        for b in bandits:
            rs = _runs(metrics, d, lambda r, b=b: r["family"] == "model_free" and r.get("bandit") == b)
            gaps = [rs[p]["N_target"] - min(s[p]["N_target"] for s in single.values())
                    for p in rs if all(p in s for s in single.values())]
            entry["bandits"][b] = {**_pooled(rs),
                                   "regret": round(statistics.fmean(gaps), 3) if gaps else None,
                                   "vs_best_counted": _compare(rs, single[best], "counted_s", _seed("v-bs", d, b)),
                                   "vs_best_timed": _compare(rs, single[best], "time_s", _seed("v-bs-t", d, b))}
        per[d] = entry
    return {"arms": arms + ["drafter"], "bandits": bandits, "per_domain": per}


# --- MetaSD with white-box drafters (MetaEagle): its three effects on the EAGLE rows -----------------------

NEAR_BEST = 0.95  # "UCB near the best drafter": its MAT at least this share of the hindsight-best drafter's


def _near(c: dict | None) -> dict | None:
    """A comparison's verdict against NEAR_BEST instead of 1."""
    if c is None or c["verdict"] == "too few prompts":
        return c
    return {**c, "verdict": "above" if c["lo"] >= NEAR_BEST else "below" if c["hi"] < NEAR_BEST else "within noise"}


def metaeagle(metrics: dict) -> dict | None:
    """Per domain (greedy, test set), MetaSD's effects as Table 4 / 7 state them for MetaEagle, each as an MAT
    ratio over the same prompts (greedy runs emit the same tokens, so MAT = N / N_target compares exactly):
    the domain's own EAGLE drafter against the best other one (chain at K; chosen in hindsight by pooled MAT),
    MetaEagle-UCB (BD) against the hindsight-best EAGLE drafter (>= NEAR_BEST), and BD against BE, beside the
    same BD / BE ratio of the independent (SpS) drafters' MetaSD-UCB."""
    eagle = [r for r in metrics["runs"] if r["family"] == "eagle" and r["set"] == "test" and r["mode"] == "greedy"]
    chains = sorted({r["drafter"] for r in eagle if _param(r, "draft") == "chain" and r.get("drafter")})
    if len(chains) < 2:
        return None
    own = metrics["drafters"]["own"]

    def chain(n: str) -> Callable[[dict], bool]:
        return lambda r: r["family"] == "eagle" and r.get("drafter") == n and _param(r, "draft") == "chain"

    def bandit(family: str, b: str) -> Callable[[dict], bool]:
        return lambda r: r["family"] == family and r.get("bandit") == b and not r.get("stream")

    per: dict[str, Any] = {}
    for d in sorted({r["domain"] for r in eagle}):
        runs = {n: _runs(metrics, d, chain(n)) for n in chains}
        mat = {n: _pooled(rs)["MAT"] or 0.0 for n, rs in runs.items() if rs}
        best = max(mat, key=mat.get)
        mine = f"eagle-{own[d]}" if own.get(d) else None
        entry: dict[str, Any] = {"MAT": mat, "best": best, "own": mine}
        if mine in runs:
            others = [n for n in mat if n != mine]
            rival = max(others, key=mat.get)
            entry["best_other"] = rival
            entry["own_vs_best_other"] = _compare(runs[mine], runs[rival], "N_target", _seed("v-me-own", d))
        ucb_bd = _runs(metrics, d, bandit("eagle", "ucb-bd"))
        ucb_be = _runs(metrics, d, bandit("eagle", "ucb-be"))
        entry["ucb_bd_MAT"], entry["ucb_be_MAT"] = _pooled(ucb_bd)["MAT"], _pooled(ucb_be)["MAT"]
        entry["ucb_vs_best"] = _near(_compare(ucb_bd, runs[best], "N_target", _seed("v-me-near", d)))
        entry["bd_vs_be"] = _compare(ucb_bd, ucb_be, "N_target", _seed("v-me-bdbe", d))
        entry["sps_bd_vs_be"] = _compare(_runs(metrics, d, bandit("bandit", "ucb-bd")),
                                         _runs(metrics, d, bandit("bandit", "ucb-be")), "N_target",
                                         _seed("v-sps-bdbe", d))
        per[d] = entry
    return {"drafters": chains, "per_domain": per}


def paper_verdicts(metrics: dict) -> dict[str, Any]:
    return {"specdecpp": specdecpp(metrics), "spectr": spectr(metrics), "cascades": cascades(metrics),
            "banditspec": banditspec(metrics), "metaeagle": metaeagle(metrics)}


# --- markdown --------------------------------------------------------------------------------------------

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
    token = next((r for r in rules if r.startswith("token")), None)
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
    if v.get("cascades"):
        parts += _render_cascades(v["cascades"])
    if v.get("banditspec"):
        parts += _render_banditspec(v["banditspec"])
    if v.get("metaeagle"):
        parts += _render_metaeagle(v["metaeagle"])
    return ["## The papers' claims on this bundle", "",
            "Each claim is checked on this run's own numbers; the interval is a bootstrap 90% interval over prompts, "
            "and a claim is called only where it clears the line.", "", *parts] if parts else []
