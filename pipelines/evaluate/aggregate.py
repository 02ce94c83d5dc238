"""Pool with intervals: per (mode, set, domain, method) the runs' counters summed and rates as ratios of
totals, timed and counted speedups against each prompt's own AR run pooled over prompts with a bootstrap
90% interval, the Eq. 3.1 cost fit, the bandits' regret and best-arm ratio, quality scores; and the
lookups (`select`, `one`, `method_keys`) that claims and render read those rows with."""
from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch

from specdraft.core.hashing import derive_seed
from specdraft.data.quality import PRIMARY_METRIC, SCORED_DOMAINS, score, score_set
from specdraft.decoding.costs.model import fit_costs
from specdraft.decoding.metrics import aggregate
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.timing import bootstrap_ratio
from specdraft.decoding.costs.calibration import Calibration
from specdraft.pipelines.evaluate.methods import MethodKey, key_of, label
from specdraft.pipelines.evaluate.plan import BATCH_SET, Head, Prompt
from specdraft.pipelines.evaluate.run import Record, relative_half_width
from specdraft.pipelines.schema import EvaluateSection


def score_quality(records: list[Record], references: Mapping[tuple[str, str], str | None], tok) -> None:
    """Each sampling-mode run on a scored domain gets its text's quality against the prompt's reference
    (data/quality.py: the domain's primary metric, 0-100): the quality axis of the cascades' trade-off
    (Faster Cascades Figure 2), with the target sampling alone (ar) as its reference point. Greedy runs
    all emit the target's own tokens, so they are not scored. references: (set, prompt id) -> reference
    (an id is unique within its set; the demo world's ids name their set, a user's prompt sets need not)."""
    for r in records:
        ref = references.get((r.set, r.prompt))
        if r.key.mode == "sampling" and r.domain in PRIMARY_METRIC and ref and r.tokens is not None:
            text = tok.decode(r.tokens, skip_special_tokens=True)
            r.quality = score(r.domain, text, ref)[PRIMARY_METRIC[r.domain]]


def target_quality(records: list[Record], prompts: list[Prompt], tok, example_chars: int = 240) -> dict[str, dict]:
    """The target alone on its tasks: its greedy output (the `ar` run, which every lossless method
    reproduces token for token) on the test prompts of each scored domain, against their references
    (data/quality.py, 0-100), and the first prompt's text as an example. A world whose target does not
    do its tasks makes drafting easy for the wrong reason; this is where a reader sees it."""
    test = {p.id: p for p in prompts if p.set == "test"}  # ids are unique within a set
    out: dict[str, dict] = {}
    for domain in SCORED_DOMAINS:
        runs = [r for r in records if r.key.family == "ar" and r.key.mode == "greedy" and r.set == "test"
                and r.domain == domain and r.tokens is not None and test[r.prompt].reference]
        if not runs:
            continue
        texts = [tok.decode(r.tokens, skip_special_tokens=True) for r in runs]
        refs = [test[r.prompt].reference for r in runs]
        prompt_text = tok.decode(list(test[runs[0].prompt].ids), skip_special_tokens=True)
        out[domain] = {"prompts": len(runs),
                       **{k: _r(v) for k, v in score_set(domain, texts, refs).items() if k != "n"},
                       "example": {"prompt": prompt_text[-example_chars:], "output": texts[0][:example_chars],
                                   "reference": refs[0][:example_chars]}}
    return out


def quality_scores(records: list[Record], prompts: list[Prompt], tok,
                   alone: Mapping[str, Mapping[str, list[int]]]) -> dict[str, dict]:
    """Per scored domain, each test prompt's primary quality (data/quality.py, 0-100) of the target's greedy
    output (the `ar` run) and of each drafter decoding alone (greedy; `alone`: drafter -> prompt id -> tokens):
    {domain: {"target": {prompt id: score}, "drafters": {name: {prompt id: score}}}}, the per-prompt data
    claims.quality_gap pairs up. Only prompts every one of them decoded."""
    test = {p.id: p for p in prompts if p.set == "test" and p.domain in PRIMARY_METRIC and p.reference}
    ar = {r.prompt: r.tokens for r in records if r.key.family == "ar" and r.key.mode == "greedy"
          and r.set == "test" and r.prompt in test and r.tokens is not None}

    def primary(pid: str, tokens: list[int]) -> float:
        p = test[pid]
        return _r(score(p.domain, tok.decode(tokens, skip_special_tokens=True), p.reference)[PRIMARY_METRIC[p.domain]])

    out: dict[str, dict] = {}
    for domain in sorted({p.domain for p in test.values()}):
        ids = [i for i, p in test.items() if p.domain == domain and i in ar
               and all(i in by for by in alone.values())]
        if ids:
            out[domain] = {"target": {i: primary(i, ar[i]) for i in ids},
                           "drafters": {n: {i: primary(i, by[i]) for i in ids} for n, by in sorted(alone.items())}}
    return out


def _r(x: float | None) -> float | None:
    """Every number of the report is rounded once, here, so report.md and metrics.json agree."""
    return None if x is None else round(float(x), 3)


@dataclass
class Setup:
    """What `summarize` reports beside the records."""

    cfg: EvaluateSection
    k: int
    own: dict[str, str]
    ofa: str | None
    heads: dict[str, dict[str, Head]]
    sampling: SamplingConfig
    device: str
    n_prompts: int
    n_drafters: int
    arms: list[str]
    notes: list[str]
    seed: int = 0
    n_plan: int = 0
    bundle_cost_ratio: float | None = None  # the c the bandits priced drafts with (the bundle's)


# families of real runs; the others are derived from them
MEASURED = ("ar", "fixed", "specdecpp", "oracle", "router", "bandit", "ceiling")


def derived(records: list[Record], k: int, own: dict[str, str], n_drafters: int) -> list[Record]:
    """Per-prompt views of runs already made: the prompt's own-domain drafter (fixed K and SpecDec++),
    and the hindsight-best drafter at K (highest MAT on that prompt; where every drafter ran at K)."""
    out, by_prompt = [], {}
    for r in records:
        if r.key.mode == "greedy" and r.key.drafter is not None and r.key.drafter == own.get(r.domain):
            if r.key.family == "fixed" and r.key.k == k:
                out.append(dataclasses.replace(r, key=MethodKey("domain", k=k)))
            elif r.key.family == "specdecpp":
                out.append(dataclasses.replace(r, key=MethodKey("domain", policy="specdecpp")))
        if r.key.mode == "greedy" and r.key.family == "fixed" and r.key.k == k:
            by_prompt.setdefault(r.prompt, []).append(r)
    for runs in by_prompt.values():
        if len(runs) == n_drafters:
            best = max(runs, key=lambda r: r.metrics.mat)
            out.append(dataclasses.replace(best, key=MethodKey("hindsight", k=k)))
    return out


def stopping_time_regret(records: list[Record], k: int, arms: list[str]) -> list[dict[str, Any]]:
    """MetaSD Definition 1 per prompt, averaged: tau(bandit) - tau(best fixed arm), in rounds (target calls).

    Greedy decoding makes every method emit the same B tokens, so the stopping times compare directly; the
    best fixed arm is the prompt's own (the instance-dependent regret of MetaSD Theorem 2), taken over the
    bandit's arms. Only prompts where every arm ran at K count.
    Returns [{"key": key fields, "per_domain": {domain or "all": mean}}], one per bandit.
    """
    best: dict[str, dict[str, int]] = {}  # prompt -> arm -> rounds
    for r in records:
        if r.key.mode == "greedy" and r.key.family == "fixed" and r.key.k == k and r.key.drafter in arms:
            best.setdefault(r.prompt, {})[r.key.drafter] = r.metrics.n_target
    gaps: dict[MethodKey, dict[str, list[int]]] = {}
    for r in records:
        taus = best.get(r.prompt, {})
        if r.key.mode == "greedy" and r.key.family in ("bandit", "ceiling") and len(taus) == len(arms):
            for d in (r.domain, "all"):
                gaps.setdefault(r.key, {}).setdefault(d, []).append(r.metrics.n_target - min(taus.values()))
    return [{"key": key.fields(), "per_domain": {d: _r(sum(v) / len(v)) for d, v in by.items()}}
            for key, by in gaps.items()]


def best_arm_ratio(records: list[Record], k: int, arms: list[str]) -> list[dict[str, Any]]:
    """MetaSD Figure 3: per bandit and round t, the share of prompts whose bandit picked the prompt's
    hindsight-best arm (highest MAT at fixed K, first on ties), over the prompts still decoding at t."""
    mats: dict[str, dict[str, float]] = {}
    for r in records:
        if r.key.mode == "greedy" and r.key.family == "fixed" and r.key.k == k and r.key.drafter in arms:
            mats.setdefault(r.prompt, {})[r.key.drafter] = r.metrics.mat
    hits: dict[MethodKey, list[list[int]]] = {}
    for r in records:
        m = mats.get(r.prompt, {})
        if r.key.family != "bandit" or r.arms is None or len(m) != len(arms):
            continue
        best = max(arms, key=lambda n: (m[n], -arms.index(n)))
        rounds = hits.setdefault(r.key, [])
        for t, arm in enumerate(r.arms):
            if t == len(rounds):
                rounds.append([0, 0])
            rounds[t][0] += arm == best
            rounds[t][1] += 1
    return [{"key": key.fields(), "ratio": [_r(h / n) for h, n in rounds], "prompts": [n for _, n in rounds]}
            for key, rounds in hits.items()]


def _spread(pairs: list[tuple[float, float]], seed: int) -> tuple[float | None, float | None, float | None]:
    """The ratio of totals sum(a) / sum(b) over prompts with its bootstrap 90% interval (resampling prompts).
    A pooled ratio, not the median of per-prompt ratios: on a shared CPU one 48-token decode's time moves by
    ~9% between two passes (median; 29% at the 90th percentile), and a median over the 3 prompts of a small
    cell keeps one prompt's noise whole, where the ratio of totals averages every prompt's (
    benchmarks/pipeline/bench_evaluate_load.py --estimators compares estimators on the same runs)."""
    pairs = [(a, b) for a, b in pairs if b > 0]
    if not pairs:
        return None, None, None
    s = bootstrap_ratio(pairs, seed)
    return _r(s.median), _r(s.lo), _r(s.hi)


def mean_interval(xs: list[float], seed: int, n_boot: int = 1000) -> tuple[float, float]:
    """Bootstrap 90% interval of a mean (quality scores are often 0/100: a median would hide the rate)."""
    rng = np.random.default_rng(seed)
    a = np.asarray(xs, dtype=float)
    means = a[rng.integers(0, len(a), (n_boot, len(a)))].mean(axis=1)
    return _r(np.quantile(means, 0.05)), _r(np.quantile(means, 0.95))


def _against(group: list[Record], base_of: Mapping[str, Record], measure: Callable[[Record], float]
             ) -> list[tuple[float, float]]:
    """Per run whose prompt (or batch) has a baseline run: (the baseline's measure scaled to the run's number
    of tokens, the run's measure), the pairs a pooled speedup is the ratio of totals of."""
    pairs = []
    for r in group:
        base = base_of.get(r.prompt)
        if base is None or not r.metrics.n_generated or not base.metrics.n_generated:
            continue
        scale = r.metrics.n_generated / base.metrics.n_generated  # the baseline's cost of the run's number of tokens
        pairs.append((measure(base) * scale, measure(r)))
    return pairs


def _row(group: list[Record], ar: dict[str, Record], calib: Calibration, seed: int) -> dict[str, Any]:
    """Counts pooled as ratios of totals; speedups against each prompt's own AR run (AR's time per token times
    the method's tokens), pooled as the ratio of totals over prompts with its bootstrap 90% interval."""
    m = aggregate(r.metrics for r in group)
    first = group[0]
    row = {**first.key.fields(), "set": first.set, "domain": first.domain, "prompts": len(group),
           "N": m.n_generated, "N_target": m.n_target, "N_draft": m.n_draft, "N_discarded": m.n_discarded,
           "MAT": _r(m.mat), "discard_rate": _r(m.discard_rate), "verification_rate": _r(m.verification_rate),
           "time_s": _r(sum(r.time for r in group)), "wall_s": _r(sum(r.wall for r in group)),
           "counted_s": _r(sum(calib.cost(r) for r in group))}
    row["tokens_per_s"] = _r(m.n_generated / sum(r.time for r in group)) if sum(r.time for r in group) > 0 else None
    row["counted_tokens_per_s"] = _r(m.n_generated / row["counted_s"]) if row["counted_s"] else None
    scored = [r.quality for r in group if r.quality is not None]
    if scored:  # mean over prompts, with its bootstrap 90% interval
        row["quality"], row["quality_n"] = _r(statistics.fmean(scored)), len(scored)
        row["quality_lo"], row["quality_hi"] = mean_interval(scored, seed)
    timed = _against(group, ar, lambda r: r.time)
    wall = _against(group, ar, lambda r: r.wall)
    counted = _against(group, ar, calib.cost)
    row["speedup"], row["speedup_lo"], row["speedup_hi"] = _spread(timed, seed)
    row["counted_speedup"], row["counted_speedup_lo"], row["counted_speedup_hi"] = _spread(counted, seed)
    row["wall_speedup"], row["wall_speedup_lo"], row["wall_speedup_hi"] = _spread(wall, seed)
    # one prompt has no interval to speak of (its bootstrap is one point)
    row["timed_counted_disagree"] = len(timed) > 1 and intervals_disagree(row, "speedup", "counted_speedup")
    return row


def intervals_disagree(row: dict[str, Any], a: str, b: str) -> bool:
    """The intervals of two estimates of one speedup do not overlap (the timed one and the counted one: the
    counts are exact, so a gap means the calibration, or the timing, is off for that method)."""
    bounds = [row.get(f"{n}_{e}") for n in (a, b) for e in ("lo", "hi")]
    if any(x is None for x in bounds):
        return False
    a_lo, a_hi, b_lo, b_hi = bounds
    return a_hi < b_lo or b_hi < a_lo


def timing_summary(records: list[Record], cfg: EvaluateSection, device: str) -> dict[str, Any]:
    """How the runs were timed: the timer, the warm-up, the passes per run (planned, cap, taken) and the
    share of repeatable runs whose 90% interval of the mean time reached +-repeat_ci."""
    repeated = [r for r in records if not r.key.stream]  # a stream bandit's run is timed once
    passes = [len(r.times) for r in repeated]
    narrow = [relative_half_width([t.time for t in r.times]) <= cfg.repeat_ci for r in repeated]
    return {"timer": "cuda events" if device.startswith("cuda") else "process CPU time",
            "warmup": cfg.warmup, "repeats": cfg.repeats, "repeats_max": cfg.repeats_max or cfg.repeats,
            "repeat_ci": cfg.repeat_ci, "runs": len(repeated),
            "passes_mean": _r(statistics.fmean(passes)) if passes else None, "passes_max": max(passes, default=None),
            "narrow_share": _r(sum(narrow) / len(narrow)) if narrow else None}


def _run_entry(r: Record, calib: Calibration) -> dict[str, Any]:
    """One run's raw numbers for metrics.json: counts, every repeat's times, its counted cost."""
    m = r.metrics
    return {**r.key.fields(), "prompt": r.prompt, "set": r.set, "domain": r.domain, "run_drafter": r.drafter,
            "N": m.n_generated, "N_target": m.n_target, "N_draft": m.n_draft, "N_discarded": m.n_discarded,
            "drafted": m.drafted, "counted_s": calib.cost(r), "time_s": r.time,
            "repeats": [t.as_dict() for t in r.times], "arms": r.arms, "switch_s": r.switch_s, "quality": r.quality}


def summarize(records: list[Record], calib: Calibration, setup: Setup) -> dict[str, Any]:
    """The measured part of the metrics dict report.md, metrics.json and the plots are made from (the
    claims are added to it by claims.judge)."""
    k_main = setup.k
    batched = [r for r in records if r.set == BATCH_SET]  # throughput runs: their own rows (`throughput`)
    records = [r for r in records if r.set != BATCH_SET]
    all_records = records + derived(records, k_main, setup.own, setup.n_drafters)
    groups: dict[tuple, list[Record]] = {}
    for r in all_records:
        for domain in (r.domain, "all"):  # per domain, and pooled over the set's domains
            groups.setdefault((r.key.mode, r.set, domain, r.key), []).append(dataclasses.replace(r, domain=domain))
    ar_of = {(r.key.mode, r.prompt): r for r in records if r.key.family == "ar"}
    rows = []
    for (mode, s, domain, key), g in groups.items():
        ar = {p: rec for (m, p), rec in ar_of.items() if m == mode}
        rows.append(_row(g, ar, calib, derive_seed(setup.seed, "bootstrap", mode, s, domain)))
    spec = [r for r in records if r.key.mode == "greedy" and r.key.family in MEASURED and r.key.family != "ar"]
    cost_fit = None
    if len(spec) >= 2:
        # Eq. 3.1 over every greedy speculative run, with a constant per prompt (its prefill, its context):
        # robust time ~ t_draft N_draft + t_target N_target + a_prompt
        prompts = [(r.set, r.prompt) for r in spec]
        fit = fit_costs([(r.metrics.n_draft, r.metrics.n_target, r.time) for r in spec], prompts)
        wall = fit_costs([(r.metrics.n_draft, r.metrics.n_target, r.wall) for r in spec], prompts)
        cost_fit = {"t_draft_ms": _r(fit.t_draft * 1e3), "t_target_ms": _r(fit.t_target * 1e3),
                    "cost_ratio": _r(fit.cost_ratio) if fit.t_target > 0 else None, "r2": _r(fit.r2),
                    "r2_within": _r(fit.r2_within), "runs": fit.n_rows, "prompts": len(set(prompts)),
                    "wall_r2": _r(wall.r2)}
    cfg = setup.cfg
    metrics = {
        "config": dataclasses.asdict(cfg), "k": k_main, "device": setup.device, "prompts": setup.n_prompts,
        "plan_runs": setup.n_plan, "repeats": cfg.repeats, "threads": torch.get_num_threads(),
        "timing": (timing := timing_summary(records, cfg, setup.device)), "timer": timing["timer"],
        "sampling": {"temperature": setup.sampling.temperature, "top_k": setup.sampling.top_k,
                     "top_p": setup.sampling.top_p},
        "drafters": {"own": setup.own, "ofa": setup.ofa}, "n_drafters": setup.n_drafters, "bandit_arms": setup.arms,
        "stopping_regret": stopping_time_regret(records, k_main, setup.arms),
        "heads": {mode: {n: {"threshold": h.threshold, "k_max": h.k_max, "name": h.name} for n, h in by.items()}
                  for mode, by in setup.heads.items()},
        "calibration": calib.as_dict(), "bundle_cost_ratio": setup.bundle_cost_ratio,
        "rows": rows, "cost_fit": cost_fit, "best_arm_ratio": best_arm_ratio(records, k_main, setup.arms),
        "switch_seconds": _switch_seconds(records), "notes": setup.notes,
        "runs": [_run_entry(r, calib) for r in records],
        "throughput": throughput(batched, setup.seed),
    }
    return metrics


def throughput(records: list[Record], seed: int) -> dict[str, Any] | None:
    """The throughput rows (docs/algorithms.md#batched-throughput): per batch size B and method, the batches'
    counts summed (MAT = N / N_target per row, pooled), tokens/s (tokens over the batches' summed time, each
    batch's time the mean over its passes) and the speedup over batched AR at the same B: the ratio of totals
    over the batches with its bootstrap 90% interval (resampling batches), as the per-prompt rows pool
    prompts. None without batch runs. `runs`: every batch run's per-row counts and every pass's times."""
    if not records:
        return None
    groups: dict[MethodKey, list[Record]] = {}
    for r in records:
        groups.setdefault(r.key, []).append(r)
    ar = {r.prompt: r for r in records if r.key.policy == "ar"}  # batch ids name their B: one AR run per batch
    rows = []
    for key, g in groups.items():
        m = aggregate(r.metrics for r in g)
        time_s, wall_s = sum(r.time for r in g), sum(r.wall for r in g)
        row = {**key.fields(), "batch_size": dict(key.params)["batch"], "batches": len(g),
               "prompts": sum(len(r.rows or ()) for r in g), "N": m.n_generated, "N_target": m.n_target,
               "N_draft": m.n_draft, "N_discarded": m.n_discarded, "MAT": _r(m.mat), "time_s": _r(time_s),
               "wall_s": _r(wall_s), "tokens_per_s": _r(m.n_generated / time_s) if time_s > 0 else None,
               "wall_tokens_per_s": _r(m.n_generated / wall_s) if wall_s > 0 else None}
        boot = derive_seed(seed, "bootstrap", "throughput", json.dumps(key.fields(), sort_keys=True))
        row["speedup"], row["speedup_lo"], row["speedup_hi"] = _spread(_against(g, ar, lambda r: r.time), boot)
        row["wall_speedup"], row["wall_speedup_lo"], row["wall_speedup_hi"] = _spread(
            _against(g, ar, lambda r: r.wall), boot)
        rows.append(row)
    passes = [len(r.times) for r in records]
    first = records[0].key.params  # every batch size decodes the same prompts: list them once, in row order
    return {"batch_sizes": sorted({row["batch_size"] for row in rows}),
            "prompt_ids": [p for r in records if r.key.policy == "ar" and r.key.params == first for p in r.row_prompts],
            "passes_mean": _r(statistics.fmean(passes)), "rows": rows,
            "runs": [{**r.key.fields(), "batch": r.prompt, "row_prompts": r.row_prompts, "seed": r.seed,
                      "N": r.metrics.n_generated, "N_target": r.metrics.n_target, "N_draft": r.metrics.n_draft,
                      "N_discarded": r.metrics.n_discarded, "time_s": r.time,
                      "rows": [{"N": x.n_generated, "N_target": x.n_target, "N_draft": x.n_draft,
                                "N_discarded": x.n_discarded} for x in r.rows or ()],
                      "repeats": [t.as_dict() for t in r.times]} for r in records]}


def _switch_seconds(records: Iterable[Record]) -> list[dict[str, Any]]:
    total: dict[MethodKey, float] = {}
    for r in records:
        if r.arms is not None and r.key.family == "bandit":
            total[r.key] = total.get(r.key, 0.0) + r.switch_s
    return [{"key": k.fields(), "seconds": _r(v)} for k, v in total.items()]


# --- reading the rows back: what claims and render look methods up with ---------------------------------

def select(metrics: dict, **where) -> list[dict]:
    return [r for r in metrics["rows"] if all(r.get(k) == v for k, v in where.items())]


def one(metrics: dict, **where) -> dict | None:
    rows = select(metrics, **where)
    return rows[0] if rows else None


def set_domains(metrics: dict, set_name: str, mode: str = "greedy") -> list[str]:
    return sorted({r["domain"] for r in select(metrics, mode=mode, set=set_name)} - {"all"}) + ["all"]


def method_keys(metrics: dict, families: tuple[str, ...], **where) -> list[dict]:
    """Key dicts of the methods of the given families in first-seen order, families in the given order."""
    seen: dict[tuple, tuple[int, dict]] = {}
    for r in metrics["rows"]:
        if r["family"] in families and all(r.get(k) == v for k, v in where.items()):
            key = key_of(r)
            seen.setdefault(json.dumps(key, sort_keys=True), (families.index(r["family"]), key))
    return [key for _, key in sorted(seen.values(), key=lambda x: (x[0], label(x[1])))]


# the measured throughput rows' names in `specdraft predict`'s table (decoding/costs/throughput.py)
PREDICTED_NAME = {"ar": lambda k: "AR", "fixed": lambda k: f"K={k}", "batch-aware-lockstep": lambda k: "batch-aware lockstep",
                  "global-budget": lambda k: f"global budget K={k}"}


def beside_measured(predicted: dict, throughput: dict) -> dict:
    """`predicted` (decoding.costs.throughput.predict_throughput) with each prediction's measured tokens/s and the
    relative error predicted / measured - 1, where the throughput rows ran the same method at that B."""
    spec = next((x["method"] for x in predicted["predictions"] if x["method"].startswith("SpecDec++")), None)
    measured = {}
    for r in throughput["rows"]:
        name = spec if r["policy"] == "specdecpp" else PREDICTED_NAME.get(r["policy"], lambda k: None)(r["k"])
        if name is not None and r["tokens_per_s"]:
            measured[(r["batch_size"], name)] = r["tokens_per_s"]
    out = []
    for x in predicted["predictions"]:
        got = measured.get((x["batch"], x["method"]))
        out.append({**x, "measured_tokens_per_s": got, "error": _r(x["tokens_per_s"] / got - 1) if got else None})
    return {**predicted, "predictions": out}
