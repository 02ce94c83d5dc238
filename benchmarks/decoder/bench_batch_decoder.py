"""The batched, static-cache decoder (`decoding.batched.generate_batch`): batch 1 against
transformers, and tokens/s over batch sizes.

    python benchmarks/decoder/bench_batch_decoder.py [--target DIR --drafter DIR [--head DIR --h 0.7]]
        [--batch-sizes 1,2,4,8,16,32] [--max-new-tokens 48] [--runs 3] [--compile none,default]
        [--device cuda --dtype bfloat16] [--shape demo|1b] [--section NAME] [--no-append]

Without --target/--drafter it builds a random pair shaped like the demo pair (16 x 128 target, a
one-layer drafter made of the target's first layer with the deeper layers damped, `harness.models.
early_exit_pair`): its acceptance reflects that construction, not a trained drafter; only the cost
side (forwards, overheads, batching) carries over. `--shape 1b` builds the same construction at a ~1B target's
shape (TinyLlama-1.1B's; bandwidth-bound on a GPU, gpu_check.py). Prompts are random token ids unless --prompt-set.

(a) Batch 1, per prompt, methods interleaved and repeated (`harness.timing.interleaved`: one warm-up,
    then --runs passes; median per prompt; this process's CPU time on CPU, CUDA events on a GPU):
    ours autoregressive, ours fixed K, transformers greedy `generate`, transformers assisted generation
    with num_assistant_tokens=K (constant schedule, no confidence stop), greedy and T = --temperature.
    Efficiency = measured (ours K / ours AR) over the analytic fixed-K speedup at the acceptance implied
    by our MAT and c = t_draft / t_target from ours-AR per-token times of each model.
(b) Batch curve: for each B, part (a)'s prompts in consecutive batches of B (a B above their count: its
    first B prompts as one batch), decoded by every method (AR, fixed K for
    --ks, SpecDec++ with --head or an untrained random head, per row and lockstep (the batch stops
    together), UCBSpec over lengths 0..4), --runs passes, the methods taking turns batch by batch
    (`harness.timing.interleave`); tokens/s = the median over passes of generated tokens / time, with the spread (min-max over
    passes) and the speedup over batched AR at the same B.
    Sampled (--curve-temperature > 0), run i draws with seed i for every method (the warm-up decodes every seed
    first, so no pass compiles): the median then spans draws.
    Each adaptive method is also paired pass by pass with the best fixed K of --goal-ks (`paired_with_best_k`);
    greedy, also by each batch's fastest pass; sampled, also pooled over every pass and batch, with a paired
    bootstrap interval (`pooled_with_best_k`: a sampled pass's ratio carries two draws' luck).
(c) The cost of deciding at batch 1: SpecDec++ and the batch-aware rule made to take fixed K = 4's
    decisions (an h that never fires; a table where every draft pays), so that their rounds equal fixed K's
    and the time beyond them is the head's forward and the rule's own work per round; interleaved prompt by
    prompt.
--compile none,default measures both in one run (one RESULTS.md section); a compiled mode reports its
compile time (the first call of each method) apart from decode time, and runs part (b) at
--compiled-batch-sizes / --compiled-ks only (each batch size and width compiles its own graphs).
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.decoding.policies.batch_length_ucb import LengthUCB  # noqa: E402
from specdraft.decoding.batched import forward_step, generate_batch  # noqa: E402
from specdraft.decoding.compilation import StepCompiler, fail_past_recompile_limit  # noqa: E402
from specdraft.decoding.rounds.static_cache import forward_rows  # noqa: E402
from specdraft.decoding.costs.model import acceptance_from_mat, analytic_speedup, implementation_efficiency  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.costs.profile import cache_length_for, price_head_rules, profile_cost_table  # noqa: E402
from specdraft.decoding.costs.model import CostTable  # noqa: E402
from specdraft.decoding.policies.batch_aware import GlobalVerifyBudget, LockstepBatchAwareSpecDec, Prior  # noqa: E402
from specdraft.decoding.costs.throughput import ACCEPTANCE_FILE, AcceptanceSummary, summary_prior  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP  # noqa: E402
from specdraft.decoding.timing import bootstrap_rate_ratio  # noqa: E402
from benchmarks.harness.machine import machine  # noqa: E402
from benchmarks.harness.models import (DTYPES, RANDOM_SHAPES, ForwardCounter, add_device_flags, add_pair_flags,  # noqa: E402
                                       demo_shaped_pair, hf_generate, load, load_prompts)
from benchmarks.harness.timing import (compile_times, fastest_total, forward_time, interleave,  # noqa: E402
                                       interleaved, median_times)
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402


def bench_prior(constant: float | None, head_dir: pathlib.Path, head_config: dict) -> Prior:
    """The batch-aware rules' prior for a train-heads head directory: the drafter's dev acceptance curve from
    the summary train-heads wrote beside it (or `constant` for every position) and the head's w_rej / w_acc."""
    odds = head_config["w_rej"] / head_config.get("w_acc", 1.0)
    if constant is not None:
        return Prior((constant,), odds)
    return summary_prior(AcceptanceSummary.load(head_dir.parent / ACCEPTANCE_FILE), odds)


def untrained_head(hidden: int, device: str) -> torch.nn.Module:
    """A random linear head with sigmoid around 0.8: SpecDec++ rounds of a few tokens that vary by
    context. It predicts nothing; a trained head (--head) is what SpecDec++ is about."""
    torch.manual_seed(1)
    head = torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        head.bias.fill_(1.4)
    return head.to(device)


def ours(target, prompts, n, sampling, seed, compile, drafter=None, policy=None, eos=None):
    return generate_batch(target, prompts, n, drafter=drafter, policy=policy, sampling=sampling, seed=seed,
                          compile=compile, eos_token_id=eos)


def is_baseline(name: str) -> bool:
    """AR or a fixed K ("K=k"): the methods the adaptive ones are compared against."""
    return name == "AR" or re.fullmatch(r"K=\d+", name) is not None


def paired_with_best_k(rates: dict[str, list[float]], ks, fastest: dict[str, float] | None = None
                       ) -> tuple[str, dict[str, tuple[float, float, float, float | None]]]:
    """Each adaptive method against the best fixed K of `ks` (the one with the highest median rate, in hindsight),
    pass by pass: (that K's name, {method: (median, min, max) over passes of method's rate / K's rate in the same
    pass, then the same ratio of their `fastest` rates, or None}). A ratio within a pass cancels the box's phase,
    which a ratio of medians over passes keeps (at T = 0.7 compiled, K = 8's rate spanned 430-746 tokens/s over 7
    passes). Sampled, a pass gives every method one seed, but two methods that draft differently read its stream
    differently: the draw cancels only between methods that make the same decisions (a rule that drafts to K_max
    every round and fixed K = K_max). rates: {name: [tokens/s per pass]}; fastest: {name: tokens/s from each
    batch's fastest pass} (greedy); the methods compared are those not named AR or K=k."""
    fixed = [f"K={k}" for k in ks if f"K={k}" in rates]
    if not fixed:
        raise ValueError(f"none of the fixed K {list(ks)} was measured (have {sorted(rates)})")
    best = max(fixed, key=lambda name: statistics.median(rates[name]))
    out = {}
    for name, rs in rates.items():
        if is_baseline(name):
            continue
        ratios = [r / b for r, b in zip(rs, rates[best], strict=True)]
        out[name] = (statistics.median(ratios), min(ratios), max(ratios),
                     fastest[name] / fastest[best] if fastest else None)
    return best, out


def pooled_with_best_k(tokens: dict[str, list[list[int]]], times: dict[str, list[list[float]]], best: str,
                       resamples: int = 2000, seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """Sampled decodes: each adaptive method against `best` pooled over every (pass, batch) cell, {method: (ratio,
    lo, hi)}: the ratio of the two methods' rates over all cells (total tokens over total seconds), and its 95%
    paired bootstrap interval (`decoding.timing.bootstrap_rate_ratio`: cells resampled with replacement, the same
    cells for both methods, `resamples` times, seeded). Why not the per-pass spread: sampled, a pass's ratio carries two draws' luck (methods that
    draft differently read one seed's stream differently), so its min-max over passes measures the draws, not the
    uncertainty of the mean ratio; pooled over the cells, the luck averages out, and the interval says how much is
    left. Pairing by cell keeps what `interleave` gives: the two methods' decodes of a batch are a decode apart.
    tokens / times: {name: [[per batch] per pass]}; the methods compared are those not named AR or K=k."""
    def cells(name):
        return [c for per in zip(tokens[name], times[name]) for c in zip(*per)]  # (tokens, seconds) per cell
    ref = cells(best)
    out = {}
    for name in tokens:
        if is_baseline(name):
            continue
        s = bootstrap_rate_ratio([(t, sec, rt, rsec) for (t, sec), (rt, rsec) in zip(cells(name), ref, strict=True)],
                                 seed=seed, n_boot=resamples, level=0.95)
        out[name] = (s.median, s.lo, s.hi)
    return out


def pooled_table(pooled: list, ks) -> list[str]:
    """Sampled runs: `pooled_with_best_k`'s ratios at each B, [(B, best K, {method: (ratio, lo, hi)})]."""
    names = list(pooled[0][2])
    return [f"Pooled against the best fixed K in {{{', '.join(map(str, ks))}}} at each B (as above): a method's "
            "tokens/s over that K's, each the total over every pass and batch, [95% paired bootstrap interval over "
            "the (pass, batch) cells]", "", "| B | best K | " + " | ".join(f"{name} / best K" for name in names) + " |",
            "| ---: | ---: " + "| ---: " * len(names) + "|"] + [
        f"| {B} | {best} | " + " | ".join(f"{r:.3f} [{lo:.3f}-{hi:.3f}]" for r, lo, hi in ratios.values()) + " |"
        for B, best, ratios in pooled]


@torch.inference_mode()
def step_v(target, width: int, compile: StepCompiler, device: str, context: int = 64, reps: int = 60, warmup: int = 5) -> float:
    """The decoder's own verify step alone (no round around it): median robust seconds of one `width`-token
    forward over its static cache after `context` tokens over the median of a 1-token one, in `compile` mode
    (compiled in the untimed warm-up). The two widths alternate call by call, so a load phase or a clock
    change hits both alike (timed in blocks, one after the other, the ratio moved 1.13-1.47 between runs)."""
    cache = compile.cache(target, 1, 128)
    step = forward_step(compile, target)
    forward_rows(target, cache, torch.randint(3, target.config.vocab_size, (1, context), device=device))
    at_context = torch.full((1,), context, device=device)
    ids = {w: torch.randint(3, target.config.vocab_size, (1, w), device=device) for w in (1, width)}
    times = median_times({w: (lambda w=w: step(cache, ids[w])) for w in (1, width)},
                         lambda: cache.rollback(at_context), reps, device, warmup)
    return times[width] / times[1]


def batch1_table(args, target, drafter, prompts) -> list[str]:
    n, k, dev = args.max_new_tokens, args.k, args.device
    counter = ForwardCounter(target)
    # the target alone, outside any decoder: its (K+1)-token cached forward in units of its 1-token forward,
    # under transformers (dynamic cache, eager) and as the decoder's own step (static cache, this compile mode)
    v = forward_time(target, k + 1, device=dev) / forward_time(target, 1, device=dev)
    v_step = step_v(target, k + 1, args.compiler, dev)
    rows = []
    compile_s = {}
    costs = {}
    for mode, sampling in (("greedy", SamplingConfig(0.0)), (f"T={args.temperature}", SamplingConfig(args.temperature))):
        sums = {key: [0.0, 0] for key in ("ar", "ar_d", "spec", "hf", "hf_k")}
        mats = {key: [0, 0] for key in ("spec", "hf_k")}
        for i, prompt in enumerate(prompts):
            fns = {
                "ar": lambda: ours(target, [prompt], n, sampling, i, args.compiler, eos=args.eos),
                "ar_d": lambda: ours(drafter, [prompt], n, sampling, i, args.compiler, eos=args.eos),
                "spec": lambda: ours(target, [prompt], n, sampling, i, args.compiler, drafter, FixedK(k), eos=args.eos),
                "hf": lambda: hf_generate(target, drafter, counter, prompt, n, sampling, None, i, args.eos),
                "hf_k": lambda: hf_generate(target, drafter, counter, prompt, n, sampling, k, i, args.eos),
            }
            if args.compile != "none" and not compile_s:
                compile_s = compile_times({key: fns[key] for key in ("ar", "ar_d", "spec")}, dev)
            res = interleaved(fns, args.runs, dev)
            for key in ("ar", "ar_d", "spec"):
                m = res[key][2][0].metrics
                sums[key][0] += res[key][0]
                sums[key][1] += m.n_generated
                if key == "spec":
                    mats["spec"][0] += m.n_generated
                    mats["spec"][1] += m.n_target
            for key in ("hf", "hf_k"):
                toks, calls = len(res[key][2][0]), res[key][2][1]
                sums[key][0] += res[key][0]
                sums[key][1] += toks
                if key == "hf_k":
                    mats["hf_k"][0] += toks
                    mats["hf_k"][1] += calls
        tps = {key: tok / t for key, (t, tok) in sums.items()}
        mat = {key: a / b for key, (a, b) in mats.items()}
        c = tps["ar"] / tps["ar_d"]
        costs[mode] = c
        a = acceptance_from_mat(min(max(mat["spec"], 1.0), k + 1), k)
        speedup = tps["spec"] / tps["ar"]
        rows.append(f"| {mode} | {tps['ar']:.1f} | {tps['hf']:.1f} | {tps['ar'] / tps['hf']:.2f} | {tps['spec']:.1f} | "
                    f"{mat['spec']:.2f} | {tps['hf_k']:.1f} | {mat['hf_k']:.2f} | {tps['spec'] / tps['hf_k']:.2f} | "
                    f"{c:.3f} | {a:.3f} | {speedup:.2f} | {analytic_speedup(a, k, c):.2f} | "
                    f"{implementation_efficiency(speedup, a, k, c):.2f} | {v:.2f} | {v_step:.2f} | "
                    f"{implementation_efficiency(speedup, a, k, c, v_step):.2f} |")
    lines = [
        f"#### (a) Batch 1: ours vs transformers, K = {k}, {len(prompts)} prompts x {n} tokens{' (up to, stopping at EOS)' if args.eos is not None else ''}, median of {args.runs} "
        "interleaved runs per prompt",
        "",
        "| mode | ours AR tok/s | HF greedy/sample tok/s | ours AR / HF | ours K tok/s | ours MAT | HF assisted K tok/s "
        "| HF MAT | ours K / HF assisted | c | a | speedup | analytic | efficiency | HF v | step v | efficiency at step v |",
        "| --- " + "| ---: " * 16 + "|",
        *rows,
        "",
        "c = t_draft / t_target from ours-AR per-token times; a = the per-token acceptance whose fixed-K expected "
        "round equals our MAT; speedup = ours K / ours AR; efficiency = speedup / analytic (analytic assumes a "
        "(K+1)-token verify costs one 1-token forward); v = the target alone, no decoder around it: median (K+1)-token "
        "cached forward / median 1-token cached forward, under transformers (HF v: eager, dynamic cache) and as the "
        "decoder's own step (step v: its static cache, in this compile mode); 'efficiency at step v' puts step v in "
        "place of 1, leaving only the cost of the rounds around the model's forwards.",
    ]
    if compile_s:
        lines += ["", "Compile (first call, wall s, not in the times above): "
                  + ", ".join(f"{key} {s:.1f}" for key, s in compile_s.items())]
    args.cost_ratio = costs["greedy"]  # the length bandit's throughput reward in (b) uses the measured c
    return lines + [""]


def curve_policies(args, target, drafter, head, prompts, sizes: list[int]) -> tuple[dict, CostTable | None]:
    """Part (b)'s methods, {name: policy} (AR's None), and the cost table the batch-aware rules read, profiled at
    the batch sizes `sizes` (None with --no-table-rules: no such rules, no profile)."""
    n = args.max_new_tokens
    policies = {"AR": None, **{f"K={k}": FixedK(k) for k in args.ks}}
    policies["SpecDec++"] = SpecDecPP(head, threshold=args.h, k_max=args.k_max)
    if args.methods == "all":
        policies["SpecDec++ lockstep"] = LockstepSpecDecPP(head, threshold=args.h, k_max=args.k_max)
        policies["UCBSpec 0..4"] = LengthUCB((0, 1, 2, 3, 4), cost_ratio=args.cost_ratio)
    if not args.table_rules:
        return policies, None
    # the batch-aware rule and vLLM's global verify budget, priced with the decoder's own step times on this
    # device and mode (profiled here, over the curve's batch sizes and widths up to K_max + 1, the loop calibrated,
    # over the cache the curve's decodes allocate)
    # (timed after the prompts' median length, as bench_predict: a call's start is mostly its prefill; and a
    # fixed 64 did not fit the cache of short decodes)
    lengths = [len(p) for p in prompts[:max(args.batch_sizes)]]
    slots = cache_length_for(max(lengths), n, args.k_max, args.compile)
    table = profile_cost_table(target, drafter, sorted(set(sizes)), args.k_max + 1, args.compile,
                               calibrate=True, cache_length=slots, context=int(statistics.median(lengths)))
    # the head's forward and the rules' decisions, which their rounds pay beyond fixed K's (eager only)
    table = price_head_rules(table, head, drafter.config.hidden_size, args.prior, args.k_max, args.h)
    policies["batch-aware lockstep"] = LockstepBatchAwareSpecDec(head, table, args.prior, args.k_max)
    if args.methods == "all":
        # the rule's earlier form: lam = the round's own rate, which weighs the tokens a round has already banked
        policies["batch-aware lockstep, own rate"] = LockstepBatchAwareSpecDec(head, table, args.prior, args.k_max,
                                                                              reference_rate=None)
    policies["global budget K=4"] = GlobalVerifyBudget(head, table, args.prior, min(4, args.k_max))
    return policies, table


def curve_header(args, sampling: SamplingConfig, policies: dict) -> list[str]:
    """Part (b)'s title (mode, lengths, passes) and its table's header."""
    mode = "greedy" if sampling.greedy else f"T = {sampling.temperature:g}"
    return [
        f"#### (b) Batch curve: {mode}, {args.max_new_tokens} tokens per row{' (up to, stopping at EOS)' if args.eos is not None else ''}, median of {args.runs} runs interleaved batch by batch (spread: min-max)"
        + ("" if sampling.greedy else f"; run i samples with seed i (0..{args.runs - 1}), the same seed for every method, MAT over all runs"),
        "",
        "| B | " + " | ".join(f"{name} tok/s" for name in policies) + " | "
        + " | ".join(f"{name} / AR" for name in policies if name != "AR") + " | " + " | ".join(
            f"{name} MAT" for name in policies if name != "AR") + " |",
        "| ---: " * (1 + len(policies) + 2 * (len(policies) - 1)) + "|",
    ]


def curve_batch_size(args, target, drafter, policies: dict, prompts, B: int, sampling: SamplingConfig) -> tuple:
    """Every method on the prompts in batches of B, taking turns batch by batch (`interleave`): -> (compile
    seconds, or None eager; seconds per cell; tokens per cell; {name: tokens/s per pass}; {name: MAT over every
    pass}; {name: tokens/s from each batch's fastest pass}, greedy only)."""
    n, dev = args.max_new_tokens, args.device
    shared = prompts[:args.n_batch1]
    # up to part (a)'s prompt count, every B decodes part (a)'s prompts, in consecutive batches of B: the
    # B = 1 row is part (a)'s decode of the same prompts, and the low-B rows differ only by B; a larger B
    # decodes its first B prompts as one batch
    batches = [shared[i:i + B] for i in range(0, len(shared), B)] if B <= len(shared) else [prompts[:B]]
    calls = {name: (lambda batch, seed, p=p: ours(target, batch, n, sampling, seed, args.compiler,
                                                  drafter if p else None, p, eos=args.eos))
             for name, p in policies.items()}
    compile_s = None
    if args.compile != "none":
        compile_s = sum(compile_times({name: (lambda fn=fn: [fn(b, 0) for b in batches])
                                       for name, fn in calls.items()}, dev).values())
    unit_times, unit_out = interleave(calls, batches, args.runs, dev, seeded=not sampling.greedy)
    mats, rates, fastest, cell_tokens = {}, {}, {}, {}
    for name, per_pass in unit_times.items():
        # per pass: a sampled pass's tokens differ with its seed (rows stop at EOS); MAT over every pass
        cell_tokens[name] = [[sum(r.metrics.n_generated for r in res) for res in outs] for outs in unit_out[name]]
        results = [[r for res in outs for r in res] for outs in unit_out[name]]
        tokens = [sum(cells) for cells in cell_tokens[name]]
        rates[name] = [n_tok / sum(ts) for n_tok, ts in zip(tokens, per_pass)]
        mats[name] = sum(tokens) / sum(r.metrics.n_target for res in results for r in res)
        if sampling.greedy:  # every pass decodes the same tokens: each batch's fastest pass is its least-disturbed
            fastest[name] = tokens[0] / fastest_total(per_pass)
    return compile_s, unit_times, cell_tokens, rates, mats, fastest


def curve_row(B: int, policies: dict, rates: dict, mats: dict) -> str:
    """Part (b)'s row at B: tokens/s (median and min-max over passes), the ratio to AR's, and MAT, per method."""
    tps = {name: (statistics.median(r), min(r), max(r)) for name, r in rates.items()}
    cells = [f"{v[0]:.0f} ({v[1]:.0f}-{v[2]:.0f})" for v in tps.values()]
    ratios = [f"{tps[name][0] / tps['AR'][0]:.2f}" for name in policies if name != "AR"]
    mat_cells = [f"{mats[name]:.2f}" for name in policies if name != "AR"]
    return f"| {B} | " + " | ".join(cells + ratios + mat_cells) + " |"


def batch_curve_table(args, target, drafter, head, prompts) -> list[str]:
    """(b) Every method's tokens/s at each batch size, each adaptive method paired with the best fixed K. With
    --profile-each-batch the table rules' cost table is profiled at B right before B's decodes (and their
    policies built on it), so each B's row prints before the next B's graphs are built; eager, at {1, B}: an eager
    batch drops its finished rows, and the rules then price smaller batches."""
    sampling = SamplingConfig(args.curve_temperature)  # the head given must be trained for it (--head)
    each = args.profile_each_batch

    def sizes(B: int) -> list[int]:
        return [B] if args.compile != "none" else [1, B]
    policies, table = curve_policies(args, target, drafter, head, prompts,
                                     sizes(args.batch_sizes[0]) if each else [1, *args.batch_sizes])
    tables = [table]
    lines = curve_header(args, sampling, policies)
    compile_s, paired, pooled = {}, [], []
    for B in args.batch_sizes:
        if each and B != args.batch_sizes[0]:
            policies, table = curve_policies(args, target, drafter, head, prompts, sizes(B))
            tables.append(table)
        seconds, unit_times, cell_tokens, rates, mats, fastest = curve_batch_size(args, target, drafter, policies,
                                                                                   prompts, B, sampling)
        if seconds is not None:
            compile_s[B] = seconds
        paired.append((B, paired_with_best_k(rates, args.goal_ks, fastest), paired_with_best_k(rates, args.ks, fastest)))
        if not sampling.greedy:  # per-pass ratios carry the draws' luck: pooled over the cells too
            pooled.append([(B, best, pooled_with_best_k(cell_tokens, unit_times, best))
                           for best in (paired[-1][1][0], paired[-1][2][0])])
        lines.append(curve_row(B, policies, rates, mats))
        print(lines[-1], flush=True)
    return lines + curve_notes(args, paired, pooled, [t for t in tables if t is not None], compile_s)


def curve_notes(args, paired: list, pooled: list, tables: list[CostTable], compile_s: dict) -> list[str]:
    """What part (b)'s methods are, its paired (and, sampled, pooled) comparisons, its cost table, compile times."""
    lines = ["", f"SpecDec++: {'head ' + args.head if args.head else 'an untrained random head (its stops mean nothing)'}"
             f", h = {args.h}, K_max = {args.k_max}; each row stops alone (the paper's rule), or, lockstep, the batch "
             "stops together when its drafting rows' mean predicted rejection probability exceeds h. UCBSpec: "
             "per-row bandit over draft lengths 0..4, reward = "
             f"the round's throughput (n_acc + 1) / (1 + c k) at c = {args.cost_ratio:.3f} (BanditSpec §6.2; "
             "from (a) when it ran). Batch-aware lockstep: the batch drafts on while a longer round's expected "
             "tokens exceed lam times its extra cost in the decoder's measured step times at B, lam = the cost "
             "model's best fixed-K rate at B (own rate: lam = the round's own tokens per second so far) ("
             f"{args.prior}; docs/decoder.md); global budget: every row drafts 4, the top-N drafts of the batch by "
             "survival are verified (vLLM #47808). MAT = tokens per target forward (bonus counted), summed over rows.",
             ""] + paired_table([(B, *goal) for B, goal, _ in paired], args.goal_ks)
    if pooled:
        lines += [""] + pooled_table([goal for goal, _ in pooled], args.goal_ks)
    if set(args.ks) - set(args.goal_ks):  # a longer fixed K than the goal's: the rules paired with it too
        lines += [""] + paired_table([(B, *every) for B, _, every in paired], args.ks)
        if pooled:
            lines += [""] + pooled_table([every for _, every in pooled], args.ks)
    lines += (["", "Cost table (this run; one per B with --profile-each-batch):", "", "```",
               *(t.render() for t in tables), "```"] if tables else
              ["", "Left out (--no-table-rules): the batch-aware rule and the global verify budget, and the cost table "
               "they read (profiling it at every B and width takes longer than the curve on a large target)."])
    if compile_s:
        lines += ["", "Compile + first decode per B (wall s, all methods): "
                  + ", ".join(f"B={b}: {s:.1f}" for b, s in compile_s.items())]
    return lines + [""]


def paired_table(paired: list, ks) -> list[str]:
    """Part (b)'s adaptive methods against the best fixed K of `ks` at each B, paired pass by pass
    (`paired_with_best_k`), and, greedy, from each batch's fastest pass."""
    names = list(paired[0][2])
    with_fastest = any(r[3] is not None for _, _, ratios in paired for r in ratios.values())
    lines = [f"Paired with the best fixed K in {{{', '.join(map(str, ks))}}} at each B (the K with the highest median "
             "rate): the median over passes of a method's rate over that K's rate in the same pass (spread: min-max)"
             + ("; after the semicolon, the same ratio with each method's time the sum over batches of its fastest "
                "pass (the least-disturbed estimate)" if with_fastest else ""),
             "", "| B | best K | " + " | ".join(f"{name} / best K" for name in names) + " |",
             "| ---: | ---: " + "| ---: " * len(names) + "|"]
    for B, best, ratios in paired:
        lines.append(f"| {B} | {best} | " + " | ".join(
            f"{m:.2f} ({lo:.2f}-{hi:.2f})" + (f"; {f:.2f}" if f is not None else "")
            for m, lo, hi, f in ratios.values()) + " |")
    return lines


def deciding_cost_table(args, target, drafter, head, prompts, k: int = 4) -> list[str]:
    """(c) The cost of deciding at batch 1: rules made to take fixed K's decisions (SpecDec++ at an h that
    never fires; the batch-aware rule over a table where every draft pays and a prior of 1), so that every
    method drafts and verifies exactly what FixedK(k) does, round for round; what their rounds cost beyond
    fixed K's is the head's forward on each draft and the rule's own work."""
    n, dev, greedy = args.max_new_tokens, args.device, SamplingConfig(0.0)
    widths = tuple(range(1, k + 2))
    always = CostTable(batch_sizes=(1, 4096), widths=widths, verify=((1.0,) * len(widths),) * 2, draft=(1e-6,) * 2,
                       catchup=(1e-6,) * 2, device="forced", torch_version=torch.__version__, compile=args.compile,
                       target_id="-", drafter_id="-")
    policies = {f"K={k}": lambda: FixedK(k), "SpecDec++ (h = 1 - 1e-9)": lambda: SpecDecPP(head, 1 - 1e-9, k_max=k),
                "batch-aware lockstep": lambda: LockstepBatchAwareSpecDec(head, always, Prior((1.0,)), k)}
    calls = {name: (lambda p, seed, make=make: ours(target, [p], n, greedy, seed, args.compiler, drafter, make(),
                                                   eos=args.eos)[0])
             for name, make in policies.items()}
    unit_times, out = interleave(calls, prompts, args.runs, dev)  # prompt by prompt
    times = {name: [sum(ts) for ts in per_pass] for name, per_pass in unit_times.items()}
    rounds = {name: [r.metrics.drafted for r in res[-1]] for name, res in out.items()}
    same = all(rounds[name] == rounds[f"K={k}"] for name in rounds)
    n_rounds = sum(len(d) for d in rounds[f"K={k}"])
    base = statistics.median(times[f"K={k}"])
    lines = [f"#### (c) Cost of deciding: batch 1, {len(prompts)} prompts x {n} tokens{' (up to EOS)' if args.eos is not None else ''}, every method fixed K = {k}'s "
             f"rounds ({'identical, checked' if same else 'NOT identical: the rows below do not isolate the rule'}), "
             f"median of {args.runs} runs interleaved prompt by prompt (spread: min-max)", "",
             "| method | ms per round | over fixed K |", "| --- | ---: | ---: |"]
    for name, ts in times.items():
        per = [t / n_rounds * 1e3 for t in ts]
        lines.append(f"| {name} | {statistics.median(per):.3f} ({min(per):.3f}-{max(per):.3f}) | "
                     f"{statistics.median(ts) / base - 1:+.1%} |")
        print(lines[-1], flush=True)
    return lines + [""]


def check_goal_ks(parser: argparse.ArgumentParser, args) -> None:
    """Part (b) pairs its adaptive methods with the best fixed K of --goal-ks: each compile mode must measure one."""
    if "b" in args.skip.split(","):
        return
    for mode in args.compile.split(","):
        flag, ks = ("--ks", args.ks) if mode == "none" else ("--compiled-ks", [int(k) for k in args.compiled_ks.split(",")])
        if not set(ks) & set(args.goal_ks):
            parser.error(f"part (b) pairs its adaptive methods with the best of --goal-ks {args.goal_ks}, and {flag} "
                         f"{ks} measures none of them: add one to {flag} or change --goal-ks")


def build_parser() -> argparse.ArgumentParser:
    """The command line (the module docstring says what each part measures)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_flags(parser)
    parser.add_argument("--head", help="acceptance head dir (train-heads output) for the SpecDec++ column")
    parser.add_argument("--h", type=float, default=0.7)
    parser.add_argument("--cost-ratio", type=float, default=0.2,
                        help="c = t_draft / t_target for the UCBSpec throughput reward when part (a) is skipped")
    parser.add_argument("--k-max", type=int, default=8)
    parser.add_argument("--prior", type=float, default=None,
                        help="the batch-aware rule's prior, one acceptance for every position (default: with --head "
                             "the acceptance curve of train-heads' summary beside it, else 0.7)")
    parser.add_argument("--shape", default="demo", choices=sorted(RANDOM_SHAPES),
                        help="the random pair's shape without --target: the demo's 16 x 128, or a ~1B target (GPU)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary of the random pair (default: its shape's)")
    parser.add_argument("--nudge", type=float, default=0.05, help="damping of the random pair's deeper layers")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--ks", default="2,4,8")
    parser.add_argument("--goal-ks", default="1,2,4,8",
                        help="the fixed K part (b) pairs the adaptive methods with: the best of them at each B")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--eos", action="store_true",
                        help="every method stops a row at the target's EOS, as served (default: every row decodes "
                             "--max-new-tokens, past EOS: equal work for the transformers comparison)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.7, help="part (a)'s sampled rows")
    parser.add_argument("--curve-temperature", type=float, default=0.0,
                        help="part (b)'s sampling (0: greedy); --head must be a head trained for it")
    parser.add_argument("--compile", default="none",
                        help="comma list of modes, each measured in turn: none, default, reduce-overhead")
    parser.add_argument("--compiled-batch-sizes", default="1,4,16",
                        help="batch sizes of part (b) under a compile mode (each B compiles its own graphs)")
    parser.add_argument("--compiled-ks", default="4", help="fixed K columns of part (b) under a compile mode")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: a, b, c")
    parser.add_argument("--table-rules", action=argparse.BooleanOptionalAction, default=True,
                        help="part (b)'s rules that read a cost table profiled here (the batch-aware rule, the global "
                             "verify budget); --no-table-rules leaves them and the profile out")
    parser.add_argument("--methods", default="all", choices=["all", "core"],
                        help="part (b)'s methods: all, or core: AR, fixed K, SpecDec++, the batch-aware rule and the "
                             "global verify budget (without SpecDec++ lockstep, UCBSpec and the batch-aware rule's "
                             "own-rate form: fewer graphs to compile where a cold compile is dear, as on a lent GPU)")
    parser.add_argument("--profile-each-batch", action="store_true",
                        help="part (b): profile the table rules' cost table at B right before each B's decodes "
                             "(a compiled run on a GPU then prints B = 1's row before building B = 64's graphs)")
    parser.add_argument("--compiled-skip", default="",
                        help="parts to skip under a compile mode only (e.g. b, c: a large target's compiled batch-1 "
                             "row without compiling every policy at every B)")
    add_device_flags(parser)
    add_section_flags(parser)
    return parser


def check_args(parser: argparse.ArgumentParser, args) -> tuple[list[str], set[str]]:
    """The comma lists as ints, checked before any model loads: -> (the compile modes, the parts to skip;
    args.compiled_skip becomes the set skipped under a compile mode besides)."""
    args.ks = [int(k) for k in args.ks.split(",")]
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.goal_ks = [int(k) for k in args.goal_ks.split(",")]
    check_goal_ks(parser, args)
    modes = args.compile.split(",")
    if any(mode not in ("none", "default", "reduce-overhead") for mode in modes):
        parser.error(f"--compile takes none, default, reduce-overhead (comma separated), got {args.compile!r}")
    args.compiled_skip = set(filter(None, args.compiled_skip.split(",")))
    return modes, set(filter(None, args.skip.split(",")))


def load_models(args) -> tuple:
    """(target, drafter, head, what the pair is): --target/--drafter or the random demo-shaped pair; the head
    from --head or an untrained one; sets args.prior, the batch-aware rules' prior."""
    dtype = DTYPES[args.dtype]
    if args.target and args.drafter:
        target, drafter = load(args.target, args.device, dtype), load(args.drafter, args.device, dtype)
        pair = f"target {args.target}, drafter {args.drafter}"
    else:
        target, drafter = demo_shaped_pair(args.vocab, args.nudge, args.device, dtype, args.shape)
        cfg = target.config
        pair = (f"random {args.shape}-shaped pair ({cfg.num_hidden_layers} x {cfg.hidden_size} target of "
                f"{target.num_parameters() / 1e6:.0f}M parameters, its first layer as drafter, deeper layers damped by "
                f"{args.nudge}): acceptance reflects that construction, not a trained drafter")
    if args.head:
        from specdraft.decoding.policies.acceptance_head import load_head

        head, head_config = load_head(args.head, expected_hidden_size=drafter.config.hidden_size)
        head = head.to(args.device)
        args.prior = bench_prior(args.prior, pathlib.Path(args.head), head_config)
    else:
        head = untrained_head(drafter.config.hidden_size, args.device)
        args.prior = Prior((0.7 if args.prior is None else args.prior,))
    return target, drafter, head, pair


def bench_prompts(parser: argparse.ArgumentParser, args, target) -> list[list[int]]:
    """Enough prompts for the largest batch (part (a) and (c) take the first --n-prompts); sets args.n_batch1,
    args.n_prompts and args.eos (the target's EOS id with --eos, else None)."""
    args.n_batch1 = args.n_prompts
    args.n_prompts = max(args.n_prompts, max(args.batch_sizes))
    eos = getattr(target.generation_config, "eos_token_id", None) if args.eos else None
    if args.eos and not isinstance(eos, int):
        parser.error(f"--eos needs a target with one EOS token id in its generation config, got {eos!r}")
    args.eos = eos
    prompts = load_prompts(args, target.config.vocab_size)
    if len(prompts) < args.n_prompts:  # a set smaller than the largest batch: its prompts again, in order
        print(f"note: {len(prompts)} prompts for batches of up to {args.n_prompts}: the batch repeats them", flush=True)
        prompts = (prompts * -(-args.n_prompts // len(prompts)))[:args.n_prompts]
    return prompts


def header_lines(args, argv_text: str, pair: str) -> list[str]:
    """The section's title (date, machine), command line and what the times are."""
    # a GPU's figures name the GPU and the CUDA torch was built with
    return [
        f"## Batched static-cache decoder ({datetime.date.today()}, {machine(args.device, args.dtype)})",
        "",
        f"`python benchmarks/decoder/bench_batch_decoder.py {argv_text}`; {pair}. Times: this process's "
        f"{'CUDA events' if args.device.startswith('cuda') else 'CPU time'}.",
        "",
    ]


def mode_tables(args, skip: set[str], target, drafter, head, prompts) -> list[str]:
    """One compile mode's parts (a), (b) and (c), those not skipped."""
    lines = [f"### compile: {args.compile}", ""]
    if "a" not in skip:
        lines += batch1_table(args, target, drafter, prompts[:args.n_batch1])
    if "b" not in skip:
        lines += batch_curve_table(args, target, drafter, head, prompts)
    if "c" not in skip:
        lines += deciding_cost_table(args, target, drafter, head, prompts[:args.n_batch1])
    return lines


def main(argv=None, owner: pathlib.Path | None = None) -> int:
    """The benchmark; its section is the one of the script `owner` (default: this one), for a wrapper that runs it
    on another pair (bench_real_pair.py)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    fail_past_recompile_limit()  # a shape run eagerly past dynamo's limit would be timed as compiled
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    modes, skip = check_args(parser, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, drafter, head, pair = load_models(args)
    eager_sizes, eager_ks = args.batch_sizes, args.ks
    prompts = bench_prompts(parser, args, target)
    start = time.time()
    lines = header_lines(args, argv_text, pair)
    for mode in modes:
        args.compile = mode
        args.compiler = StepCompiler(mode)  # one per mode for the whole run: each graph compiles once
        compiled = mode != "none"
        args.batch_sizes = [int(b) for b in args.compiled_batch_sizes.split(",")] if compiled else eager_sizes
        args.ks = [int(k) for k in args.compiled_ks.split(",")] if compiled else eager_ks
        lines += mode_tables(args, skip | (args.compiled_skip if compiled else set()), target, drafter, head, prompts)
    lines += [f"Run time {time.time() - start:.0f} s; load average at the end {os.getloadavg()[0]:.1f}.", ""]
    publish_for("\n".join(lines), not args.no_append, owner or pathlib.Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
