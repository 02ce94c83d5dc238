"""Which runs: the environment a plan is made in (`Env`), one planner per family group, and `build_plan`,
a list of `Run`s, one per (prompt, method). A run carries a factory that builds its speculator (and, for
families that need one, the verification distribution) when the loop gets to it."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from specdraft.core.errors import InputError
from specdraft.core.hashing import derive_seed
from specdraft.decoding.speculators.arms import ArmResources, build_arm, build_arms
from specdraft.decoding.cascades import cascade_method
from specdraft.decoding.speculators.eagle import EagleSpeculator
from specdraft.decoding.metrics import GenerationResult
from specdraft.decoding.speculators.multi_drafter import Arm, MultiDrafterSpeculator
from specdraft.decoding.speculators.spectr import drafter_speculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.bandits.selectors import make_selector
from specdraft.decoding.speculative import VerificationDistribution
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.speculators.protocol import Speculator
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.pipelines.evaluate.methods import CEILING, MethodKey, params
from specdraft.pipelines.schema import BANDITS, EvaluateSection


@dataclass(frozen=True)
class Prompt:
    set: str
    domain: str
    id: str
    ids: tuple[int, ...]
    index: int  # its position among the (set, domain)'s prompts
    reference: str | None = None  # the prompt set's reference response (quality of lossy families)
    # a batch (set BATCH_SET): the prompts the batched decoder decodes together, in row order; `ids` is then ()
    batch: tuple["Prompt", ...] = ()


@dataclass
class Built:
    """What a run's factory hands the loop."""

    # the one-prompt loop's speculator (bandits, trees, SpecTr, model-free, oracle, cascades); None: the product
    # loop (`decoding.batched.generate_batch`) decodes, with `draft_model` and `policy` (both None: the target alone)
    speculator: Speculator | None
    drafter: str | None = None  # the drafter chosen at run time (a router's pick), for the record
    verification: VerificationDistribution | None = None  # None: verify against the target's own p
    # the drafter model and the stopping policy decoding.batched.generate_batch drafts with (FixedK, SpecDecPP,
    # LengthUCB; an EAGLE-1 drafter); both None for autoregressive decoding
    draft_model: torch.nn.Module | None = None
    policy: Any = None
    # a method with a decode loop of its own (the sequential cascades): decode(target, prompt ids, max_new_tokens,
    # sampling, eos, generator) -> GenerationResult, in place of the speculative loop
    decode: Callable[..., Any] | None = None


@dataclass(frozen=True)
class Run:
    """One planned generation: a method on a prompt."""

    key: MethodKey
    prompt: Prompt
    build: Callable[[Mapping[MethodKey, GenerationResult]], Built]  # this prompt's earlier results -> Built
    seed: int | None = None  # sampling mode: the CPU generator's seed (the same on every repeat); a batch: generate_batch's
    repeatable: bool = True  # False: a run with state that outlives it (stream bandits) runs once
    # True: building is the method's own serving work (a router routing the prompt), timed with the generation;
    # else the speculator is built before the timed call
    timed_build: bool = False



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
    datastore: Any = None  # the bundle's REST / suffix datastore (decoding.speculators.datastore.SuffixIndex), if shipped
    eagle: dict[str, Any] = field(default_factory=dict)  # EAGLE drafters of the bundle (attached to the target)
    eagle_tree: dict[str, Any] = field(default_factory=dict)  # name -> its decoding.speculators.eagle.TreeShape
    eagle_ofa: str | None = None  # the EAGLE drafter trained on every domain: a baseline, not a MetaEagle arm
    # c = t_draft / t_target every bandit prices a drafted token with (the bundle's, `Bundle.defaults.cost_ratio`)
    cost_ratio: float | None = None
    # the throughput rows' batch-aware policies: the decoder's cost table on this device (profiled at the stage's
    # start) and the all-domain drafter's head's mean predicted acceptance (the bundle's acceptance summary)
    cost_table: Any = None
    prior: float | None = None
    # each drafter's fixed K as `specdraft generate` serves it (`Bundle.fixed_k`: train-heads' best K, else decoding.k)
    served_k: dict[str, int] = field(default_factory=dict)

    def sweep_for(self, domain: str) -> list[str]:
        if self.cfg.sweep_drafters == "all":
            return list(self.drafters)
        return [n for n in dict.fromkeys([self.own.get(domain), self.ofa]) if n is not None]

    def per_drafter_for(self, s: str, domain: str) -> list[str]:
        if s in self.cfg.per_drafter_sets:
            return list(self.drafters)
        return [n for n in dict.fromkeys([self.own.get(domain), self.ofa]) if n is not None]


def fixed_k_policy(k: int):
    """A fresh fixed-K policy (`build_policy`, the one constructor)."""
    return build_policy(PolicySpec("fixed", k=k))


def specdecpp_policy(head: Head, lockstep: bool = False):
    """A fresh SpecDec++ policy reading `head` at its (h, K_max), the batch stopping together with `lockstep`."""
    return build_policy(PolicySpec("specdecpp", threshold=head.threshold, k_max=head.k_max, lockstep=lockstep),
                        head=head.module)


def _drafter(env: Env, name: str, stopping_factory: Callable[[], Any]) -> Callable[..., Built]:
    """A chain run: the drafter and a fresh policy, decoded by the product loop (`generate_batch`, a batch of one)."""
    return lambda done: Built(None, drafter=name, draft_model=env.drafters[name], policy=stopping_factory())


# --- planners: one per family group; each returns the runs of one prompt --------------------------------

AR_GREEDY = MethodKey("ar")


def plan_greedy_drafters(env: Env, p: Prompt) -> list[Run]:
    """AR, fixed K (per drafter and the K sweep), SpecDec++ and the hindsight oracle."""
    runs = [Run(AR_GREEDY, p, lambda done: Built(None))]
    # every drafter at the common K the papers' comparisons hold fixed, at the K it is served with, and the sweep
    per_drafter = env.per_drafter_for(p.set, p.domain)
    fixed = list(dict.fromkeys([(n, env.k) for n in per_drafter]
                               + [(n, env.served_k[n]) for n in per_drafter if n in env.served_k]
                               + [(n, k) for n in env.sweep_for(p.domain) for k in env.cfg.ks]))
    runs += [Run(MethodKey("fixed", drafter=n, k=k), p, _drafter(env, n, lambda k=k: fixed_k_policy(k))) for n, k in fixed]
    for n in env.sweep_for(p.domain):
        head = env.heads["greedy"].get(n)
        if head is not None:
            runs.append(Run(MethodKey("specdecpp", drafter=n), p,
                            _drafter(env, n, lambda h=head: specdecpp_policy(h))))
        runs.append(Run(MethodKey("oracle", drafter=n), p, lambda done, n=n: Built(
            DrafterSpeculator(env.drafters[n], build_policy(PolicySpec("oracle"), reference=list(p.ids) + done[AR_GREEDY].tokens)), drafter=n)))
    return runs


def plan_routers(env: Env, p: Prompt) -> list[Run]:
    def build(router) -> Callable[..., Built]:
        def make(done) -> Built:
            name = router.route(list(p.ids))  # inside the timed call: routing is part of the method's cost
            return Built(None, drafter=name, draft_model=env.drafters[name], policy=fixed_k_policy(env.k))
        return make

    return [Run(MethodKey("router", k=env.k, router=kind), p, build(r), timed_build=True)
            for kind, r in env.routers.items()]


def make_bandit(env: Env, name: str, seed: int, persistent: bool = False,
                best_arm: int | None = None) -> MultiDrafterSpeculator:
    """The bandit `name` of BANDITS (or the ceiling, told `best_arm`) over one fixed-K arm per drafter."""
    arms = [Arm(n, DrafterSpeculator(env.drafters[n], fixed_k_policy(env.k)), drafter_key=n) for n in env.arms]
    if best_arm is not None:  # no learning: its reward is never read
        return MultiDrafterSpeculator(arms, make_selector("one-pass-oracle", len(arms), best_arm=best_arm),
                                      reward="be", n_max=env.k, cost_ratio=env.cost_ratio)
    _, selector_name, reward = BANDITS[name]
    kw = {"beta": env.cfg.beta} if selector_name == "ucb" else {"max_len": env.k}
    if selector_name == "ucbspec":
        kw["delta"] = env.cfg.delta
    return MultiDrafterSpeculator(arms, make_selector(selector_name, len(arms), seed=seed, persistent=persistent,
                                                      **kw), reward=reward, n_max=env.k, cost_ratio=env.cost_ratio)


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
        runs.append(Run(key, p, _drafter(env, n, lambda: fixed_k_policy(env.k)), seed=seed(key)))
        head = env.heads["sampling"].get(n)
        if head is not None:
            key = MethodKey("specdecpp", mode="sampling", drafter=n)
            runs.append(Run(key, p, _drafter(env, n, lambda h=head: specdecpp_policy(h)),
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
            drafter_speculator(env.drafters[n], fixed_k_policy(env.k), d), drafter=n),
            seed=derive_seed(env.seed, p.id, "spectr", drafts)))
    return runs


def plan_cascades(env: Env, p: Prompt) -> list[Run]:
    """Cascades (sampling mode) with the domain drafter, at each lenience of `cascade_alphas` (default
    [cascade_alpha]). A speculative rule drafts gamma = k tokens verified towards its pi = T(q, p) (lossy:
    the output follows pi, not the target); a sequential baseline (token_chow, seq_chow) runs its own loop,
    seq_chow with the per-token mean confidence (the joint probability of a long answer is ~0: it would
    always defer)."""
    if not _first_test_prompts(env, p):
        return []
    n = _domain_drafter(env, p)
    runs = []
    alphas = env.cfg.cascade_alphas if env.cfg.cascade_alphas is not None else [env.cfg.cascade_alpha]
    for rule, alpha in ((r, a) for r in env.cfg.cascades for a in alphas):
        method = cascade_method(rule, alpha, seq_confidence="mean")
        key = MethodKey("cascade", mode="sampling", drafter=n, k=env.k,
                        params=params(rule=method.rule, alpha=method.alpha))
        if method.speculative:
            build = (lambda done, m=method: Built(DrafterSpeculator(env.drafters[n], fixed_k_policy(env.k)), drafter=n,
                                                  verification=m.verification_distribution()))
        else:
            build = (lambda done, m=method: Built(None, drafter=n, decode=lambda target, ids, max_new, sampling, eos, gen:
                                                  m.generate(target, env.drafters[n], ids, max_new, sampling,
                                                             eos_token_id=eos, generator=gen)))
        # one seed for all alphas: common random numbers
        runs.append(Run(key, p, build, seed=derive_seed(env.seed, p.id, "cascade", method.rule)))
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
                            reward="throughput", n_max=env.k, cost_ratio=env.cost_ratio))))
    return runs


def eagle_chain(env: Env, name: str) -> Callable[..., Built]:
    """An EAGLE chain at fixed K, through the product loop (`generate_batch`), every variant."""
    drafter = env.eagle[name]
    return lambda done: Built(None, drafter=name, draft_model=drafter, policy=fixed_k_policy(env.k))


def plan_eagle(env: Env, p: Prompt) -> list[Run]:
    """MetaSD's MetaEagle rows (Tables 4 / 7, greedy, every prompt): each EAGLE drafter at fixed K as a chain
    and as its EAGLE-2 tree, and with more than one specialised EAGLE drafter MetaEagle-UCB (BE and BD) over
    their chain arms (the all-domain one is a baseline beside them), N_max = K. Runs of family "eagle"; params say chain / tree (depth x top-k x nodes) / bandit."""
    if not env.eagle or p.set not in env.cfg.eagle_sets:
        return []
    runs = []
    for n in env.eagle:
        runs.append(Run(MethodKey("eagle", drafter=n, k=env.k, params=params(draft="chain")), p, eagle_chain(env, n)))
        tree = env.eagle_tree.get(n)
        if tree is not None:
            shape = f"tree {tree.depth}x{tree.top_k}x{tree.nodes}"
            runs.append(Run(MethodKey("eagle", drafter=n, k=env.k, params=params(draft=shape)), p,
                            lambda done, n=n, t=tree: Built(EagleSpeculator(env.eagle[n], fixed_k_policy(env.k), t),
                                                            drafter=n)))
    specialists = [n for n in env.eagle if n != env.eagle_ofa]  # MetaEagle's arms, as MetaSD-UCB's are
    if len(specialists) > 1:
        for b in ("ucb-be", "ucb-bd"):
            _, _, reward = BANDITS[b]

            def build(done, reward=reward, b=b) -> Built:
                arms = [Arm(n, EagleSpeculator(env.eagle[n], fixed_k_policy(env.k))) for n in specialists]
                selector = make_selector("ucb", len(arms), seed=derive_seed(env.seed, p.id, "eagle", b), beta=env.cfg.beta)
                return Built(MultiDrafterSpeculator(arms, selector, reward=reward, n_max=env.k,
                                                    cost_ratio=env.cost_ratio))

            runs.append(Run(MethodKey("eagle", k=env.k, bandit=b, reward=reward, params=params(draft="bandit")), p,
                            build))
    return runs


# the plan of a prompt is these planners' runs, in this order (a run may read results of earlier ones)
PLANNERS: list[Callable[[Env, Prompt], list[Run]]] = [plan_greedy_drafters, plan_routers, plan_bandits,
                                                      plan_sampling, plan_spectr, plan_cascades, plan_model_free,
                                                      plan_eagle]


# --- throughput: the batched decoder at each batch size (docs/algorithms.md#batched-throughput) ------------

BATCH_SET = "batches"  # the set name of a batch's pseudo-prompt: its runs are throughput runs, never per-prompt rows


def batches(env: Env, prompts: list[Prompt]) -> dict[int, list[Prompt]]:
    """Batch size -> its batches: the test prompts of every domain pooled, taken round-robin over domains
    (prompt 0 of each domain, then prompt 1, ...) so every batch mixes domains as a server's queue does, cut
    to `throughput_prompts` and then down to a multiple of every batch size (their lcm), so each B decodes the
    same prompts in consecutive batches of B."""
    sizes = env.cfg.batch_sizes
    if not sizes:
        return {}
    pool = sorted((p for p in prompts if p.set == "test"), key=lambda p: (p.index, p.domain))
    if env.cfg.throughput_prompts is not None:
        pool = pool[:env.cfg.throughput_prompts]
    lcm = math.lcm(*sizes)
    if len(pool) < lcm:
        raise InputError(f"evaluate.batch_sizes {sizes} take a multiple of {lcm} prompts (the batch sizes' lcm), but "
                         f"{len(pool)} pooled test prompts are there; raise evaluate.prompts_per_domain (or "
                         "throughput_prompts), or use smaller batch sizes")
    pool = pool[:len(pool) // lcm * lcm]
    out = {}
    for b in sizes:
        out[b] = [Prompt(BATCH_SET, "all", f"B={b} #{i}", (), i, batch=tuple(pool[j:j + b]))
                  for i, j in enumerate(range(0, len(pool), b))]
    return out


def plan_batches(env: Env, prompts: list[Prompt]) -> list[Run]:
    """The throughput runs (greedy): per batch size and batch, batched AR (each speedup's reference), fixed K for
    each K of `ks`, SpecDec++ (each row stopping alone, and the batch stopping together: LockstepSpecDecPP) and
    UCBSpec over the lengths 0..k, all decoding with the all-domain (OFA)
    drafter: a batch mixes domains and shares one drafter, so the drafter trained on every domain is the one a
    server would batch with (and the one `specdraft generate` decodes with when nothing routes). SpecDec++
    reads that drafter's greedy head at its threshold (the bundle's decoding.threshold, else the head's h) and
    K_max; UCBSpec is one bandit per row (decoding.policies.batch_length_ucb) with the bandits' N_max = k,
    delta and the bundle's c in its throughput reward (BanditSpec §6.2). A batch's seed (LengthUCB's tie
    breaks) is the same for every method on it."""
    by_size = batches(env, prompts)
    if not by_size:
        return []
    n = env.ofa
    head = env.heads["greedy"].get(n) if n is not None else None
    # UCBSpec's arms: the lengths 0 (a plain target step) .. the bandits' N_max
    ucbspec = PolicySpec("length-ucb", k=env.k, delta=env.cfg.delta, cost_ratio=env.cost_ratio)
    runs = []
    for b, group in by_size.items():
        for batch in group:
            seed = derive_seed(env.seed, "throughput", b, batch.index)
            at_b = params(batch=b)
            runs.append(Run(MethodKey("batched", policy="ar", params=at_b), batch, lambda done: Built(None), seed=seed))
            if n is None:
                continue
            for k in env.cfg.ks:
                runs.append(Run(MethodKey("batched", drafter=n, k=k, policy="fixed", params=at_b), batch,
                                lambda done, k=k: Built(None, n, draft_model=env.drafters[n], policy=fixed_k_policy(k)),
                                seed=seed))
            if head is not None:  # the paper's per-row stops, and the batch stopping together (decoding.batched)
                for name, lockstep in (("specdecpp", False), ("specdecpp-lockstep", True)):
                    runs.append(Run(MethodKey("batched", drafter=n, policy=name, params=at_b), batch,
                                    lambda done, lockstep=lockstep: Built(None, n, draft_model=env.drafters[n],
                                                                          policy=specdecpp_policy(head, lockstep)),
                                    seed=seed))
            if head is not None and env.cost_table is not None:  # priced with the decoder's measured costs at B
                priced = dict(head=head.module, table=env.cost_table, prior=env.prior)
                for name, spec in (("batch-aware-lockstep", PolicySpec("batch-aware", k_max=head.k_max, lockstep=True)),
                                   ("global-budget", PolicySpec("global-budget", k=env.k))):
                    runs.append(Run(MethodKey("batched", drafter=n, k=env.k if name == "global-budget" else None,
                                              policy=name, params=at_b), batch,
                                    lambda done, spec=spec: Built(None, n, draft_model=env.drafters[n],
                                                                  policy=build_policy(spec, **priced)),
                                    seed=seed))
            runs.append(Run(MethodKey("batched", drafter=n, k=env.k, policy="ucbspec", params=at_b), batch,
                            lambda done: Built(None, n, draft_model=env.drafters[n], policy=build_policy(
                                ucbspec)), seed=seed))
    return runs


def build_plan(env: Env, prompts: list[Prompt], planners=None) -> list[Run]:
    """Every prompt's runs (the planners', in order), then the throughput runs of the batches (`plan_batches`)."""
    plan = [run for p in prompts for planner in (planners or PLANNERS) for run in planner(env, p)]
    plan += plan_batches(env, prompts)
    seen: set[tuple[str, MethodKey]] = set()
    for run in plan:
        if (run.prompt.id, run.key) in seen:
            raise ValueError(f"the plan has {run.key} twice on prompt {run.prompt.id}")  # a planner bug
        seen.add((run.prompt.id, run.key))
    return plan

