"""bench_batch_decoder.py part (b), the batch curve: every method's tokens/s at each batch size.

For each B, part (a)'s prompts in consecutive batches of B (a B above their count: its first B prompts as one
batch), decoded by every method (AR, fixed K for --ks, SpecDec++ with --head or an untrained random head, per row
and lockstep (the batch stops together), UCBSpec over lengths 0..4, and the rules that read a cost table profiled
here: the batch-aware rule and the global verify budget), --runs passes, the methods taking turns batch by batch
(`harness.timing.interleave`); tokens/s = the median over passes of generated tokens / time, with the spread
(min-max over passes) and the speedup over batched AR at the same B.
Sampled (--curve-temperature > 0), run i draws with seed i for every method (the warm-up decodes every seed first,
so no pass compiles): the median then spans draws.
Each adaptive method is also paired pass by pass with the best fixed K of --goal-ks (`paired_with_best_k`); greedy,
also by each batch's fastest pass; sampled, also pooled over every pass and batch, with a paired bootstrap interval
(`pooled_with_best_k`: a sampled pass's ratio carries two draws' luck).
"""
from __future__ import annotations

import re
import statistics

from specdraft.decoding.costs.model import CostTable
from specdraft.decoding.costs.profile import cache_length_for, price_head_rules, profile_cost_table
from specdraft.decoding.policies.batch_aware import GlobalVerifyBudget, LockstepBatchAwareSpecDec
from specdraft.decoding.policies.batch_length_ucb import LengthUCB
from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.timing import bootstrap_rate_ratio
from benchmarks.harness.models import ours
from benchmarks.harness.timing import compile_times, fastest_total, interleave


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


def pooled_table(pooled: list, ks) -> list[str]:
    """Sampled runs: `pooled_with_best_k`'s ratios at each B, [(B, best K, {method: (ratio, lo, hi)})]."""
    names = list(pooled[0][2])
    return [f"Pooled against the best fixed K in {{{', '.join(map(str, ks))}}} at each B (as above): a method's "
            "tokens/s over that K's, each the total over every pass and batch, [95% paired bootstrap interval over "
            "the (pass, batch) cells]", "", "| B | best K | " + " | ".join(f"{name} / best K" for name in names) + " |",
            "| ---: | ---: " + "| ---: " * len(names) + "|"] + [
        f"| {B} | {best} | " + " | ".join(f"{r:.3f} [{lo:.3f}-{hi:.3f}]" for r, lo, hi in ratios.values()) + " |"
        for B, best, ratios in pooled]


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
             f"{args.prior}; docs/predict.md); global budget: every row drafts 4, the top-N drafts of the batch by "
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

