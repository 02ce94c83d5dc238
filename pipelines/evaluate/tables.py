"""The evaluation report's tables of methods: speedup per method, domain x method (MetaSD Table 3), SpecDec++
against fixed K and the oracle, bandits across prompt sets (Table 6), BD vs BE (Table 7), regret, best-arm ratio,
the further families and EAGLE, and throughput by batch size with what `specdraft predict` foresaw."""
from __future__ import annotations

from specdraft.pipelines.evaluate.aggregate import method_keys, one, select, set_domains
from specdraft.pipelines.evaluate.cells import AGAINST_1, SET_NAMES, ci, compared, decoded_sets, fmt, table, timed
from specdraft.pipelines.evaluate.claims import MIN_PROMPTS, paper_verdicts
from specdraft.pipelines.evaluate.methods import key_of, label
from specdraft.pipelines.schema import BANDITS


def speed_table(metrics: dict) -> str:
    """Every greedy method pooled over the test set: counted speedup and timed speedup (CPU / CUDA time and
    wall time), each pooled over prompts (ratio of totals) with its bootstrap 90% interval."""
    rows = []
    for key in method_keys(metrics, ("fixed", "specdecpp", "oracle", "router", "bandit", "ceiling", "domain",
                                     "hindsight"), mode="greedy", set="test"):
        r = one(metrics, set="test", domain="all", **key)
        if r:
            rows.append([label(key), r["prompts"], r["MAT"], ci(r, "counted_speedup"), timed(r),
                         ci(r, "wall_speedup")])
    return table(["method", "prompts", "MAT", "counted speedup [interval]", "timed speedup [interval]",
                  "wall-clock speedup [interval]"], rows)


def per_domain_table(metrics: dict) -> str:
    """MetaSD Table 3 shape: domain x method, 'MAT / counted speedup / timed speedup'."""
    k = metrics["k"]
    keys = [key for key in method_keys(metrics, ("fixed", "router", "bandit", "ceiling", "hindsight"), mode="greedy",
                                       set="test") if key["k"] in (k, None)]
    rows = []
    for d in set_domains(metrics, "test"):
        row = [d]
        for key in keys:
            r = one(metrics, set="test", domain=d, **key)
            row.append(f"{fmt(r['MAT'])} / {fmt(r['counted_speedup'])} / {fmt(r['speedup'])}"
                       + (" !" if r.get("timed_counted_disagree") else "") if r else "-")
        rows.append(row)
    return table(["domain"] + [label(key) for key in keys], rows) + \
        "\n\n! : the timed and counted speedup intervals of that cell do not overlap."


def stopping_table(metrics: dict, mode: str) -> str:
    drafters = {x["drafter"] for x in select(metrics, mode=mode, family="specdecpp")} | \
        {x["drafter"] for x in select(metrics, mode=mode, family="oracle")}
    rows = []
    for r in metrics["rows"]:
        if r["mode"] == mode and r["set"] == "test" and r["domain"] != "all" \
                and r["family"] in ("fixed", "specdecpp", "oracle") and r["drafter"] in drafters:
            rows.append([r["domain"], r["drafter"], label(r), r["MAT"], r["verification_rate"], r["discard_rate"],
                         r["counted_speedup"], timed(r)])
    rows.sort(key=lambda x: (x[0], x[1], x[2]))
    return table(["domain", "drafter", "method", "MAT", "verification rate", "discard rate", "counted speedup",
                  "timed speedup [interval]"], rows)


def robustness_table(metrics: dict) -> str:
    """MetaSD Table 6 shape: method x (in-domain, perturbed, OOD: the sets decoded), all domains pooled."""
    sets = decoded_sets(metrics)
    rows = [[label(r["key"])] + [r[f"{s}_{v}"] for s in sets for v in ("MAT", "counted_speedup")]
            for r in metrics["headline"]]
    return table(["method"] + [f"{SET_NAMES[s]} {v}" for s in sets for v in ("MAT", "counted speedup")], rows)


FURTHER_FAMILIES = ("spectr", "cascade", "model_free")


def further_table(metrics: dict) -> str | None:
    """SpecTr, speculative cascades and the model-free arms (BanditSpec Table 1's), pooled over the prompts
    they ran on, each speedup against the target alone in the same mode (cascades are lossy: their
    quality is in "The papers' claims" (claims.cascades) and benchmarks/families/bench_cascades.py)."""
    rows = []
    for mode in ("greedy", "sampling"):
        for key in method_keys(metrics, FURTHER_FAMILIES, mode=mode, set="test"):
            r = one(metrics, set="test", domain="all", **key)
            fixed = one(metrics, set="test", domain="all", family="fixed", mode=mode, drafter=key.get("drafter"),
                        k=key.get("k")) if key.get("drafter") else None
            if r:
                rows.append([label(key), mode, r["prompts"], r["MAT"], fixed["MAT"] if fixed else None,
                             ci(r, "counted_speedup"), timed(r)])
    if not rows:
        return None
    return table(["method", "mode", "prompts", "MAT (tokens per target call)", "MAT of its drafter alone at K",
                  "counted speedup [interval]", "timed speedup [interval]"], rows)


def eagle_table(metrics: dict) -> str | None:
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
                    rows.append([s, d, label(key), r["prompts"], r["MAT"], ci(r, "counted_speedup"), timed(r)])
    return table(["set", "domain", "method", "prompts", "MAT (tokens per target call)", "counted speedup [interval]",
                  "timed speedup [interval]"], rows)


def bd_be_table(metrics: dict) -> str | None:
    """MetaSD Table 7 shape: MetaSD-UCB under each reward it ran with (BD, BD argmax, BE), MAT / speedup."""
    variants = [key for key in method_keys(metrics, ("bandit",), mode="greedy", set="test")
                if BANDITS.get(key["bandit"], ("", ""))[1] == "ucb" and not key["stream"]]
    if len(variants) < 2:
        return None
    rows = []
    for d in set_domains(metrics, "test"):
        cells = [one(metrics, set="test", domain=d, **key) for key in variants]
        rows.append([d] + [f"{fmt(c['MAT'])} / {fmt(c['counted_speedup'])}" if c else "-" for c in cells])
    return table(["domain"] + [f"{label(key)}: MAT / counted speedup" for key in variants], rows)


def regret_table(metrics: dict) -> str | None:
    """MetaSD Definition 1: mean stopping-time regret per prompt, in rounds, per domain x bandit."""
    regret = metrics.get("stopping_regret") or []
    if not regret:
        return None
    domains = [d for d in set_domains(metrics, "test") if any(d in v["per_domain"] for v in regret)]
    return table(["bandit"] + domains, [[label(v["key"])] + [v["per_domain"].get(d) for d in domains] for v in regret])


def best_arm_table(metrics: dict) -> str | None:
    ratios = metrics["best_arm_ratio"]
    if not ratios:
        return None
    longest = max(len(v["ratio"]) for v in ratios)
    ts = [t for t in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48) if t <= longest]
    rows = [[label(v["key"])] + [v["ratio"][t - 1] if t <= len(v["ratio"]) else None for t in ts] for v in ratios]
    return table(["bandit"] + [f"round {t}" for t in ts], rows)


def throughput_section(metrics: dict) -> list[str]:
    """Throughput by batch size (docs/algorithms.md#batched-throughput): one table with B as a column, then
    where each method stops paying and whether the adaptive policies hold up where fixed K falls
    (claims.throughput_verdict)."""
    t = metrics.get("throughput")
    if not t:
        return []
    rows = [[r["batch_size"], label(r), r["batches"], r["prompts"], r["N"], r["MAT"], r["tokens_per_s"],
             ci(r), ci(r, "wall_speedup")] for r in t["rows"]]
    v = (metrics.get("verdicts") or paper_verdicts(metrics))["throughput"]
    lines = []
    for m in v["methods"]:
        cells = ", ".join(f"B={c['batch_size']}: {compared({'ratio': c['speedup'], **c})} {AGAINST_1[c['verdict']]}"
                          for c in m["by_b"])
        top = m["pays_up_to"]
        lines.append(f"- **{label(m['key'])}** pays (speedup interval above 1) "
                     + ("at no batch size" if top is None else f"up to B={top}, the largest measured"
                        if top == max(v["batch_sizes"]) else f"up to B={top}") + f": {cells}.")
    if v["fixed_falls_at"]:
        said = [f"{label(a['key'])} at B={a['batch_size']}: over batched AR {compared({'ratio': a['speedup'], **a})} "
                f"{AGAINST_1[a['verdict']]}, over the best fixed K={a['best_fixed_k']} there "
                f"{compared(a['vs_best_fixed'])} {AGAINST_1[(a['vs_best_fixed'] or {}).get('verdict')]}"
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
    rows = [[x["batch"], x["method"], fmt(x["tokens_per_s"]), fmt(x["speedup"]), fmt(x["mean_k"]),
             fmt(x.get("measured_tokens_per_s")), fmt(x.get("error"))] for x in p["predictions"]]
    c = t.get("cost_table") or {}
    return ["Predicted before decoding (`specdraft predict`'s model: the bundle's acceptance summary, "
            f"{p['rounds']} simulated batches of {p['new_tokens']} new tokens per method and B, priced with the decoder's "
            f"own step times profiled at this stage's start on {c.get('device', '?')}, compile {c.get('compile', '?')}; "
            f"prior: first-draft acceptance {fmt(p['prior'])}, head odds {fmt(p.get('odds'))}; the K per batch size it recommends: "
            + ", ".join(f"B={b}: {k}" for b, k in p["k_per_batch_size"].items()) + "):", "",
            table(["B", "method", "predicted tokens/s", "predicted speedup", "drafts per row-round",
                   "measured tokens/s", "predicted / measured - 1"], rows), ""]
