"""Stage `evaluate`: the exported bundle, decoded end to end on held-out prompts, measured.

Three steps, each one function:

1. **plan** (`build_plan`): a list of `Run`s, one per (prompt, method). A method is a `MethodKey`, a
   frozen, hashable record of what it is (family, drafter, K, stopping policy, router, bandit, reward,
   sampling mode, and an open `params` for anything else); a run carries a factory that builds its
   speculator (and, for families that need one, the verification distribution) when the loop gets to it.
   The families of the demo, per prompt (greedy unless said):
     ar          the target alone: the baseline every speedup is measured against
     fixed       one drafter, fixed K (every drafter at `k` on `per_drafter_sets`; the K sweep for the
                 prompt's domain drafter + OFA, or every drafter)
     specdecpp   the drafter's exported head with its threshold h (SpecDec++)
     oracle      the greedy hindsight oracle (SpecDec++ Thm 4.1), replaying AR's tokens
     router      route once per prompt, then fixed K (routing is inside the timed call)
     bandit      MetaSD-UCB (BD, BE), UCBSpec, EXP3Spec over the arms, N_max = K, reset per prompt;
                 `stream`: state kept across each (set, domain) stream of prompts (run once: not repeatable)
     ceiling     one round-robin pass over the arms, then the prompt's hindsight-best arm
   and in sampling mode on the first `sampling_prompts` test prompts per domain: ar, fixed, specdecpp
   for the sweep drafters, each SpecDec++ row with the heads labelled under that mode's transform.
2. **run** (`execute`): one loop. Per prompt, `repeats` passes over that prompt's runs, methods
   interleaved (a slow phase of a shared machine hits every method alike). Each whole generate call is
   timed by `decoding.timing.timed_call` (CPU time of this process and wall time on CPU; CUDA events
   on a GPU). Counts come from the first pass (greedy and seeded sampling repeat exactly); every
   pass's times are kept, and a run's time is the mean over its passes (see `Record.time`). After each
   prompt, a few `Calibrator` passes time the target's n-token cached forward for every n a round can
   verify and each drafter's 1-token forward (interleaved; spread through the loop, so they see the
   same load phases as the runs they price).
3. **aggregate** (`summarize`): per (mode, set, domain, method) counters summed and rates as ratios of
   totals; per prompt, the timed speedup (AR's median time per token / the method's) and the counted
   speedup (the same ratio of costs predicted from the run's counts: SpecDec++ Eq. 3.1 with the
   calibrated v(K), i.e. sum over rounds of t_target(K_r + 1) + N_draft t_draft; the prompt's prefill
   and the decoder's own per-round work (sampling, verification, a SpecDec++ head) are not counted, so
   on a small model it sits above the timed one); each pooled over prompts as a ratio of totals with a
   bootstrap 90% interval (resampling prompts). The Eq. 3.1 fit over all greedy speculative runs
   (non-negative least squares on counts and robust times) with its R^2.
   pipelines/report.py makes every label and sentence from that dict: rows carry key fields, never
   display strings.

How to add a family (SpecTr multi-draft, speculative cascades, prompt lookup / REST / suffix, EAGLE...):
write a planner `def plan_myfamily(env: Env, prompt: Prompt) -> list[Run]` that returns one `Run` per
method for that prompt, each with a `MethodKey(family="myfamily", drafter=..., k=..., params=params(
rule="...", alpha=0.3))` and a `build(done) -> Built` factory (`done`: this prompt's earlier results
by key, e.g. AR's tokens); give `Built.verification` for a family whose output follows another
distribution than the target's (cascades). Add the planner to `PLANNERS`, its config to
`EvaluateSection`. The loop, the timing, the aggregation and metrics.json need no change; report.py
labels an unknown family generically (`label`), and a table of its own is a function there.

Writes report/: report.md, metrics.json (rows with key fields, every run's raw repeat times in `runs`),
*.png (pipelines/report.py lists them).
"""
from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch
from tqdm.auto import tqdm

from specdraft.data.chat import row_messages
from specdraft.data.prompts import load_prompt_sets
from specdraft.data.quality import PRIMARY_METRIC, SCORED_DOMAINS, aggregate as aggregate_quality, require_scorers, score
from specdraft.decoding import kv
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.bundle import Bundle, load_bundle
from specdraft.decoding.chat import ChatFormat, end_of_turn_ids, format_prompt
from specdraft.decoding.compat import check_k
from specdraft.core.tokenizers import tokenizer_fingerprint
from specdraft.decoding.cost_model import fit_costs
from specdraft.core.devices import resolve_device
from specdraft.decoding.eagle import EagleSpeculator, TreeShape
from specdraft.core.errors import InputError
from specdraft.core.hashing import derive_seed
from specdraft.decoding.metrics import GenerationMetrics, GenerationResult, aggregate
from specdraft.decoding.arms import ArmResources, build_arm, build_arms
from specdraft.decoding.cascades import cascade_method
from specdraft.decoding.multi import Arm, MultiDrafterSpeculator
from specdraft.decoding.multi_draft import drafter_speculator
from specdraft.decoding.sampling import SamplingConfig
from specdraft.decoding.selectors import make_selector
from specdraft.decoding.speculative import VerificationDistribution, generate_speculative
from specdraft.decoding.speculator import DrafterSpeculator, Speculator
from specdraft.decoding.stopping import FixedK, HindsightOracle, SpecDecPP
from specdraft.decoding.timing import Timing, bootstrap_ratio, quantile, timed_call
from specdraft.drafters.roles import drafter_roles
from specdraft.heads.router import load_router
from specdraft.data.prompts import fit_prompt
from specdraft.pipelines.schema import BANDITS, EvaluateSection  # noqa: F401 (EvaluateSection re-exported)
from specdraft.pipelines.stage import Context


# --- what a method is -------------------------------------------------------------------------------

def params(**kw) -> tuple[tuple[str, Any], ...]:
    """A MethodKey's open settings as sorted (name, value) pairs: hashable, and order-independent."""
    return tuple(sorted(kw.items()))


@dataclass(frozen=True)
class MethodKey:
    """What a method is, as data. Two runs with equal keys are the same method (on different prompts)."""

    family: str  # ar | fixed | specdecpp | oracle | router | bandit | ceiling | domain | hindsight | ...
    mode: str = "greedy"  # greedy | sampling
    drafter: str | None = None  # the one drafter it decodes with, when fixed in advance
    k: int | None = None  # fixed K, or a bandit's N_max
    policy: str | None = None  # a stopping policy named beside K (derived rows: "specdecpp")
    router: str | None = None  # router kind
    bandit: str | None = None  # a key of pipelines.schema.BANDITS
    reward: str | None = None  # the bandit's reward (bd | bd-argmax | be | accepted)
    stream: bool = False  # bandit state kept across the (set, domain) stream of prompts
    params: tuple[tuple[str, Any], ...] = ()  # anything else a family needs (see `params`)

    def fields(self) -> dict[str, Any]:
        """The key as JSON fields (params as a dict): what rows and runs of metrics.json carry."""
        d = dataclasses.asdict(self)
        d["params"] = dict(self.params)
        return d

    @classmethod
    def from_fields(cls, row: Mapping[str, Any]) -> "MethodKey":
        names = [f.name for f in dataclasses.fields(cls)]
        d = {n: row.get(n) for n in names if n in row}
        d["params"] = params(**(row.get("params") or {}))
        d["stream"] = bool(row.get("stream", False))
        return cls(**d)


KEY_FIELDS = tuple(f.name for f in dataclasses.fields(MethodKey))


@dataclass(frozen=True)
class Prompt:
    set: str
    domain: str
    id: str
    ids: tuple[int, ...]
    index: int  # its position among the (set, domain)'s prompts
    reference: str | None = None  # the prompt set's reference response (quality of lossy families)


@dataclass
class Built:
    """What a run's factory hands the loop."""

    speculator: Speculator | None  # None: the target decodes alone (autoregressive)
    drafter: str | None = None  # the drafter chosen at run time (a router's pick), for the record
    verification: VerificationDistribution | None = None  # None: verify against the target's own p


@dataclass(frozen=True)
class Run:
    """One planned generation: a method on a prompt."""

    key: MethodKey
    prompt: Prompt
    build: Callable[[Mapping[MethodKey, GenerationResult]], Built]  # this prompt's earlier results -> Built
    seed: int | None = None  # sampling mode: the CPU generator's seed (the same on every repeat)
    repeatable: bool = True  # False: a run with state that outlives it (stream bandits) runs once


@dataclass
class Record:
    """A run done: its counts (first pass) and every pass's timing."""

    key: MethodKey
    prompt: str
    set: str
    domain: str
    metrics: GenerationMetrics
    times: list[Timing] = field(default_factory=list)
    drafter: str | None = None  # the drafter that decoded it, where one did (a router's pick included)
    arms: list[str] | None = None  # multi-drafter runs: the arm chosen per round
    switch_s: float = 0.0
    tokens: list[int] | None = None  # the generated tokens (first pass)
    quality: float | None = None  # sampling mode, scored domains: data/quality.py's primary metric vs the reference

    @property
    def time(self) -> float:
        """Seconds of the whole call: the mean over its passes. Pooled over prompts as a ratio of totals (`_row`),
        this is the total CPU time of every pass, the timed estimator that moved least between a quiet and a busy
        run of the same plan (benchmarks/RESULTS.md, `bench_evaluate_load.py --estimators`: 63 of 89
        cells within 10%, against 58 for the fastest pass and 42 for the median of per-prompt ratios). The
        fastest of 2-3 passes is itself a noisy extreme; the mean averages the noise away."""
        return statistics.fmean(t.time for t in self.times) if self.times else self.metrics.time_total

    @property
    def wall(self) -> float:
        return statistics.fmean(t.wall for t in self.times) if self.times else self.metrics.time_total


# --- the environment a plan is made in ------------------------------------------------------------------

@dataclass(frozen=True)
class Head:
    module: torch.nn.Module
    threshold: float
    k_max: int
    name: str


@dataclass
class Env:
    """Everything a planner may read: the config, the loaded models and the roles of the drafters."""

    cfg: EvaluateSection
    seed: int
    k: int
    target: torch.nn.Module
    drafters: dict[str, torch.nn.Module]
    own: dict[str, str]
    ofa: str | None
    arms: list[str]  # the bandits' arms
    routers: dict[str, Any]
    heads: dict[str, dict[str, Head]]  # mode -> drafter -> the head labelled under that mode's transform
    sampling: dict[str, SamplingConfig]  # mode -> how it samples
    streams: dict[tuple, Any] = field(default_factory=dict)  # stream bandits' speculators, kept across prompts
    datastore: Any = None  # the bundle's REST / suffix datastore (decoding.datastore.SuffixIndex), if shipped
    eagle: dict[str, Any] = field(default_factory=dict)  # EAGLE drafters of the bundle (attached to the target)
    eagle_tree: dict[str, Any] = field(default_factory=dict)  # name -> its decoding.eagle.TreeShape
    eagle_ofa: str | None = None  # the EAGLE drafter trained on every domain: a baseline, not a MetaEagle arm

    def sweep_for(self, domain: str) -> list[str]:
        if self.cfg.sweep_drafters == "all":
            return list(self.drafters)
        return [n for n in dict.fromkeys([self.own.get(domain), self.ofa]) if n is not None]

    def per_drafter_for(self, s: str, domain: str) -> list[str]:
        if s in self.cfg.per_drafter_sets:
            return list(self.drafters)
        return [n for n in dict.fromkeys([self.own.get(domain), self.ofa]) if n is not None]


def _drafter(env: Env, name: str, stopping_factory: Callable[[], Any]) -> Callable[..., Built]:
    return lambda done: Built(DrafterSpeculator(env.drafters[name], stopping_factory()), drafter=name)


# --- planners: one per family group; each returns the runs of one prompt --------------------------------

AR_GREEDY = MethodKey("ar")


def plan_greedy_drafters(env: Env, p: Prompt) -> list[Run]:
    """AR, fixed K (per drafter and the K sweep), SpecDec++ and the hindsight oracle."""
    runs = [Run(AR_GREEDY, p, lambda done: Built(None))]
    fixed = list(dict.fromkeys([(n, env.k) for n in env.per_drafter_for(p.set, p.domain)]
                               + [(n, k) for n in env.sweep_for(p.domain) for k in env.cfg.ks]))
    runs += [Run(MethodKey("fixed", drafter=n, k=k), p, _drafter(env, n, lambda k=k: FixedK(k))) for n, k in fixed]
    for n in env.sweep_for(p.domain):
        head = env.heads["greedy"].get(n)
        if head is not None:
            runs.append(Run(MethodKey("specdecpp", drafter=n), p,
                            _drafter(env, n, lambda h=head: SpecDecPP(h.module, h.threshold, h.k_max))))
        runs.append(Run(MethodKey("oracle", drafter=n), p, lambda done, n=n: Built(
            DrafterSpeculator(env.drafters[n], HindsightOracle(list(p.ids) + done[AR_GREEDY].tokens)), drafter=n)))
    return runs


def plan_routers(env: Env, p: Prompt) -> list[Run]:
    def build(router) -> Callable[..., Built]:
        def make(done) -> Built:
            name = router.route(list(p.ids))  # inside the timed call: routing is part of the method's cost
            return Built(DrafterSpeculator(env.drafters[name], FixedK(env.k)), drafter=name)
        return make

    return [Run(MethodKey("router", k=env.k, router=kind), p, build(r)) for kind, r in env.routers.items()]


# one round-robin pass over the drafters, then the prompt's hindsight-best one: what any bandit that starts
# with that pass (MetaSD-UCB, UCBSpec) can reach at best on a generation this long
CEILING = "one pass + hindsight drafter"


def make_bandit(env: Env, name: str, seed: int, persistent: bool = False,
                best_arm: int | None = None) -> MultiDrafterSpeculator:
    """The bandit `name` of BANDITS (or the ceiling, told `best_arm`) over one fixed-K arm per drafter."""
    arms = [Arm(n, DrafterSpeculator(env.drafters[n], FixedK(env.k)), drafter_key=n) for n in env.arms]
    if best_arm is not None:  # no learning: its reward is never read
        return MultiDrafterSpeculator(arms, make_selector("one-pass-oracle", len(arms), best_arm=best_arm),
                                      reward="be", n_max=env.k)
    _, selector_name, reward = BANDITS[name]
    kw = {"beta": env.cfg.beta} if selector_name == "ucb" else {"max_len": env.k}
    if selector_name == "ucbspec":
        kw["delta"] = env.cfg.delta
    return MultiDrafterSpeculator(arms, make_selector(selector_name, len(arms), seed=seed, persistent=persistent,
                                                      **kw), reward=reward, n_max=env.k)


def hindsight_best(env: Env, done: Mapping[MethodKey, GenerationResult]) -> int | None:
    """Index in env.arms of the arm with the highest MAT at K on this prompt (first on ties), if all ran."""
    mats = [done.get(MethodKey("fixed", drafter=n, k=env.k)) for n in env.arms]
    if any(m is None for m in mats):
        return None
    return max(range(len(mats)), key=lambda i: (mats[i].metrics.mat, -i))


def plan_bandits(env: Env, p: Prompt) -> list[Run]:
    runs = []
    for b in env.cfg.bandits:
        runs.append(Run(MethodKey("bandit", k=env.k, bandit=b, reward=BANDITS[b][2]), p,
                        lambda done, b=b: Built(make_bandit(env, b, derive_seed(env.seed, p.id, b)))))
    for b in env.cfg.stream_bandits:
        def stream(done, b=b) -> Built:
            key = (b, p.set, p.domain)
            if key not in env.streams:
                env.streams[key] = make_bandit(env, b, derive_seed(env.seed, p.set, p.domain, b, "stream"), True)
            return Built(env.streams[key])
        runs.append(Run(MethodKey("bandit", k=env.k, bandit=b, reward=BANDITS[b][2], stream=True), p, stream,
                        repeatable=False))
    if p.set in env.cfg.per_drafter_sets:  # the fixed runs of every arm come first in the plan
        runs.append(Run(MethodKey("ceiling", k=env.k), p,
                        lambda done: Built(make_bandit(env, CEILING, 0, best_arm=hindsight_best(env, done)))))
    return runs if env.cfg.bandits or env.cfg.stream_bandits else []


def plan_sampling(env: Env, p: Prompt) -> list[Run]:
    """AR, fixed K and SpecDec++ at the heads' non-greedy label transform (first test prompts only)."""
    if p.set != "test" or p.index >= env.cfg.sampling_prompts:
        return []

    def seed(key: MethodKey) -> int:
        return derive_seed(env.seed, p.id, "sampling", key.family, key.drafter, key.k)

    key = MethodKey("ar", mode="sampling")
    runs = [Run(key, p, lambda done: Built(None), seed=seed(key))]
    for n in env.sweep_for(p.domain):
        key = MethodKey("fixed", mode="sampling", drafter=n, k=env.k)
        runs.append(Run(key, p, _drafter(env, n, lambda: FixedK(env.k)), seed=seed(key)))
        head = env.heads["sampling"].get(n)
        if head is not None:
            key = MethodKey("specdecpp", mode="sampling", drafter=n)
            runs.append(Run(key, p, _drafter(env, n, lambda h=head: SpecDecPP(h.module, h.threshold, h.k_max)),
                            seed=seed(key)))
    return runs


def _first_test_prompts(env: Env, p: Prompt) -> bool:
    """The prompts the further families run on: the first `further_prompts` (default `sampling_prompts`)
    test prompts per domain."""
    n = env.cfg.sampling_prompts if env.cfg.further_prompts is None else env.cfg.further_prompts
    return p.set == "test" and p.index < n


def _domain_drafter(env: Env, p: Prompt) -> str:
    return env.own.get(p.domain) or env.ofa or sorted(env.drafters)[0]


def plan_spectr(env: Env, p: Prompt) -> list[Run]:
    """SpecTr (sampling mode): K i.i.d. drafts of length L = k per round from the domain drafter, verified
    as one tree with k-Seq selection. K = 1 is the sampling-mode `fixed` row."""
    if not _first_test_prompts(env, p):
        return []
    n = _domain_drafter(env, p)
    runs = []
    for drafts in env.cfg.spectr_drafts:
        key = MethodKey("spectr", mode="sampling", drafter=n, k=env.k, params=params(drafts=drafts))
        runs.append(Run(key, p, lambda done, d=drafts: Built(
            drafter_speculator(env.drafters[n], FixedK(env.k), d), drafter=n),
            seed=derive_seed(env.seed, p.id, "spectr", drafts)))
    return runs


def plan_cascades(env: Env, p: Prompt) -> list[Run]:
    """Speculative cascades (sampling mode): the domain drafter at gamma = k, verified towards the rule's
    pi = T(q, p) at each lenience of `cascade_alphas` (default [cascade_alpha]; lossy: the output follows pi,
    not the target)."""
    if not _first_test_prompts(env, p):
        return []
    n = _domain_drafter(env, p)
    runs = []
    alphas = env.cfg.cascade_alphas if env.cfg.cascade_alphas is not None else [env.cfg.cascade_alpha]
    for rule, alpha in ((r, a) for r in env.cfg.cascades for a in alphas):
        method = cascade_method(rule, alpha)
        if not method.speculative:
            raise InputError(f"evaluate.cascades: '{rule}' is a sequential baseline, not a speculative rule; "
                             f"benchmarks/bench_cascades.py runs it")
        key = MethodKey("cascade", mode="sampling", drafter=n, k=env.k,
                        params=params(rule=method.rule, alpha=method.alpha))
        runs.append(Run(key, p, lambda done, m=method: Built(
            DrafterSpeculator(env.drafters[n], FixedK(env.k)), drafter=n, verification=m.verification_distribution()),
            seed=derive_seed(env.seed, p.id, "cascade", method.rule)))  # one seed for all alphas: common random numbers
    return runs


def plan_model_free(env: Env, p: Prompt) -> list[Run]:
    """BanditSpec Table 1's arms (greedy): each model-free speculator alone, and a bandit over them plus the
    domain drafter with the throughput reward (arms of different cost; BanditSpec §6.2)."""
    if not _first_test_prompts(env, p) or not env.cfg.model_free_arms:
        return []
    resources = ArmResources(env.drafters, env.datastore)
    kinds = [a for a in env.cfg.model_free_arms if a not in resources.unavailable()]
    runs = [Run(MethodKey("model_free", k=env.k, params=params(arm=a)), p,
                lambda done, a=a: Built(build_arm(a, resources, env.k).speculator)) for a in kinds]
    selectors = env.cfg.model_free_bandits if env.cfg.model_free_bandits is not None else \
        [b for b in [env.cfg.model_free_bandit] if b]
    entries = kinds + [_domain_drafter(env, p)]
    for selector in (selectors if kinds else []):
        # its own family: the MetaSD tables (regret, best-arm ratio) read drafter arms only. The key names the
        # parametric arm by its role, not its name, so the method pools over domains like "domain drafter K=k"
        runs.append(Run(MethodKey("model_free", k=env.k, bandit=selector, reward="throughput",
                                  params=params(arm=f"{selector}({','.join(kinds + ['domain drafter'])})")), p,
                        lambda done, selector=selector: Built(MultiDrafterSpeculator(
                            build_arms(entries, resources, env.k),
                            make_selector(selector, len(entries), seed=derive_seed(env.seed, p.id, "model-free"),
                                          max_len=env.k),
                            reward="throughput", n_max=env.k))))
    return runs


def plan_eagle(env: Env, p: Prompt) -> list[Run]:
    """MetaSD's MetaEagle rows (Tables 4 / 7, greedy, every prompt): each EAGLE drafter at fixed K as a chain
    and as its EAGLE-2 tree, and with more than one specialised EAGLE drafter MetaEagle-UCB (BE and BD) over
    their chain arms (the all-domain one is a baseline beside them), N_max = K. Runs of family "eagle"; params say chain / tree (depth x top-k x nodes) / bandit."""
    if not env.eagle or p.set not in env.cfg.eagle_sets:
        return []
    runs = []
    for n in env.eagle:
        runs.append(Run(MethodKey("eagle", drafter=n, k=env.k, params=params(draft="chain")), p,
                        lambda done, n=n: Built(EagleSpeculator(env.eagle[n], FixedK(env.k)), drafter=n)))
        tree = env.eagle_tree.get(n)
        if tree is not None:
            shape = f"tree {tree.depth}x{tree.top_k}x{tree.nodes}"
            runs.append(Run(MethodKey("eagle", drafter=n, k=env.k, params=params(draft=shape)), p,
                            lambda done, n=n, t=tree: Built(EagleSpeculator(env.eagle[n], FixedK(env.k), t),
                                                            drafter=n)))
    specialists = [n for n in env.eagle if n != env.eagle_ofa]  # MetaEagle's arms, as MetaSD-UCB's are
    if len(specialists) > 1:
        for b in ("ucb-be", "ucb-bd"):
            _, _, reward = BANDITS[b]

            def build(done, reward=reward, b=b) -> Built:
                arms = [Arm(n, EagleSpeculator(env.eagle[n], FixedK(env.k))) for n in specialists]
                selector = make_selector("ucb", len(arms), seed=derive_seed(env.seed, p.id, "eagle", b), beta=env.cfg.beta)
                return Built(MultiDrafterSpeculator(arms, selector, reward=reward, n_max=env.k))

            runs.append(Run(MethodKey("eagle", k=env.k, bandit=b, reward=reward, params=params(draft="bandit")), p,
                            build))
    return runs


# the plan of a prompt is these planners' runs, in this order (a run may read results of earlier ones)
PLANNERS: list[Callable[[Env, Prompt], list[Run]]] = [plan_greedy_drafters, plan_routers, plan_bandits,
                                                      plan_sampling, plan_spectr, plan_cascades, plan_model_free,
                                                      plan_eagle]


def build_plan(env: Env, prompts: list[Prompt], planners=None) -> list[Run]:
    plan = [run for p in prompts for planner in (planners or PLANNERS) for run in planner(env, p)]
    seen: set[tuple[str, MethodKey]] = set()
    for run in plan:
        if (run.prompt.id, run.key) in seen:
            raise ValueError(f"the plan has {run.key} twice on prompt {run.prompt.id}")  # a planner bug
        seen.add((run.prompt.id, run.key))
    return plan


# --- run ------------------------------------------------------------------------------------------

def execute(plan: list[Run], target: torch.nn.Module, max_new_tokens: int, sampling: Mapping[str, SamplingConfig],
            eos, device: str, repeats: int, progress: bool = True,
            between: Callable[[], None] | None = None) -> list[Record]:
    """Every run of the plan; per prompt `repeats` interleaved passes (non-repeatable runs once).
    `between()` runs after each prompt (the stage samples its calibration there)."""
    by_prompt: dict[str, list[Run]] = {}
    for run in plan:
        by_prompt.setdefault(run.prompt.id, []).append(run)
    total = sum(repeats if r.repeatable else 1 for r in plan)
    bar = tqdm(total=total, desc="evaluate", unit="run", disable=not progress)
    records: list[Record] = []
    for runs in by_prompt.values():
        done: dict[MethodKey, GenerationResult] = {}
        mine: dict[MethodKey, Record] = {}
        for rep in range(repeats):
            for run in runs:
                if rep and not run.repeatable:
                    continue
                (built, res), t = timed_call(lambda: _decode(run, done, target, max_new_tokens,
                                                             sampling[run.key.mode], eos), device)
                bar.update(1)
                if rep == 0:
                    spec = built.speculator
                    m = dataclasses.replace(res.metrics, time_cpu=t.cpu)
                    rec = Record(run.key, run.prompt.id, run.prompt.set, run.prompt.domain, m, [t],
                                 drafter=built.drafter or run.key.drafter,
                                 arms=[spec.arms[h["arm"]].name for h in spec.history]
                                 if isinstance(spec, MultiDrafterSpeculator) else None,
                                 switch_s=float(getattr(spec, "switch_seconds", 0.0)), tokens=list(res.tokens))
                    done[run.key], mine[run.key] = res, rec
                    records.append(rec)
                else:
                    mine[run.key].times.append(t)
        if between is not None:
            between()
    bar.close()
    return records


def _decode(run: Run, done, target, max_new_tokens: int, sampling: SamplingConfig, eos) -> tuple[Built, Any]:
    built = run.build(done)
    gen = torch.Generator().manual_seed(run.seed) if run.seed is not None else None
    if built.speculator is None:
        return built, generate_autoregressive(target, run.prompt.ids, max_new_tokens, sampling, eos, gen)
    return built, generate_speculative(target, built.speculator, run.prompt.ids, max_new_tokens, sampling, eos, gen,
                                       built.verification)


# --- calibration: what the hardware charges per forward (for the counted speedup) ---------------------

@dataclass(frozen=True)
class Calibration:
    """Robust seconds of one cached forward (a low quantile over the passes: load only adds time): the
    target's per n tokens fed, each drafter's per token."""

    target_s: dict[int, float]  # n -> seconds (n = 1 .. max K + 1)
    drafter_s: dict[str, float]
    context: int
    reps: int
    draft_run: int = 1  # drafter forwards timed in a row after each target forward (a round's K)

    def target(self, n: int) -> float:
        if n in self.target_s:
            return self.target_s[n]
        hi = max(self.target_s)  # beyond the calibrated sizes: extend the last step linearly
        return self.target_s[hi] + (n - hi) * (self.target_s[hi] - self.target_s.get(hi - 1, self.target_s[hi]))

    def v(self, k: int) -> float:
        """The (K+1)-token verification forward in units of a 1-token forward."""
        return self.target(k + 1) / self.target(1)

    def cost(self, rec: Record) -> float:
        """Seconds the run's counts predict (SpecDec++ Eq. 3.1 with the target's cost per round size)."""
        m = rec.metrics
        if rec.key.family == "ar":
            return m.n_target * self.target(1)
        t_draft = self.drafter_s.get(rec.drafter, statistics.mean(self.drafter_s.values()))
        return sum(self.target(k + 1) for k in m.drafted) + m.n_draft * t_draft

    def as_dict(self) -> dict[str, Any]:
        return {"target_ms": {str(n): round(t * 1e3, 3) for n, t in sorted(self.target_s.items())},
                "v": {str(n - 1): round(t / self.target_s[1], 3) for n, t in sorted(self.target_s.items())},
                "drafter_ms": {n: round(t * 1e3, 3) for n, t in self.drafter_s.items()},
                "drafter_mean_ms": round(statistics.mean(self.drafter_s.values()) * 1e3, 3),
                # c = t_draft / t_target (SpecDec++ §3): the mean drafter's 1-token forward over the target's
                "cost_ratio": round(statistics.mean(self.drafter_s.values()) / self.target_s[1], 3),
                "context": self.context, "reps": self.reps, "draft_run": self.draft_run}


class Calibrator:
    """Samples the forward costs the counted speedup needs: per pass, every target forward size once and
    each drafter's 1-token forward, interleaved (so a load phase hits all sizes alike). `sample` can be
    called between prompts of the run loop, so the calibration sees the same load phases as the runs."""

    @torch.inference_mode()
    def __init__(self, target, drafters: dict[str, torch.nn.Module], max_n: int, context: int, device: str,
                 seed: int, draft_run: int = 4):
        gen = torch.Generator().manual_seed(seed)
        vocab = int(target.config.vocab_size)
        prefix = torch.randint(3, vocab, (context,), generator=gen).tolist()
        self.target, self.drafters, self.context, self.device = target, drafters, context, device
        self.caches = {}
        for name, model in {"target": target, **drafters}.items():
            self.caches[name] = kv.new_cache()
            if _is_eagle(model):  # an EAGLE drafter reads the target's features: random ones cost the same
                kv.forward_eagle(model, self.caches[name], torch.randn(context, model.config.hidden_size,
                                                                       generator=gen), prefix, list(range(context)))
            else:
                kv.forward(model, self.caches[name], prefix, device=kv.input_device(model))
        self.sizes = list(range(1, max_n + 1))
        # a drafter drafts `draft_run` tokens in a row after each verification, and only the first of them
        # finds its weights evicted from the CPU caches by the target's forward; timing a lone forward
        # would price every drafted token as that cold first one (1.4x too dear on the demo pair:
        # benchmarks/bench_forward_costs.py)
        self.draft_run = max(1, draft_run)
        self.feed = torch.randint(3, vocab, (max(max_n, self.draft_run),), generator=gen).tolist()
        self.times: dict[Any, list[float]] = {}
        self.passes = 0
        self.sample(2, keep=False)  # warm-up

    def _drafter_run(self, model, cache) -> None:
        """`draft_run` drafting forwards of one token each, one after the other, as in a round: N_draft
        counts each of them."""
        for i in range(self.draft_run):
            if _is_eagle(model):
                feature = torch.zeros(1, model.config.hidden_size)
                kv.forward_eagle(model, cache, feature, self.feed[i:i + 1], [self.context + i])
            else:
                kv.forward(model, cache, self.feed[i:i + 1])

    @torch.inference_mode()
    def sample(self, passes: int, keep: bool = True) -> None:
        names = list(self.drafters)
        for _ in range(passes):
            # every drafter's run comes right after a target forward, as in decoding (where the target's
            # weights have just evicted the drafter's from the CPU caches); more drafters than sizes cost
            # extra, untimed-again target forwards
            for j in range(max(len(self.sizes), len(names))):
                n = self.sizes[j % len(self.sizes)]
                _, t = timed_call(lambda: kv.forward(self.target, self.caches["target"], self.feed[:n], last=n),
                                  self.device)
                kv.crop(self.caches["target"], self.context)
                if keep and j < len(self.sizes):
                    self.times.setdefault(n, []).append(t.time)
                if j < len(names):
                    name = names[j]
                    _, t = timed_call(lambda: self._drafter_run(self.drafters[name], self.caches[name]), self.device)
                    kv.crop(self.caches[name], self.context)
                    if keep:
                        self.times.setdefault(name, []).append(t.time / self.draft_run)
            self.passes += keep

    def result(self) -> Calibration:
        """Per size the 10% quantile over the passes (load only adds time), then for the target the
        least-squares line t(n) = a + b (n - 1) through them: on CPU a cached forward's cost is close to
        affine in the tokens fed, and the line pools all sizes' samples, so one noisy size cannot move v(K)."""
        sizes, times = self.sizes, self.times
        lows = {n: quantile(times[n], 0.1) for n in sizes}
        mean_x = statistics.mean(n - 1 for n in sizes)
        mean_y = statistics.mean(lows.values())
        sxx = sum((n - 1 - mean_x) ** 2 for n in sizes)
        slope = max(0.0, sum((n - 1 - mean_x) * (lows[n] - mean_y) for n in sizes) / sxx) if sxx else 0.0
        base = max(mean_y - slope * mean_x, min(lows.values()) * 0.5)
        target_s = {n: base + slope * (n - 1) for n in sizes}
        # drafters of one architecture cost the same per token: their samples are pooled, so measurement
        # noise does not make one specialist look dearer than its twin
        shape = {name: (sum(p.numel() for p in m.parameters()), int(getattr(m.config, "num_hidden_layers", 0)))
                 for name, m in self.drafters.items()}
        pooled = {s: [t for name in self.drafters if shape[name] == s for t in times[name]]
                  for s in set(shape.values())}
        return Calibration(target_s, {name: quantile(pooled[shape[name]], 0.1) for name in self.drafters},
                           self.context, self.passes, self.draft_run)


def _is_eagle(model) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) == "eagle"


def calibrate(target, drafters: dict[str, torch.nn.Module], max_n: int, context: int, reps: int, device: str,
              seed: int, draft_run: int = 4) -> Calibration:
    """All `reps` passes at once (the stage spreads them through its run loop instead)."""
    cal = Calibrator(target, drafters, max_n, context, device, seed, draft_run)
    cal.sample(reps)
    return cal.result()


# --- the stage --------------------------------------------------------------------------------------

def _load_routers(bundle: Bundle, target, tok) -> tuple[dict[str, Any], list[str]]:
    """Each router of the bundle (bundle.routers: name -> entry), or a note on why there are none."""
    entries = {name: e.path for name, e in bundle.routers.items()}
    if not entries:
        return {}, ["no router in the bundle (train-router did not run before export): routing rows skipped"]
    fp = tokenizer_fingerprint(tok)
    return {name: load_router(path, target.get_input_embeddings(), fp) for name, path in sorted(entries.items())}, []


def _load_heads(bundle: Bundle, drafters, modes: dict[str, SamplingConfig], device: str,
                notes: list[str]) -> dict[str, dict[str, Head]]:
    """Each mode uses the heads labelled under its own transform (SpecDec++ §4.4)."""
    heads: dict[str, dict[str, Head]] = {}
    for mode, transform in modes.items():
        heads[mode] = {}
        for n in drafters:
            name = bundle.head_for(n, transform)
            if name is not None:
                module, _ = bundle.load_head(n, name, device=device)
                entry = bundle.heads[n][name]
                heads[mode][n] = Head(module, entry.threshold, entry.k_max or int(bundle.decoding.get("k_max", 20)),
                                      entry.name)
        lacking = sorted(n for n in drafters if n not in heads[mode] and bundle.heads.get(n))
        if lacking:
            notes.append(f"no head labelled under {transform.tag} for {', '.join(lacking)}: their {mode} SpecDec++ "
                         f"rows are skipped (add {transform.as_dict()} to acceptance_data.label_transforms)")
    return heads


def _prompts(ctx: Context, ecfg: EvaluateSection, tok, max_prompt: int, notes: list[str],
             chat: ChatFormat = ChatFormat()) -> list[Prompt]:
    """The first prompts_per_domain prompts per domain and set, formatted as the bundle serves them."""
    sets = load_prompt_sets(ctx.input("prepare-data"))
    prompts = []
    for s in ecfg.sets:
        if s not in sets:
            notes.append(f"prompt set '{s}' does not exist in prompts/sets: skipped")
            continue
        taken: dict[str, int] = {}
        for row in sets[s]:
            i = taken.get(row["domain"], 0)
            if i < ecfg.prompts_per_domain:
                taken[row["domain"]] = i + 1
                ids, _ = fit_prompt(format_prompt(tok, row_messages(row), chat), max_prompt, "truncate", row["id"])
                prompts.append(Prompt(s, row["domain"], row["id"], tuple(ids), i, row.get("response")))
    if not prompts:
        raise InputError(f"no prompts in sets {ecfg.sets} of {ctx.input('prepare-data')}; check evaluate.sets")
    return prompts


def build(ctx: Context) -> dict:
    cfg = ctx.cfg
    ecfg: EvaluateSection = cfg.evaluate
    ecfg.check()
    bundle = load_bundle(ctx.input("export"), verify=True)  # one-line InputError on any damage
    if not bundle.drafters:
        raise InputError("the bundle has no drafters; export a run with train-drafters before evaluating")
    k_main = ecfg.k or int(bundle.decoding.get("k", 4))
    check_k(k_main, "evaluate.k")
    device = resolve_device(ecfg.device)
    threads = torch.get_num_threads()
    if ecfg.threads:
        # one thread: the process's CPU time is then its compute, not other threads spinning for work
        torch.set_num_threads(ecfg.threads)
    try:
        return _evaluate(ctx, ecfg, bundle, k_main, device)
    finally:
        torch.set_num_threads(threads)


def _evaluate(ctx: Context, ecfg: EvaluateSection, bundle: Bundle, k_main: int, device: str) -> dict:
    cfg = ctx.cfg
    tok = bundle.load_tokenizer(cfg.target.trust_remote_code)
    target = bundle.load_target(device=device, trust_remote_code=cfg.target.trust_remote_code)
    drafters = {n: bundle.load_drafter(n, device=device, target=target) for n in sorted(bundle.drafters)}
    roles = drafter_roles({d.name: d.domains for d in bundle.drafters.values()})
    own, ofa = roles.own, roles.ofa
    routers, notes = _load_routers(bundle, target, tok)
    arm_names = sorted(set(own.values())) if ecfg.bandit_arms == "specialists" else list(drafters)
    if len(arm_names) < 2:
        notes.append(f"fewer than 2 single-domain drafters ({arm_names}): the bandits choose among all drafters")
        arm_names = list(drafters)
    # sampling mode decodes at the first non-greedy label transform of the bundle's heads (T=1 if none)
    labelled = sorted({SamplingConfig(**h.label_transform) for by in bundle.heads.values() for h in by.values()},
                      key=lambda t: t.tag)
    sampled = [t for t in labelled if not t.greedy]
    modes = {"greedy": SamplingConfig(temperature=0.0),
             "sampling": sampled[0] if sampled else SamplingConfig(temperature=1.0)}
    heads = _load_heads(bundle, drafters, modes, device, notes)
    ctx_len = getattr(target.config, "max_position_embeddings", None) or 10**9
    max_prompt = min(ecfg.max_prompt_tokens, ctx_len - ecfg.max_new_tokens - 1)
    prompts = _prompts(ctx, ecfg, tok, max_prompt, notes, bundle.chat)
    if any(p.domain in SCORED_DOMAINS for p in prompts):
        require_scorers()  # a missing scorer package fails here, not after the whole run loop

    eagle = {n: bundle.load_eagle(n, target, device=device) for n in sorted(bundle.eagle)}
    eagle_tree = {n: TreeShape(**bundle.eagle[n].tree) for n in eagle if bundle.eagle[n].tree}
    eagle_ofa = next((n for n in eagle if len(bundle.eagle[n].domains) > 1), None)
    env = Env(ecfg, cfg.run.seed, k_main, target, drafters, own, ofa, arm_names, routers, heads, modes,
              datastore=bundle.load_datastore() if ecfg.model_free_arms else None, eagle=eagle, eagle_tree=eagle_tree,
              eagle_ofa=eagle_ofa)
    if bundle.datastore is None and "rest" in ecfg.model_free_arms:
        notes.append("the bundle ships no datastore: the REST arm is left out (re-export with export.datastore: true)")
    plan = build_plan(env, prompts)
    max_k = max([k_main, *ecfg.ks] + [h.k_max for by in heads.values() for h in by.values()])
    # calibrate at a context like the runs' own: a median prompt, half way through its generation
    context = min(int(statistics.median(len(p.ids) for p in prompts)) + ecfg.max_new_tokens // 2,
                  ctx_len - max_k - 2)
    # the calibration's passes are spread through the run loop, a few after each prompt, so its costs come
    # from the same load phases as the runs they price (a burst before the loop sees only one phase)
    calibrator = Calibrator(target, {**drafters, **eagle}, max_k + 1, context, device, cfg.run.seed, draft_run=k_main)
    per_prompt = -(-ecfg.calibration_reps // len(prompts))
    records = execute(plan, target, ecfg.max_new_tokens, modes, end_of_turn_ids(tok, target), device, ecfg.repeats,
                      between=lambda: calibrator.sample(per_prompt))
    calib = calibrator.result()
    score_quality(records, {(p.set, p.id): p.reference for p in prompts}, tok)

    metrics = summarize(records, calib, Setup(ecfg, k_main, own, ofa, heads, modes["sampling"], device, len(prompts),
                                              len(drafters), arm_names, notes, cfg.run.seed, len(plan)))
    metrics["target_quality"] = target_quality(records, prompts, tok)
    # teacher-forced on the dev responses at train-drafters: thousands of positions per cell where the test
    # prompts give tens of rounds, so "a specialist wins in its domain" is decided here, MAT beside it
    metrics["drafter_alignment"] = {n: dict(e.alignment) for n, e in sorted(bundle.drafters.items()) if e.alignment}
    from specdraft.pipelines.report import write_report

    write_report(metrics, ctx.out)
    return {"headline": metrics["headline"], "cost_fit": metrics["cost_fit"], "runs": len(records)}


# --- aggregate --------------------------------------------------------------------------------------

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
                       **{k: _r(v) for k, v in aggregate_quality(domain, texts, refs).items() if k != "n"},
                       "example": {"prompt": prompt_text[-example_chars:], "output": texts[0][:example_chars],
                                   "reference": refs[0][:example_chars]}}
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
    benchmarks/bench_evaluate_load.py --estimators compares estimators on the same runs)."""
    pairs = [(a, b) for a, b in pairs if b > 0]
    if not pairs:
        return None, None, None
    s = bootstrap_ratio(pairs, seed)
    return _r(s.median), _r(s.lo), _r(s.hi)


def _mean_interval(xs: list[float], seed: int, n_boot: int = 1000) -> tuple[float, float]:
    """Bootstrap 90% interval of a mean (quality scores are often 0/100: a median would hide the rate)."""
    rng = np.random.default_rng(seed)
    a = np.asarray(xs, dtype=float)
    means = a[rng.integers(0, len(a), (n_boot, len(a)))].mean(axis=1)
    return _r(np.quantile(means, 0.05)), _r(np.quantile(means, 0.95))


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
        row["quality_lo"], row["quality_hi"] = _mean_interval(scored, seed)
    timed, wall, counted = [], [], []
    for r in group:
        base = ar.get(r.prompt)
        if base is None or not r.metrics.n_generated or not base.metrics.n_generated:
            continue
        scale = r.metrics.n_generated / base.metrics.n_generated  # AR's cost of the method's number of tokens
        timed.append((base.time * scale, r.time))
        wall.append((base.wall * scale, r.wall))
        counted.append((calib.cost(base) * scale, calib.cost(r)))
    row["speedup"], row["speedup_lo"], row["speedup_hi"] = _spread(timed, seed)
    row["counted_speedup"], row["counted_speedup_lo"], row["counted_speedup_hi"] = _spread(counted, seed)
    row["wall_speedup"], row["wall_speedup_lo"], row["wall_speedup_hi"] = _spread(wall, seed)
    return row


def _run_entry(r: Record, calib: Calibration) -> dict[str, Any]:
    """One run's raw numbers for metrics.json: counts, every repeat's times, its counted cost."""
    m = r.metrics
    return {**r.key.fields(), "prompt": r.prompt, "set": r.set, "domain": r.domain, "run_drafter": r.drafter,
            "N": m.n_generated, "N_target": m.n_target, "N_draft": m.n_draft, "N_discarded": m.n_discarded,
            "drafted": m.drafted, "counted_s": calib.cost(r), "time_s": r.time,
            "repeats": [t.as_dict() for t in r.times], "arms": r.arms, "switch_s": r.switch_s, "quality": r.quality}


def summarize(records: list[Record], calib: Calibration, setup: Setup) -> dict[str, Any]:
    """The metrics dict report.md, metrics.json and the plots are all made from."""
    k_main = setup.k
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
        "timer": "cuda events" if setup.device.startswith("cuda") else "process CPU time",
        "sampling": {"temperature": setup.sampling.temperature, "top_k": setup.sampling.top_k,
                     "top_p": setup.sampling.top_p},
        "drafters": {"own": setup.own, "ofa": setup.ofa}, "n_drafters": setup.n_drafters, "bandit_arms": setup.arms,
        "stopping_regret": stopping_time_regret(records, k_main, setup.arms),
        "heads": {mode: {n: {"threshold": h.threshold, "k_max": h.k_max, "name": h.name} for n, h in by.items()}
                  for mode, by in setup.heads.items()},
        "calibration": calib.as_dict(),
        "rows": rows, "cost_fit": cost_fit, "best_arm_ratio": best_arm_ratio(records, k_main, setup.arms),
        "switch_seconds": _switch_seconds(records), "notes": setup.notes,
        "runs": [_run_entry(r, calib) for r in records],
    }
    from specdraft.pipelines.report import effects, headline_rows

    metrics["effects"] = effects(metrics)
    metrics["headline"] = headline_rows(metrics)
    from specdraft.pipelines.verdicts import paper_verdicts

    metrics["verdicts"] = paper_verdicts(metrics)
    return metrics


def _switch_seconds(records: Iterable[Record]) -> list[dict[str, Any]]:
    total: dict[MethodKey, float] = {}
    for r in records:
        if r.arms is not None and r.key.family == "bandit":
            total[r.key] = total.get(r.key, 0.0) + r.switch_s
    return [{"key": k.fields(), "seconds": _r(v)} for k, v in total.items()]


if __name__ == "__main__":
    from specdraft.pipelines.cli import stage_main

    stage_main("evaluate")
