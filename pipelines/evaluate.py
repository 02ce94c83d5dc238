"""Stage `evaluate`: the exported bundle, decoded end to end on held-out prompts, measured.

1. load the bundle through the decoder (`decoding.bundle.load_bundle`: every file's sha256 is checked
   first, so a damaged bundle fails here with one line and no report is written)
2. prompts: per domain the first `prompts_per_domain` prompts of each set in `evaluate.sets` (the
   domains' `test` split, the reworded `perturbed` set and the out-of-domain `ood` set of prompts/sets)
3. per prompt, greedy, every method on the same prompt one after the other (so slow phases of a shared
   machine hit all methods alike):
     AR                      the target alone (the baseline every speedup is measured against)
     <drafter> K=k           one drafter, fixed K (every drafter at the table's K on `per_drafter_sets`;
                             the K sweep for the prompt's domain drafter + OFA, or every drafter)
     <drafter> SpecDec++     the drafter's exported head with its chosen threshold h
     <drafter> oracle        the greedy hindsight oracle (SpecDec++ Thm 4.1), replaying AR's tokens
     router:<kind>           route once per prompt, then fixed K (the routed drafter's run is shared with
                             "<drafter> K=k"; the routing time is added to its wall time)
     bandits                 MetaSD-UCB (BD, BE), UCBSpec, EXP3Spec over every exported drafter, N_max = K,
                             reset per prompt; "(stream)": state kept across each (set, domain) stream
   and on the first `sampling_prompts` test prompts per domain, sampling at the heads' (non-greedy) label
   transform; each mode's SpecDec++ rows use the heads labelled under that mode's own transform:
   AR, fixed K and SpecDec++ for the sweep drafters
4. aggregate per (mode, set, domain, method): counters summed, rates as ratios of totals, speedup =
   tokens/s over AR's on the same prompts; the least-squares t_draft / t_target fit (Eq. 3.1) over all
   greedy speculative runs; the best-arm ratio per bandit round (MetaSD Figure 3)
5. pipelines/report.py writes the tables and plots from exactly that metrics dict

Writes report/: report.md, metrics.json, *.png (pipelines/report.py lists them).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm

from data.prompts import load_prompt_sets
from decoding.autoregressive import generate_autoregressive
from decoding.bundle import Bundle, load_bundle
from decoding.compat import check_k, tokenizer_fingerprint
from decoding.cost_model import fit_from_metrics
from decoding.errors import InputError
from decoding.hashing import derive_seed
from decoding.metrics import GenerationMetrics, aggregate
from decoding.multi import Arm, MultiDrafterSpeculator
from decoding.sampling import SamplingConfig
from decoding.selectors import make_selector
from decoding.speculative import generate_speculative
from decoding.speculator import DrafterSpeculator
from decoding.stopping import FixedK, HindsightOracle, SpecDecPP
from heads.router import load_router
from pipelines.distill_data import fit_prompt
from pipelines.schema import BANDITS, EvaluateSection  # noqa: F401 (EvaluateSection re-exported)
from pipelines.forward_costs import measure_forward_costs
from pipelines.stage import Context



def drafter_roles(bundle: Bundle) -> tuple[dict[str, str], str | None]:
    """(domain -> its specialised drafter (the fewest domains covering it), the OFA drafter (most domains))."""
    by_size = sorted(bundle.drafters.values(), key=lambda d: (len(d.domains), d.name))
    own: dict[str, str] = {}
    for d in by_size:
        if len(d.domains) == 1:
            own.setdefault(d.domains[0], d.name)
    general = [d for d in by_size if len(d.domains) != 1]
    ofa = general[-1].name if general else None
    return own, ofa


@dataclass
class Record:
    mode: str  # greedy | sampling
    prompt: str  # prompt id
    set: str
    domain: str
    method: str
    family: str  # ar | fixed | specdecpp | oracle | router | bandit
    drafter: str | None
    k: int | None
    metrics: GenerationMetrics


def _load_routers(bundle: Bundle, target, tok) -> tuple[dict[str, Any], list[str]]:
    """Each router of the bundle (bundle.routers: name -> entry), or a note on why there are none."""
    entries = {name: e.path for name, e in bundle.routers.items()}
    if not entries:
        return {}, ["no router in the bundle (train-router did not run before export): routing rows skipped"]
    fp = tokenizer_fingerprint(tok)
    return {name: load_router(path, target.get_input_embeddings(), fp) for name, path in sorted(entries.items())}, []


# one round-robin pass over the drafters, then the prompt's hindsight-best one: what any bandit that starts
# with that pass (MetaSD-UCB, UCBSpec) can reach at best on a generation this long
CEILING = "one pass + hindsight drafter"


def _make_bandit(cfg: EvaluateSection, k: int, name: str, drafters: dict[str, torch.nn.Module], seed: int,
                 persistent: bool = False, best_arm: int | None = None) -> MultiDrafterSpeculator:
    """The bandit `name` of BANDITS (or the CEILING, told `best_arm`) over one fixed-K arm per drafter."""
    arms = [Arm(n, DrafterSpeculator(m, FixedK(k)), drafter_key=n) for n, m in drafters.items()]
    if name == CEILING:  # no learning: its reward is never read
        return MultiDrafterSpeculator(arms, make_selector("one-pass-oracle", len(arms), best_arm=best_arm),
                                      reward="be", n_max=k)
    _, selector_name, reward = BANDITS[name]
    params = {"beta": cfg.beta} if selector_name == "ucb" else {"max_len": k}
    if selector_name == "ucbspec":
        params["delta"] = cfg.delta
    return MultiDrafterSpeculator(arms, make_selector(selector_name, len(arms), seed=seed, persistent=persistent,
                                                      **params), reward=reward, n_max=k)


def build(ctx: Context) -> dict:
    cfg = ctx.cfg
    ecfg: EvaluateSection = cfg.evaluate
    ecfg.check()
    seed = cfg.run.seed
    bundle = load_bundle(ctx.input("export"), verify=True)  # one-line InputError on any damage
    if not bundle.drafters:
        raise InputError("the bundle has no drafters; export a run with train-drafters before evaluating")
    k_main = ecfg.k or int(bundle.decoding.get("k", 4))
    check_k(k_main, "evaluate.k")
    device = ecfg.device if ecfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    tok = bundle.load_tokenizer(cfg.target.trust_remote_code)
    target = bundle.load_target(device=device, trust_remote_code=cfg.target.trust_remote_code)
    drafters = {n: bundle.load_drafter(n, device=device, target=target) for n in sorted(bundle.drafters)}
    own, ofa = drafter_roles(bundle)
    routers, notes = _load_routers(bundle, target, tok)
    make_bandit = functools.partial(_make_bandit, ecfg, k_main) if ecfg.bandits else None
    arm_names = sorted(set(own.values())) if ecfg.bandit_arms == "specialists" else list(drafters)
    if len(arm_names) < 2:
        notes.append(f"fewer than 2 single-domain drafters ({arm_names}): the bandits choose among all drafters")
        arm_names = list(drafters)
    arms = {n: drafters[n] for n in arm_names}
    # each mode uses the heads labelled under its own transform (SPEC.md 3); sampling mode decodes at
    # the first non-greedy label transform of the bundle's heads (T=1 when there is none)
    greedy = SamplingConfig(temperature=0.0)
    labelled = sorted({SamplingConfig(**h.label_transform) for by in bundle.heads.values() for h in by.values()},
                      key=lambda t: t.tag)
    sampled = [t for t in labelled if not t.greedy]
    sampling_cfg = sampled[0] if sampled else SamplingConfig(temperature=1.0)
    heads: dict[str, dict[str, tuple]] = {}  # mode -> drafter -> (module, h, k_max, entry)
    for mode, transform in (("greedy", greedy), ("sampling", sampling_cfg)):
        heads[mode] = {}
        for n in drafters:
            name = bundle.head_for(n, transform)
            if name is not None:
                module, _ = bundle.load_head(n, name, device=device)
                entry = bundle.heads[n][name]
                heads[mode][n] = (module, entry.threshold, entry.k_max or int(bundle.decoding.get("k_max", 20)), entry)
        lacking = sorted(n for n in drafters if n not in heads[mode] and bundle.heads.get(n))
        if lacking:
            notes.append(f"no head labelled under {transform.tag} for {', '.join(lacking)}: their {mode} SpecDec++ rows "
                         f"are skipped (add {transform.as_dict()} to acceptance_data.label_transforms)")
    eos = tok.eos_token_id
    ctx_len = getattr(target.config, "max_position_embeddings", None) or 10**9
    max_prompt = min(ecfg.max_prompt_tokens, ctx_len - ecfg.max_new_tokens - 1)

    sets = load_prompt_sets(ctx.input("prepare-data"))
    prompts = []  # (set, domain, id, ids)
    for s in ecfg.sets:
        if s not in sets:
            notes.append(f"prompt set '{s}' does not exist in prompts/sets: skipped")
            continue
        taken: dict[str, int] = {}
        for row in sets[s]:
            if taken.get(row["domain"], 0) < ecfg.prompts_per_domain:
                taken[row["domain"]] = taken.get(row["domain"], 0) + 1
                ids, _ = fit_prompt(tok(row["prompt"])["input_ids"], max_prompt, "truncate", row["id"])
                prompts.append((s, row["domain"], row["id"], ids, taken[row["domain"]] - 1))
    if not prompts:
        raise InputError(f"no prompts in sets {ecfg.sets} of {ctx.input('prepare-data')}; check evaluate.sets")

    def sweep_for(domain: str) -> list[str]:
        if ecfg.sweep_drafters == "all":
            return list(drafters)
        return [n for n in dict.fromkeys([own.get(domain), ofa]) if n is not None]

    def per_drafter_for(s: str, domain: str) -> list[str]:
        if s in ecfg.per_drafter_sets:
            return list(drafters)
        return [n for n in dict.fromkeys([own.get(domain), ofa]) if n is not None]

    def n_runs(s: str, domain: str, i: int) -> int:
        """Runs planned for one prompt (the progress bar's total; a routed drafter may add one)."""
        sweep = sweep_for(domain)
        fixed_runs = {(n, k_main) for n in per_drafter_for(s, domain)} | {(n, k) for n in sweep for k in ecfg.ks}
        n = 1 + len(fixed_runs) + sum(d in heads["greedy"] for d in sweep) + len(sweep)
        n += len(routers) + (len(ecfg.bandits) + len(ecfg.stream_bandits) if make_bandit else 0)
        n += bool(make_bandit and s in ecfg.per_drafter_sets)  # the one-pass ceiling
        if s == "test" and i < ecfg.sampling_prompts:
            n += 1 + len(sweep) + sum(d in heads["sampling"] for d in sweep)
        return n

    records: list[Record] = []
    best_arm_hits: dict[str, list[list[int]]] = {}  # bandit label -> per round t: [hits, prompts]
    switch_s: dict[str, float] = {}
    streams: dict[tuple[str, str, str], Any] = {}  # (bandit, set, domain) -> a speculator that keeps its state
    bar = tqdm(total=sum(n_runs(s, d, i) for s, d, _, _, i in prompts), desc="evaluate", unit="run")
    for s, domain, pid, ids, i in prompts:
        def add(mode, method, family, drafter, k, m):
            records.append(Record(mode, pid, s, domain, method, family, drafter, k, m))
            bar.update(1)

        ar = generate_autoregressive(target, ids, ecfg.max_new_tokens, greedy, eos)
        add("greedy", "AR", "ar", None, None, ar.metrics)
        fixed: dict[tuple[str, int], GenerationMetrics] = {}

        def run_fixed(name: str, k: int) -> GenerationMetrics:
            if (name, k) not in fixed:
                res = generate_speculative(target, DrafterSpeculator(drafters[name], FixedK(k)), ids,
                                           ecfg.max_new_tokens, greedy, eos)
                fixed[name, k] = res.metrics
                add("greedy", f"{name} K={k}", "fixed", name, k, res.metrics)
            return fixed[name, k]

        for name in per_drafter_for(s, domain):
            run_fixed(name, k_main)
        for name in sweep_for(domain):
            for k in ecfg.ks:
                run_fixed(name, k)
            if name in heads["greedy"]:
                head, h, k_max, _ = heads["greedy"][name]
                res = generate_speculative(target, DrafterSpeculator(drafters[name], SpecDecPP(head, h, k_max)), ids,
                                           ecfg.max_new_tokens, greedy, eos)
                add("greedy", f"{name} SpecDec++", "specdecpp", name, None, res.metrics)
            oracle = DrafterSpeculator(drafters[name], HindsightOracle(list(ids) + ar.tokens))
            res = generate_speculative(target, oracle, ids, ecfg.max_new_tokens, greedy, eos)
            add("greedy", f"{name} oracle", "oracle", name, None, res.metrics)
        for kind, router in routers.items():
            t0 = time.perf_counter()
            name = router.route(ids)
            route_s = time.perf_counter() - t0
            if (name, k_main) not in fixed:  # a drafter n_runs did not plan for on this prompt
                bar.total += 1
                bar.refresh()
            m = run_fixed(name, k_main)
            m = dataclasses.replace(m, drafted=list(m.drafted), accepted=list(m.accepted),
                                    time_total=m.time_total + route_s, time_draft=m.time_draft + route_s)
            add("greedy", f"router:{kind}", "router", name, k_main, m)
        if make_bandit:
            names = list(arms)
            mats = {n: run_fixed(n, k_main).mat for n in names} if s in ecfg.per_drafter_sets else None
            best = max(names, key=lambda n: (mats[n], -names.index(n))) if mats else None
            runs = [(BANDITS[b][0], make_bandit(b, arms, derive_seed(seed, pid, b))) for b in ecfg.bandits]
            for b in ecfg.stream_bandits:
                if (b, s, domain) not in streams:
                    streams[b, s, domain] = make_bandit(b, arms, derive_seed(seed, s, domain, b, "stream"), True)
                runs.append((f"{BANDITS[b][0]} (stream)", streams[b, s, domain]))
            if best is not None:
                runs.append((CEILING, make_bandit(CEILING, arms, 0, best_arm=names.index(best))))
            for label, spec in runs:
                res = generate_speculative(target, spec, ids, ecfg.max_new_tokens, greedy, eos)
                add("greedy", label, "ceiling" if label == CEILING else "bandit", None, k_main, res.metrics)
                if label == CEILING:
                    continue
                switch_s[label] = switch_s.get(label, 0.0) + float(getattr(spec, "switch_seconds", 0.0))
                if best is not None:
                    rounds = best_arm_hits.setdefault(label, [])
                    for t, arm in enumerate(names[h["arm"]] for h in spec.history):
                        if t == len(rounds):
                            rounds.append([0, 0])
                        rounds[t][0] += arm == best
                        rounds[t][1] += 1
        if s == "test" and i < ecfg.sampling_prompts:
            def gen(seed_name):
                return torch.Generator().manual_seed(derive_seed(seed, pid, "sampling", seed_name))

            res = generate_autoregressive(target, ids, ecfg.max_new_tokens, sampling_cfg, eos, gen("AR"))
            add("sampling", "AR", "ar", None, None, res.metrics)
            for name in sweep_for(domain):
                res = generate_speculative(target, DrafterSpeculator(drafters[name], FixedK(k_main)), ids,
                                           ecfg.max_new_tokens, sampling_cfg, eos, gen(f"{name} K={k_main}"))
                add("sampling", f"{name} K={k_main}", "fixed", name, k_main, res.metrics)
                if name in heads["sampling"]:
                    head, h, k_max, _ = heads["sampling"][name]
                    res = generate_speculative(target, DrafterSpeculator(drafters[name], SpecDecPP(head, h, k_max)),
                                               ids, ecfg.max_new_tokens, sampling_cfg, eos, gen(f"{name} SpecDec++"))
                    add("sampling", f"{name} SpecDec++", "specdecpp", name, None, res.metrics)
    bar.close()

    metrics = summarize(records, ecfg, k_main, own, ofa, heads, best_arm_hits, switch_s, notes, sampling_cfg,
                        device, len(prompts), len(drafters), arm_names)
    from pipelines.report import write_report

    metrics["forward_costs"] = measure_forward_costs(target, drafters[ofa or sorted(drafters)[0]], k_main, seed=seed)
    write_report(metrics, ctx.out)
    return {"headline": metrics["headline"], "cost_fit": metrics["cost_fit"], "runs": len(records)}


def _r(x: float) -> float:
    """Every number of the report is rounded once, here, so report.md and metrics.json agree."""
    return round(float(x), 3)


def _row(group: list[Record], ar: GenerationMetrics | None) -> dict[str, Any]:
    m = aggregate(r.metrics for r in group)
    first = group[0]
    row = {"mode": first.mode, "set": first.set, "domain": first.domain, "method": first.method,
           "family": first.family, "drafter": first.drafter, "k": first.k, "prompts": len(group),
           "N": m.n_generated, "N_target": m.n_target, "N_draft": m.n_draft, "N_discarded": m.n_discarded,
           "MAT": _r(m.mat), "discard_rate": _r(m.discard_rate), "verification_rate": _r(m.verification_rate),
           "tokens_per_s": _r(m.tokens_per_s), "time_s": _r(m.time_total)}
    row["speedup"] = _r(m.tokens_per_s / ar.tokens_per_s) if ar is not None and ar.tokens_per_s > 0 else None
    return row


# families of real runs; the others are derived from them
MEASURED = ("ar", "fixed", "specdecpp", "oracle", "router", "bandit", "ceiling")


def _derived(records: list[Record], k: int, own: dict[str, str], n_drafters: int) -> list[Record]:
    """Per-prompt views of runs already made: the prompt's own-domain drafter (fixed K and SpecDec++),
    and the hindsight-best drafter at K (highest MAT on that prompt; where every drafter ran at K)."""
    out, by_prompt = [], {}
    for r in records:
        if r.mode == "greedy" and r.drafter is not None and r.drafter == own.get(r.domain):
            if r.family == "fixed" and r.k == k:
                out.append(dataclasses.replace(r, method=f"domain drafter K={k}", family="domain"))
            elif r.family == "specdecpp":
                out.append(dataclasses.replace(r, method="domain drafter SpecDec++", family="domain"))
        if r.mode == "greedy" and r.family == "fixed" and r.k == k:
            by_prompt.setdefault(r.prompt, []).append(r)
    for runs in by_prompt.values():
        if len(runs) == n_drafters:
            best = max(runs, key=lambda r: r.metrics.mat)
            out.append(dataclasses.replace(best, method=f"hindsight-best drafter K={k}", family="hindsight"))
    return out


def stopping_time_regret(records: list[Record], k: int, arms: list[str]) -> dict[str, dict[str, float]]:
    """MetaSD Definition 1 per prompt, averaged: tau(bandit) - tau(best fixed arm), in rounds (target calls).

    Greedy decoding makes every method emit the same B tokens, so the stopping times compare directly; the
    best fixed arm is the prompt's own (the instance-dependent regret of MetaSD Theorem 2), taken over the
    bandit's arms. Only prompts where every arm ran at K count. Returns {bandit: {domain or "all": mean}}.
    """
    best: dict[str, dict[str, int]] = {}  # prompt -> arm -> rounds
    for r in records:
        if r.mode == "greedy" and r.family == "fixed" and r.k == k and r.drafter in arms:
            best.setdefault(r.prompt, {})[r.drafter] = r.metrics.n_target
    gaps: dict[str, dict[str, list[int]]] = {}
    for r in records:
        taus = best.get(r.prompt, {})
        if r.mode == "greedy" and r.family in ("bandit", "ceiling") and len(taus) == len(arms):
            for d in (r.domain, "all"):
                gaps.setdefault(r.method, {}).setdefault(d, []).append(r.metrics.n_target - min(taus.values()))
    return {m: {d: _r(sum(v) / len(v)) for d, v in by.items()} for m, by in gaps.items()}


def summarize(records: list[Record], ecfg: EvaluateSection, k_main: int, own: dict[str, str], ofa: str | None,
              heads: dict, best_arm_hits: dict, switch_s: dict, notes: list[str], sampling_cfg: SamplingConfig,
              device: str, n_prompts: int, n_drafters: int, bandit_arms: list[str]) -> dict[str, Any]:
    """The metrics dict report.md, metrics.json and the plots are all made from."""
    records = records + _derived(records, k_main, own, n_drafters)
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        for domain in (r.domain, "all"):  # per domain, and pooled over the set's domains
            groups.setdefault((r.mode, r.set, domain, r.method), []).append(dataclasses.replace(r, domain=domain))
    ar_of = {key[:3]: aggregate(r.metrics for r in g) for key, g in groups.items() if key[3] == "AR"}
    rows = [_row(g, ar_of.get(key[:3])) for key, g in groups.items()]
    spec_runs = [r.metrics for r in records if r.mode == "greedy" and r.family in MEASURED and r.family != "ar"]
    cost_fit = None
    if len(spec_runs) >= 2:
        fit = fit_from_metrics(spec_runs)
        cost_fit = {"t_draft_ms": _r(fit.t_draft * 1e3), "t_target_ms": _r(fit.t_target * 1e3),
                    "cost_ratio": _r(fit.cost_ratio) if fit.t_target > 0 else None, "r2": _r(fit.r2),
                    "runs": fit.n_rows}
    best_arm_ratio = {label: [_r(h / n) for h, n in rounds] for label, rounds in best_arm_hits.items()}
    best_arm_prompts = {label: [n for _, n in rounds] for label, rounds in best_arm_hits.items()}
    metrics = {
        "config": dataclasses.asdict(ecfg), "k": k_main, "device": device, "prompts": n_prompts,
        "sampling": {"temperature": sampling_cfg.temperature, "top_k": sampling_cfg.top_k, "top_p": sampling_cfg.top_p},
        "drafters": {"own": own, "ofa": ofa}, "bandit_arms": bandit_arms,
        "stopping_regret": stopping_time_regret(records, k_main, bandit_arms),
        "heads": {mode: {n: {"threshold": h[1], "k_max": h[2], "name": h[3].name} for n, h in by.items()}
                  for mode, by in heads.items()},
        "rows": rows, "cost_fit": cost_fit, "best_arm_ratio": best_arm_ratio, "best_arm_prompts": best_arm_prompts,
        "switch_seconds": {k: _r(v) for k, v in switch_s.items()}, "notes": notes,
    }
    from pipelines.report import effects, headline_rows

    metrics["effects"] = effects(metrics)
    metrics["headline"] = headline_rows(metrics)
    return metrics


if __name__ == "__main__":
    from pipelines.cli import stage_main

    stage_main("evaluate")
