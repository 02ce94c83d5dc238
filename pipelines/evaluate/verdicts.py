"""The expected effects and the papers' claims, in words: what claims.py judged from the metrics (each verdict
with its interval), as report.md's sentences and small tables."""
from __future__ import annotations

from specdraft.decoding.cascades import DISPLAY_NAMES as CASCADE_NAMES
from specdraft.decoding.timing import Spread, verdict
from specdraft.pipelines.evaluate.cells import WORD, compared, fmt, table
from specdraft.pipelines.evaluate.claims import NEAR_BEST, paper_verdicts
from specdraft.pipelines.evaluate.methods import label


def effect_lines(metrics: dict) -> list[str]:
    """Each effect is claimed only where its 90% interval over prompts clears the line; else 'within noise'."""
    e, lines = metrics["effects"], []
    spec = e["specialised_win_in_domain"]
    if spec:
        by = {v: [d for d, x in spec.items() if x["holds"] == v] for v in ("above", "below", "within noise")}
        parts = []
        if by["above"]:
            parts.append("yes on " + ", ".join(f"{d} ({compared(spec[d]['MAT_ratio'])})" for d in by["above"]))
        if by["below"]:
            parts.append("NOT on " + ", ".join(f"{d} (best: {spec[d]['best_other']}; own / best "
                                               f"{compared(spec[d]['MAT_ratio'])})" for d in by["below"]))
        if by["within noise"]:
            parts.append("within noise on " + ", ".join(f"{d} ({compared(spec[d]['MAT_ratio'])})"
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
                + ", ".join(f"{d} {compared(x['ratio'])}" for d, x in per.items())
                + f"); of the best single drafter per domain: {word[v['holds_vs_single']]} ("
                + ", ".join(f"{d} {compared(x['ratio_single'])}" for d, x in per.items())
                + "); beats OFA on all domains pooled: "
                + {"above": "yes", "below": "no", "within noise": "within noise", None: "-"}[v["beats_ofa"]]
                + f" ({compared(per.get('all', {}).get('vs_OFA'))})."
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
            "- **SpecDec++ beats the best fixed K in counted cost per token (Eq. 3.1 with the verification cost v(K); "
            "speedup of SpecDec++ over that K, 90% interval over prompts):** "
            + "; ".join(f"{word} for {len(xs)} of {len(sd)} domain/drafter pairs"
                        + (": " + ", ".join(f"{x['domain']}/{x['drafter']} vs K={x['best_fixed_k']} "
                                            f"{compared(x['counted'])}" for x in xs) if xs else "")
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


def _verdict_counts(items: list[tuple[str, dict | None]]) -> str:
    """'yes for 2 (a, b); within noise for 3 (...)' from (name, comparison) pairs."""
    by: dict[str, list[str]] = {}
    for name, c in items:
        by.setdefault(c["verdict"] if c else None, []).append(f"{name} {compared(c)}")
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
            + ", ".join(f"{e['domain']}/{e['drafter']} {compared(e.get('vs_oracle'))}" for e in v) + ".", ""]


def _render_spectr(v: dict) -> list[str]:
    ks = v["ks"]
    rows = [[d] + [f"{fmt(c['MAT'])} / {fmt(c['counted_speedup']['ratio'] if c.get('counted_speedup') else None)}"
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
            + (f"{said[rise['verdict']]} ({compared(rise)})" if rise else "not measured")
            + ("; " if pooled.get("monotone") else "; not ") + "monotone in the point estimates"
            + ". Per domain: " + _verdict_counts([(d, c) for d, c in verdicts if d != "all"]) + ".", ""]


def _render_quality_gap(v: dict) -> list[str]:
    rows, lines = [], []
    for d, e in v["per_domain"].items():
        t = e["target"]
        rows.append([d, e["prompts"], "target", f"{fmt(t['mean'])} [{fmt(t['lo'])}, {fmt(t['hi'])}]", "-", "-"])
        for n, q in e["drafters"].items():
            rows.append([d, e["prompts"], f"{n} alone", f"{fmt(q['mean'])} [{fmt(q['lo'])}, {fmt(q['hi'])}]",
                         f"{fmt(q['gap'])} [{fmt(q['gap_lo'])}, {fmt(q['gap_hi'])}]", WORD[q["verdict"]]])
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
        out += [f"{d}: the target alone scores {fmt(e['target_quality'])} on {e['target_prompts']} prompts.", "",
                table(["rule", "alpha", "prompts", "quality [interval]", "counted speedup [interval]",
                       "timed speedup [interval]"],
                      [[CASCADE_NAMES.get(p["rule"], p["rule"]), p["alpha"], p["prompts"],
                        f"{fmt(p['quality'])} [{fmt(p['quality_lo'])}, {fmt(p['quality_hi'])}]",
                        compared(p["counted"]), compared(p["timed"])] for p in e["points"]]), ""]
    rules = v["rules"]
    out += ["Table 2 shape: per domain and rule, the best counted speedup at a quality >= the target's (alpha) / "
            "the best quality at a counted speedup >= 1 (alpha); measured points only.", "",
            table(["domain"] + [CASCADE_NAMES.get(r, r) for r in rules],
                  [[d] + [f"{fmt(t['speedup_at_target_quality'])} ({fmt(t['alpha_at_target_quality'])}) / "
                          f"{fmt(t['best_quality_within_target_latency'])} ({fmt(t['alpha_best_quality'])})"
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
            + (f" The target alone scores at most {fmt(floor)} of 100 in any domain: quality is at its floor and "
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
    gaps = ", ".join(f"{d} EAGLE {compared(e['bd_vs_be'])} vs SpS {compared(e['sps_bd_vs_be'])}" for d, e in per.items())
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


# each paper's verdicts (claims.paper_verdicts' keys) in words, in the report's order
CLAIM_TEXT = {"specdecpp": _render_specdecpp, "spectr": _render_spectr, "quality_gap": _render_quality_gap,
              "cascades": _render_cascades, "banditspec": _render_banditspec, "metaeagle": _render_metaeagle}


def render_verdicts(metrics: dict) -> list[str]:
    v = metrics.get("verdicts") or paper_verdicts(metrics)
    parts = [line for name, words in CLAIM_TEXT.items() if v.get(name) for line in words(v[name])]
    return ["## The papers' claims on this bundle", "",
            "Each claim is checked on this run's own numbers; the interval is a bootstrap 90% interval over prompts, "
            "and a claim is called only where it clears the line.", "", *parts] if parts else []
