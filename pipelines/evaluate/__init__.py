"""Stage `evaluate`: the exported bundle, decoded end to end on held-out prompts, measured.

Five steps, one module each (this package's files are its jobs; each reads only the ones above it):

1. **plan** (`plan.build_plan`; what the stage loads for it in `load`): a list of `Run`s, one per
   (prompt, method). A method is a `MethodKey` (`methods`, beside its display name `label`), a frozen,
   hashable record of what it is (family, drafter, K, stopping policy, router, bandit, reward, sampling
   mode, and an open `params` for anything else); a run carries a factory that builds its
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
   Throughput runs (`evaluate.batch_sizes`, `plan.plan_batches`): the pooled test prompts in consecutive
   batches of B at each batch size B, decoded by the batched decoder (decoding.batched.generate_batch) as
   batched AR, fixed K for each of `ks`, SpecDec++ and UCBSpec over lengths 0..k with the all-domain
   drafter; a batch is a pseudo-prompt of set `plan.BATCH_SET` whose runs are timed whole, like a prompt's.
2. **run** (`run.execute`): one loop. Per prompt, `repeats` passes over that prompt's runs, methods
   interleaved (a slow phase of a shared machine hits every method alike), then further passes for the
   runs whose 90% interval of the mean time is wider than +-`repeat_ci`, up to `repeats_max`
   (`run.TimingPolicy`). The first time a method meets a prompt-length class it decodes once untimed
   (`warmup`). A run's speculator is built before its timed call (a router's routing stays inside: it
   is the method's serving work); each whole generate call is timed by `decoding.timing.timed_call`
   (CPU time of this process and wall time on CPU; CUDA events, synchronized, on a GPU). Counts come
   from the first pass (greedy and seeded sampling repeat exactly); every pass's times are kept, and a
   run's time is the mean over its passes (see `Record.time`). After each
   prompt, a few `Calibrator` passes (decoding/costs/calibration.py, shared with train-heads) time the
   target's n-token cached forward for every n a round can verify and each drafter's 1-token forward
   (interleaved; spread through the loop, so they see the same load phases as the runs they price).
   The plan runs in units (`units`: a prompt, a batch, or a stream bandit's (set, domain)); N shards
   (`specdraft evaluate CONFIG --shard i/N`, Slurm array tasks, torchrun ranks) each run theirs and store
   each finished unit atomically; the last to finish (or `--merge`) reads all back in plan order and goes
   on as one process would.
3. **aggregate** (`aggregate.summarize`): per (mode, set, domain, method) counters summed and rates as
   ratios of totals; per prompt, the timed speedup (AR's median time per token / the method's) and the counted
   speedup (the same ratio of costs predicted from the run's counts: SpecDec++ Eq. 3.1 with the
   calibrated v(K), i.e. sum over rounds of t_target(K_r + 1) + N_draft t_draft; the prompt's prefill
   and the decoder's own per-round work (sampling, verification, a SpecDec++ head) are not counted, so
   on a small model it sits above the timed one); each pooled over prompts as a ratio of totals with a
   bootstrap 90% interval (resampling prompts). The Eq. 3.1 fit over all greedy speculative runs
   (non-negative least squares on counts and robust times) with its R^2. The batch runs pool apart
   (`aggregate.throughput`): per batch size and method, tokens/s, MAT and the speedup over batched AR at
   the same B with its bootstrap 90% interval over batches.
4. **claims** (`claims.judge`): the papers' effects and verdicts, as data read from that dict (each
   comparison a ratio over shared prompts with its bootstrap interval), stored in it.
5. **render** (`render.write_report`): report.md and the plots, from the dict alone; every label and
   sentence is made there and in the rooms it reads (cells, tables, verdicts, plots; rows carry key fields,
   never display strings).

How to add a family (SpecTr multi-draft, speculative cascades, prompt lookup / REST / suffix, EAGLE...):
write a planner `def plan_myfamily(env: Env, prompt: Prompt) -> list[Run]` that returns one `Run` per
method for that prompt, each with a `MethodKey(family="myfamily", drafter=..., k=..., params=params(
rule="...", alpha=0.3))` and a `build(done) -> Built` factory (`done`: this prompt's earlier results
by key, e.g. AR's tokens); give `Built.verification` for a family whose output follows another
distribution than the target's (cascades). Add the planner to `plan.PLANNERS`, its config to
`EvaluateSection`. The loop, the timing, the aggregation and metrics.json need no change; `methods.label`
names an unknown family generically, and a table of its own is a function in tables.py.

Writes report/: report.md, metrics.json (rows with key fields, every run's raw repeat times in `runs`),
*.png (`plots.PLOTS` lists them).
"""
from __future__ import annotations

import os
import statistics
from typing import Callable

import torch
from tqdm.auto import tqdm

from specdraft.core.devices import resolve_device
from specdraft.core.errors import InputError
from specdraft.data.quality import SCORED_DOMAINS, require_scorers
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.bundle.directory import Bundle, load_bundle
from specdraft.decoding.bundle.chat import end_of_turn_ids
from specdraft.decoding.compat import check_k
from specdraft.decoding.speculators.eagle import TreeShape
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.drafters.roles import drafter_roles
from specdraft.decoding.costs.calibration import Calibration, Calibrator
from specdraft.pipelines.evaluate.aggregate import (Setup, beside_measured, quality_scores, score_quality, summarize,
                                                   target_quality)
from specdraft.pipelines.evaluate.claims import judge
from specdraft.decoding.costs.throughput import predict_throughput
from specdraft.pipelines.evaluate.load import (load_heads, load_prompts, load_routers, load_target, target_placement,
                                               throughput_costs)
from specdraft.pipelines.evaluate.plan import Env, Run, batches, build_plan
from specdraft.pipelines.evaluate.render import write_report
from specdraft.pipelines.evaluate.run import Record, TimingPolicy, calls, execute
from specdraft.pipelines.evaluate.units import missing, read_back, run_units, share, unfinished_error, units
from specdraft.pipelines.schema import CountedCosts, EvaluateSection
from specdraft.pipelines.shards import claim_merge, is_helper, processes_started_here, this_share
from specdraft.pipelines.stage import Context, StageIncomplete


PREDICTED_BATCHES = 50  # simulated static batches per (method, B) behind the report's predicted throughput


def build(ctx: Context) -> dict:
    cfg = ctx.cfg
    ecfg: EvaluateSection = cfg.evaluate
    ecfg.check()
    bundle = load_bundle(ctx.input("export"), verify=True)  # one-line InputError on any damage
    if not bundle.drafters:
        raise InputError("the bundle has no drafters; export a run with train-drafters before evaluating")
    k_main = ecfg.k or bundle.defaults.k
    if bundle.defaults.cost_ratio is None:
        raise InputError("the bundle carries no cost ratio c (decoding.cost_ratio), which the bandits price drafts "
                         "with; re-export it (export writes the c train-heads measured)")
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


def _run_shard(ctx: Context, plan: list[Run], execute_runs: Callable[[list[Run], tqdm], list[Record]],
               calibrator: Calibrator) -> list[Record]:
    """This process's share of the plan (units.py), then, once every unit has its records, all of them in
    plan order with the calibrator holding every unit's samples; StageIncomplete while other shards'
    units are unfinished. With SPECDRAFT_MERGE=1 (`specdraft evaluate --merge`) it runs nothing and
    merges, or says which units are missing."""
    store = ctx.work / "units"
    store.mkdir(parents=True, exist_ok=True)
    all_units = units(plan)
    merge_only = os.environ.get("SPECDRAFT_MERGE") == "1"
    # with `processes`, shard 0 starts the others here, after the throughput table is on disk
    place = this_share(1 if merge_only else ctx.cfg.evaluate.processes, from_env=not merge_only)
    shard, n_shards, started_here = place.shard, place.count, place.started_here
    if not merge_only:
        with processes_started_here(ctx, "evaluate", place):
            mine = share(all_units, shard, n_shards)
            todo = missing(mine, store)
            if n_shards > 1 or len(todo) < len(mine):
                print(f"[evaluate] shard {shard}/{n_shards}: {len(todo)} of its {len(mine)} units to run")
            with tqdm(total=sum(calls(list(u.runs), ctx.cfg.evaluate.repeats) for u in todo), disable=not todo,
                      desc=f"evaluate shard {shard}/{n_shards}" if n_shards > 1 else "evaluate", unit="run") as bar:
                run_units(todo, store, lambda runs: execute_runs(runs, bar), calibrator.take)
    if not started_here and is_helper():
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; the process that started it merges")
    left = missing(all_units, store)
    if left and merge_only:
        raise unfinished_error(left, len(all_units))
    if left:
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; {len(left)} units remain for other shards "
                              "(the shard that finishes last, or `specdraft evaluate --merge`, writes the report)")
    if n_shards > 1 and not started_here and not claim_merge(ctx.work, shard):
        # shards finishing together all see every unit done; one merges (its commit removes the work dir)
        raise StageIncomplete(f"shard {shard}/{n_shards} is done; another shard merges the report (should it die, "
                              "`specdraft evaluate --merge` does)")
    records, samples = read_back(plan, all_units, store)
    calibrator.pool(samples)
    return records


def _evaluate(ctx: Context, ecfg: EvaluateSection, bundle: Bundle, k_main: int, device: str) -> dict:
    cfg = ctx.cfg
    tok = bundle.load_tokenizer(cfg.target.trust_remote_code)
    target = load_target(bundle, cfg.target, device)
    drafters = {n: bundle.load_drafter(n, device=device, target=target) for n in sorted(bundle.drafters)}
    roles = drafter_roles({d.name: d.domains for d in bundle.drafters.values()})
    own, ofa = roles.own, roles.ofa
    routers, notes = load_routers(bundle, target, tok)
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
    heads = load_heads(bundle, drafters, modes, device, notes)
    ctx_len = getattr(target.config, "max_position_embeddings", None) or 10**9
    max_prompt = min(ecfg.max_prompt_tokens, ctx_len - ecfg.max_new_tokens - 1)
    prompts = load_prompts(ctx.input("prepare-data"), ecfg, tok, max_prompt, notes, bundle.chat)
    if any(p.domain in SCORED_DOMAINS for p in prompts):
        require_scorers()  # a missing scorer package fails here, not after the whole run loop

    eagle = {n: bundle.load_eagle(n, target, device=device) for n in sorted(bundle.eagle)}
    eagle_tree = {n: TreeShape(**bundle.eagle[n].tree) for n in eagle if bundle.eagle[n].tree}
    eagle_ofa = next((n for n in eagle if len(bundle.eagle[n].domains) > 1), None)
    env = Env(ecfg, cfg.run.seed, k_main, target, drafters, own, ofa, arm_names, routers, heads, modes,
              datastore=bundle.load_datastore() if ecfg.model_free_arms else None, eagle=eagle, eagle_tree=eagle_tree,
              eagle_ofa=eagle_ofa, cost_ratio=bundle.defaults.cost_ratio,
              served_k={n: bundle.fixed_k(n) for n in drafters})
    summary = _price_throughput(ctx, env, bundle, prompts, notes)
    if bundle.datastore is None and "rest" in ecfg.model_free_arms:
        notes.append("the bundle ships no datastore: the REST arm is left out (re-export with export.datastore: true)")
    if ecfg.batch_sizes and ofa is None:
        notes.append("the bundle has no all-domain drafter: the throughput rows (evaluate.batch_sizes) decode with "
                     "batched AR only, as a batch mixing domains shares one drafter")
    plan = build_plan(env, prompts)
    max_k = max([k_main, *ecfg.ks] + [h.k_max for by in heads.values() for h in by.values()])
    # calibrate at a context like the runs' own: a median prompt, half way through its generation
    context = min(int(statistics.median(len(p.ids) for p in prompts)) + ecfg.max_new_tokens // 2,
                  ctx_len - max_k - 2)
    # the calibration's passes are spread through the run loop, a few after each prompt, so its costs come
    # from the same load phases as the runs they price (a burst before the loop sees only one phase)
    calibrator = Calibrator(target, {**drafters, **eagle}, max_k + 1, context, device, cfg.run.seed, draft_run=k_main)
    per_prompt = -(-ecfg.calibration_reps // len(prompts))
    eos = end_of_turn_ids(tok, target)
    policy = TimingPolicy(ecfg.repeats, ecfg.repeats_max, ecfg.repeat_ci, ecfg.warmup)
    warmed: set = set()  # shapes warmed up in this process, over all of its units
    # the calibration prices batch-1 rounds: its passes follow the prompts' units, not the batches'
    records = _run_shard(ctx, plan, lambda runs, bar: execute(
        runs, target, ecfg.max_new_tokens, modes, eos, device, ecfg.repeats,
        between=None if runs[0].prompt.batch else lambda: calibrator.sample(per_prompt), bar=bar, policy=policy,
        warmed=warmed), calibrator)
    measured = calibrator.result()
    calib = pinned_costs(measured, ecfg.counted_costs) if ecfg.counted_costs else measured
    score_quality(records, {(p.set, p.id): p.reference for p in prompts}, tok)

    metrics = summarize(records, calib, Setup(ecfg, k_main, own, ofa, heads, modes["sampling"], device, len(prompts),
                                              len(drafters), arm_names, notes, cfg.run.seed, len(plan),
                                              bundle.defaults.cost_ratio))
    if ecfg.counted_costs:
        metrics["calibration"]["measured"] = measured.as_dict()
    if ecfg.drafter_quality:
        metrics["quality_scores"] = quality_scores(records, prompts, tok, _drafters_alone(
            drafters, [p for p in prompts if p.set == "test" and p.domain in SCORED_DOMAINS and p.reference],
            ecfg.max_new_tokens, modes["greedy"], eos))
    if metrics.get("throughput") and env.cost_table is not None:
        _predicted_beside_measured(metrics["throughput"], env, summary, prompts)
    metrics.update(judge(metrics))
    metrics["target_quality"] = target_quality(records, prompts, tok)
    metrics["target_load"] = target_placement(target, cfg.target, bundle)
    # teacher-forced on the dev responses at train-drafters: thousands of positions per cell where the test
    # prompts give tens of rounds, so "a specialist wins in its domain" is decided here, MAT beside it
    metrics["drafter_alignment"] = {n: dict(e.alignment) for n, e in sorted(bundle.drafters.items()) if e.alignment}
    metrics["eagle_training"] = {n: eagle_training(e.path) for n, e in sorted(bundle.eagle.items())}
    write_report(metrics, ctx.out)
    return {"headline": metrics["headline"], "cost_fit": metrics["cost_fit"], "runs": len(records)}


def eagle_training(path) -> dict:
    """What train-drafters recorded of an EAGLE drafter's training (eagle_config.json): its optimizer steps, final
    loss and, with train_drafters.eagle.eval_every_n_steps, its dev curve (teacher-forced acceptance against steps)."""
    from specdraft.decoding.speculators.eagle_model import read_eagle_config

    meta = read_eagle_config(path)
    return {k: meta[k] for k in ("steps", "examples", "final_loss", "dev_curve") if k in meta}


def pinned_costs(measured: Calibration, costs: CountedCosts) -> Calibration:
    """The calibration with its ratios replaced by the configured ones (evaluate.counted_costs): every forward
    priced in the target's 1-token forward, whose timed milliseconds only set the unit, so no ratio of two
    counted costs, and no verdict read from one, depends on the machine or its load."""
    t1 = measured.target_s[1]
    return Calibration({n: t1 * (1 + costs.verify_slope * (n - 1)) for n in measured.target_s},
                       {name: t1 * costs.cost_ratio for name in measured.drafter_s}, measured.context, measured.reps,
                       measured.draft_run)


def _price_throughput(ctx: Context, env: Env, bundle: Bundle, prompts: list, notes: list[str]):
    """The throughput rows' cost table and prior (env.cost_table, env.prior; None where the batch-aware rows
    cannot run), the table timed over prompts of the test prompts' median length. -> the acceptance summary."""
    test_lengths = sorted(len(p.ids) for p in prompts if p.set == "test") or [64]
    env.cost_table, summary, env.prior = throughput_costs(bundle, env.target, env.drafters, env.heads, env.ofa, env.cfg,
                                                          env.seed, notes, ctx.work / "cost_table.json",
                                                          context=test_lengths[len(test_lengths) // 2],
                                                          longest=test_lengths[-1])
    return summary


def _predicted_beside_measured(throughput: dict, env: Env, summary, prompts: list) -> None:
    """What `specdraft predict` says of the same rows before decoding (static batches of the runs' length, each
    prefilling at the mean over the rows' batches of the positions their longest prompt prefills at), beside the
    measured, and the table it priced them with, into the throughput metrics."""
    widths = {b: statistics.mean(env.cost_table.prefill_positions(max(len(p.ids) for p in batch.batch)) for batch in group)
              for b, group in batches(env, prompts).items()}
    throughput["predicted"] = beside_measured(predict_throughput(
        summary, env.cost_table, throughput["batch_sizes"], env.prior,
        k_max=env.heads["greedy"][env.ofa].k_max, rounds=PREDICTED_BATCHES, seed=env.seed,
        new_tokens=env.cfg.max_new_tokens, budget_k=env.k, prompt_lengths=widths), throughput)
    throughput["cost_table"] = env.cost_table.as_dict()


def _drafters_alone(drafters: dict, prompts: list, max_new_tokens: int, greedy: SamplingConfig,
                    eos) -> dict[str, dict[str, list[int]]]:
    """Each drafter decoding alone (greedy, untimed) on the given prompts: what a reader compares the target's
    quality with (a cascade's lenience moves its quality from the target's towards its drafter's)."""
    return {n: {p.id: generate_autoregressive(m, list(p.ids), max_new_tokens, greedy, eos).tokens for p in prompts}
            for n, m in drafters.items()}
