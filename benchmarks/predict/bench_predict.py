"""`specdraft predict`'s model against measurement: predicted tokens/s (decoding/costs/throughput.py, priced with
the cost table profiled here) beside the batched decoder's measured tokens/s, per batch size, for AR and
fixed K, on the demo-shaped random pair (harness.models.demo_shaped_pair), or with --bundle on a bundle's
target and drafter, where the drafter's greedy head also decodes with SpecDec++ (each row stopping alone) and the
lockstep batch-aware rule.

    python benchmarks/predict/bench_predict.py [--batch-sizes 1,4,16] [--ks 2,4] [--max-new-tokens 48] [--runs 3]
        [--compile none] [--rounds 400] [--seed 0] [--bundle runs/demo/bundle [--drafter ofa]
        [--prompt-set runs/demo/prompts/sets]] [--profile-each-batch | --paired] [--decisions]
        [--shape demo|1b] [--dtype float32|bfloat16] [--device cuda] [--section NAME]

The acceptance side is what greedy decoding of these prompts really meets: for each prompt the target's greedy
continuation, and at each of its positions whether the drafter's greedy token (teacher-forced on the target's
prefix) agrees (P_i in {0, 1}: the hindsight oracle's indicators, docs/algorithms.md#hindsight-oracle), and
with a bundle its head's sigma at the same positions (the batch-aware rule's input; its prior is the bundle's).
The measured side decodes the first max(B) prompts at every B, in consecutive batches of B with
`generate_batch` (so a B = 1 figure is not one prompt's, and every B decodes the same responses), `--runs`
passes after a warm-up, the methods taking turns batch by batch (`harness.timing.interleave`), process CPU
time (CUDA events with --device cuda; `decoding.timing`). Measured twice: the median over passes, and each
batch's fastest pass summed (the least-disturbed estimate; the table's entries are each step's fastest timing,
so on a loaded box this is the like-for-like figure). Error = predicted / measured - 1, against each. Each
batch's prefill runs at its longest prompt: the prediction prices a call's start at the mean of that over the
batches.

The prediction simulates static batches as `generate_batch` runs them (rows finish at different rounds,
finished rows cost compute until the eager decoder drops them) and prices the loop's own work per round
and per draft step, and a call's start (prefills, setup) once per batch, from the table's calibration
(`costs.profile.calibrate_loop`, at prompts of the table's context length).

--paired (eager only) separates the model's error from the machine's drift: on a shared box the load moves by
a third between a table profiled once and decodes minutes later, more than the error the goal bounds. Each pass
profiles its own table at B (seconds, eager), predicts from it, then decodes every method once; the error is the
median over passes of each pass's predicted / measured - 1 (spread: min-max). The batch-aware rule decodes with
its pass's table, as a decoder that profiles at start would. Compiled, a new table is a new set of constants in
the rule's draft graphs (a recompile), so --paired refuses --compile.

--decisions also decodes, at each B, fixed K at the K predict chooses there (its K table; AR where it chooses 0) and
judges it pass by pass against the best of AR and the measured fixed Ks in the same pass: paired, each pass's own
table chooses; unpaired (compiled runs, gpu_check.py), the one table does. --shape 1b --dtype bfloat16 is the random
~1B pair a GPU run uses (harness.models.RANDOM_SHAPES).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.core.devices import device_name  # noqa: E402
from specdraft.decoding.batched import generate_batch  # noqa: E402
from specdraft.decoding.rounds.kv import input_device  # noqa: E402
from specdraft.decoding.compilation import StepCompiler, fail_past_recompile_limit  # noqa: E402
from specdraft.decoding.costs.profile import cache_length_for, cached_cost_table, price_head_rules  # noqa: E402
from specdraft.decoding.policies.batch_aware import LockstepBatchAwareSpecDec  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK, SpecDecPP  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from specdraft.decoding.policies.batch_aware import k_per_batch_size  # noqa: E402
from specdraft.decoding.costs.throughput import (acceptance_curve, predict_throughput, summarize_acceptance,  # noqa: E402
                                           summary_prior)
from specdraft.decoding.timing import timed_call  # noqa: E402
from benchmarks.harness.models import DTYPES, RANDOM_SHAPES, add_device_flags, demo_shaped_pair  # noqa: E402
from benchmarks.harness.timing import fastest_total, interleave, rotated  # noqa: E402
from benchmarks.harness.publish import add_section_flags, publish_for  # noqa: E402


@torch.inference_mode()
def greedy_agreement(target, drafter, prompts: list[list[int]], n: int, head=None, eos: int | None = None
                     ) -> tuple[list, list]:
    """Per prompt, (n,) float: 1 where the drafter's greedy token on the target's greedy prefix is the
    target's; and the head's sigma at the positions holding those tokens (what acceptance-data's features
    are), or the agreement itself without a head. With eos, a response ends at it (its sequence is shorter
    than n, and the prediction ends the row there)."""
    agree, sigma = [], []
    dev = input_device(drafter)
    for p, r in zip(prompts, generate_batch(target, prompts, n, eos_token_id=eos)):
        ids = torch.tensor([p + r.tokens], device=dev)
        out = drafter(ids, output_hidden_states=True)
        agree.append((out.logits[0, len(p) - 1:-1].argmax(-1) == ids[0, len(p):]).double().cpu())
        sigma.append(agree[-1] if head is None else
                     torch.sigmoid(head(out.hidden_states[-1][0, len(p):]).float()).double().cpu())
    return agree, sigma


# unpaired: measured as the median over passes, and from each batch's fastest pass. The table prices each step
# at its fastest of several timings (`profile_cost_table`): a least-disturbed estimate, which on a loaded box sits
# below a median's disturbance; the fastest passes are the decodes' least-disturbed estimate
FASTEST_HEADER = ("| method | B | predicted tok/s | measured tok/s, median | predicted / median - 1 | measured tok/s, "
                  "fastest passes | predicted / fastest - 1 | predicted MAT | measured MAT |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


PAIRED_HEADER = ("| method | B | predicted tok/s | measured tok/s | predicted / measured - 1, per pass | predicted MAT | "
                 "measured MAT |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")


def unpaired_rows(b: int, predicted: dict, times: dict, outs: dict, worst: dict, worst_fastest: dict) -> list[str]:
    """Rows at batch size b from `interleave`'s times and outputs (greedy: every pass decodes the same tokens):
    measured tokens/s as the median over passes of their total time, and as the sum of each batch's fastest
    pass; `worst` / `worst_fastest` take each method's |error| against either."""
    rows = []
    for name, per_pass in times.items():
        out = [r for res in outs[name][0] for r in res]
        tokens = sum(r.metrics.n_generated for r in out)
        measured = tokens / statistics.median(map(sum, per_pass))
        fastest = tokens / fastest_total(per_pass)
        mat = tokens / sum(r.metrics.n_target for r in out)
        p = predicted[name]["tokens_per_s"]
        worst[name] = max(worst.get(name, 0.0), abs(p / measured - 1))
        worst_fastest[name] = max(worst_fastest.get(name, 0.0), abs(p / fastest - 1))
        rows.append(f"| {name} | {b} | {p:.1f} | {measured:.1f} | {p / measured - 1:+.1%} | {fastest:.1f} | "
                    f"{p / fastest - 1:+.1%} | {predicted[name]['mat']:.2f} | {mat:.2f} |")
    return rows


def paired_rows(b: int, groups, profile, predicted_at, methods, runs: int, worst: dict, device: str = "cpu",
                decisions: dict | None = None) -> tuple[list[str], object]:
    """--paired at batch size b: a warm-up pass (its table profiled and its methods decoded, untimed), then `runs`
    passes, each profiling a table, predicting from it and decoding every method once, in turn (one timed call
    each, in rotating order so no method always follows the profile). Rows: medians of the passes' predicted and
    measured tokens/s, and the median (min-max) of the per-pass errors; `worst` takes each method's |median error|.
    Returns (rows, the last pass's table). With a "K table" method (the K predict chooses at b, decoded) and
    `decisions`, decisions[b] takes each pass's (chosen K, measured best fixed K, its rate / the best's)."""
    preds: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {}
    mats: dict[str, tuple[float, float]] = {}
    errs: dict[str, list[float]] = {}
    chosen: list = []
    for i in range(runs + 1):
        table = profile()
        predicted = predicted_at(table, groups, b)
        fns = methods(table, groups)
        if i == 0:  # warm-up: first calls allocate caches and build the rule's constants
            for fn in fns.values():
                fn()
            continue
        chosen.append(predicted.get("K table", {}).get("k"))
        names = list(fns)
        for name in rotated(names, i - 1):
            out, t = timed_call(fns[name], device)
            tokens = sum(r.metrics.n_generated for r in out)
            rate = tokens / t.time
            p = predicted[name]["tokens_per_s"]
            preds.setdefault(name, []).append(p)
            rates.setdefault(name, []).append(rate)
            errs.setdefault(name, []).append(p / rate - 1)
            mats[name] = (predicted[name]["mat"], tokens / sum(r.metrics.n_target for r in out))
    if decisions is not None and "K table" in rates:
        decisions[b] = decision_quality(rates, chosen)
    rows = []
    for name in fns:
        e = errs[name]
        worst[name] = max(worst.get(name, 0.0), abs(statistics.median(e)))
        rows.append(f"| {name} | {b} | {statistics.median(preds[name]):.1f} | {statistics.median(rates[name]):.1f} | "
                    f"{statistics.median(e):+.1%} ({min(e):+.1%}..{max(e):+.1%}) | {mats[name][0]:.2f} | {mats[name][1]:.2f} |")
    return rows, table


def bundle_pair(args):
    """(target, drafter, head, prior, prompts, what) from --bundle: the drafter's greedy head and its prior."""
    from specdraft.data.chat import row_messages
    from specdraft.decoding.bundle.chat import format_prompt
    from specdraft.decoding.bundle.directory import load_bundle

    bundle = load_bundle(args.bundle)
    name = args.drafter or bundle.general_drafter()
    target = bundle.load_target(device=args.device)
    drafter = bundle.load_drafter(name, device=args.device, target=target)
    head_name = bundle.head_for(name, SamplingConfig(0.0))
    head = bundle.load_head(name, head_name, device=args.device)[0]
    if args.prompt_set:
        from datasets import load_from_disk

        tok = bundle.load_tokenizer()
        rows = load_from_disk(args.prompt_set)["test"]
        prompts = [format_prompt(tok, row_messages(r), bundle.chat) for r in rows]
    else:
        gen = torch.Generator().manual_seed(args.seed)
        prompts = [torch.randint(3, target.config.vocab_size, (args.prompt_length,), generator=gen).tolist()
                   for _ in range(max(args.sizes))]
    return (target, drafter, head, bundle.prior_for(name, head_name), prompts,
            f"{args.bundle}: drafter {name}, head {head_name}, rows stop at the target's EOS")


def decision_quality(rates: dict[str, list[float]], chosen: list) -> list[tuple]:
    """Per pass: (the K predict chose, the measured best fixed K, the chosen K's rate / the best's). The fixed Ks
    are the measured "K=k" methods and AR (K = 0, which predict may choose), all from the same pass."""
    fixed = {0 if name == "AR" else int(name[2:]): r for name, r in rates.items() if name == "AR" or name.startswith("K=")}
    out = []
    for i, k in enumerate(chosen):
        best = max(fixed, key=lambda kk: fixed[kk][i])
        out.append((k, best, rates["K table"][i] / fixed[best][i]))
    return out


def decision_lines(decisions: dict) -> list[str]:
    """The decisions table: per B the K predict chose in each pass, the measured best, and the ratio's spread."""
    lines = ["", "Decisions: the K `specdraft predict` chooses at B (its K table, decoded as fixed K; 0 = AR) against the "
             "measured best of AR and the fixed Ks, in the same pass.", "",
             "| B | chosen K per pass | measured best K per pass | chosen / best, median (min..max) |",
             "| ---: | --- | --- | ---: |"]
    for b, per_pass in decisions.items():
        ratios = [r for _, _, r in per_pass]
        lines.append(f"| {b} | {', '.join(str(k) for k, _, _ in per_pass)} | {', '.join(str(x) for _, x, _ in per_pass)} | "
                     f"{statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f}) |")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command line (the module docstring says what each mode measures)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", default="1,4,16")
    ap.add_argument("--ks", default="2,4")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompt-length", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--compile", default="none")
    ap.add_argument("--rounds", type=int, default=40, help="static batches simulated per (method, B)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bundle", default=None, help="a bundle's target, drafter and greedy head instead of the random pair")
    ap.add_argument("--drafter", default=None, help="with --bundle: the drafter (default: its all-domain one)")
    ap.add_argument("--prompt-set", default=None, help="with --bundle: a run's prompts/sets dir (its test prompts, "
                                                        "every domain in order); default: random ids")
    add_device_flags(ap, ("float32", "bfloat16"), "the random pair's dtype")
    add_section_flags(ap)
    ap.add_argument("--shape", default="demo", choices=sorted(RANDOM_SHAPES),
                    help="the random pair's shape without --bundle (harness.models.RANDOM_SHAPES)")
    ap.add_argument("--profile-each-batch", action="store_true",
                    help="profile each batch size's cost table right before its decodes, not one table first: on a "
                         "shared machine whose load drifts over a long (compiled) run, the table then prices the "
                         "load its decodes meet")
    paired = "eager: each pass profiles its own table and decodes every method once right after (module docstring)"
    ap.add_argument("--paired", action="store_true", help=paired + "; the error is the median of per-pass errors")
    ap.add_argument("--decisions", action="store_true",
                    help="also decode the K predict chooses at each B (its K table) and report it as a fraction of the "
                         "measured best fixed K, pass by pass (use --ks 1,2,4,8)")
    return ap


@dataclasses.dataclass
class Setup:
    """What every batch size's profiles, predictions and decodes share."""
    args: argparse.Namespace
    target: object
    drafter: object
    head: object  # the bundle drafter's greedy head; None on the random pair
    prior: object  # the head's prior; None on the random pair
    prompts: list[list[int]]  # the first max(B) prompts: every B decodes exactly these
    eos: int | None
    ks: list[int]
    k_max: int  # the widest round every table prices (its max_drafts)
    context: int  # the prompts' median length, where the tables are timed
    slots: int  # the cache length the decodes allocate
    summary: object  # the acceptance of exactly the prompts decoded
    compiler: StepCompiler


def load_pair(ap: argparse.ArgumentParser, args) -> tuple:
    """(target, drafter, head, prior, prompts, what, eos): a bundle's, or the random demo-shaped pair's."""
    eos = None  # the random pair has no EOS: every row decodes n tokens
    if args.bundle:
        target, drafter, head, prior, prompts, pair = bundle_pair(args)
        eos = target.generation_config.eos_token_id  # decoded as served: a row ends at EOS
    else:
        dtype = DTYPES[args.dtype]
        target, drafter = demo_shaped_pair(None, 0.05, args.device, dtype, args.shape)
        vocab = target.config.vocab_size
        gen = torch.Generator().manual_seed(args.seed)
        prompts = [torch.randint(3, vocab, (args.prompt_length,), generator=gen).tolist() for _ in range(max(args.sizes))]
        head, prior, pair = None, None, f"random {args.shape}-shaped pair, {args.dtype}"
    if len(prompts) < max(args.sizes):
        ap.error(f"{len(prompts)} prompts, fewer than the largest batch size {max(args.sizes)}")
    return target, drafter, head, prior, prompts, pair, eos


def prepare(args, ks: list[int], target, drafter, head, prior, prompts, eos) -> tuple[Setup, list]:
    """Measure the decoded prompts' greedy agreement and size the tables: -> (the shared setup, the agreement)."""
    n, everything = args.max_new_tokens, prompts[:max(args.sizes)]
    agree, sigma = greedy_agreement(target, drafter, everything, n, head, eos)
    # timed over the prompts' median length: a call's start is mostly its prefill, which grows with the prompt
    context = int(statistics.median(len(p) for p in everything))
    k_max = max(8, max(ks))  # the widest round every table prices (its max_drafts)
    # over the cache the decodes allocate: the longest batch's longest prompt, n new tokens and the widest round
    slots = cache_length_for(max(len(p) for p in everything), n, k_max, args.compile)
    # the acceptance of exactly the prompts decoded; static batches of n new tokens, as generate_batch decodes
    # them (rounds = batches simulated); without a head, sigma = the measured agreement itself (odds 1)
    summary = summarize_acceptance(agree, sigma, k_max=k_max)
    # one compiler for every decode: a mode string gives each call a compiler, and each its compilation again
    return Setup(args, target, drafter, head, prior, everything, eos, ks, k_max, context, slots, summary,
                 StepCompiler(args.compile)), agree


def profile(s: Setup, batch_sizes):
    """A cost table at `batch_sizes`, priced with the head's forward and the rules' decisions when there is a head."""
    # re-timed in every run (refresh): a table cached by an earlier run carries that run's load
    table = cached_cost_table(s.target, s.drafter, batch_sizes, s.k_max + 1, s.args.compile, seed=s.args.seed,
                              calibrate=True, context=s.context, refresh=True, cache_length=s.slots)[0]
    if s.head is not None:  # the head's forward and the rules' decisions, which a head policy's rounds pay
        table = price_head_rules(table, s.head, s.drafter.config.hidden_size, s.prior, table.max_drafts)
    return table


def predicted_at(s: Setup, table, groups, b, seed: int | None = None) -> dict:
    """{method: its prediction} at batch size b, priced by `table`, for the batches `groups` (simulated from
    `seed`, default --seed)."""
    # a call's prefill runs at its batch's longest prompt (right-padded; compiled, rounded up to a power of two)
    width = statistics.mean(table.prefill_positions(max(len(p) for p in g)) for g in groups)
    pred = predict_throughput(s.summary, table, [b], s.prior or summary_prior(s.summary, 1.0),
                              k_max=table.max_drafts, rounds=s.args.rounds, seed=s.args.seed if seed is None else seed,
                              new_tokens=s.args.max_new_tokens, prompt_lengths={b: width})
    out = {r["method"]: r for r in pred["predictions"]}
    out["K table"] = {**out["K table"], "k": pred["k_per_batch_size"][b]}  # the K predict recommends at b
    out["SpecDec++"] = out[f"SpecDec++ h={s.summary.threshold:g}"]  # decoded with the head at that h
    return out


def methods(s: Setup, table, b: int | None = None) -> dict:
    """{name: fn(batch of prompts, seed) -> its results}; with --decisions and b, also "K table": fixed K at the K
    predict chooses at b from `table` (AR when it chooses 0), as predict_throughput chooses it."""
    def one_batch(**kw):
        return lambda g, seed: generate_batch(s.target, g, s.args.max_new_tokens, compile=s.compiler,
                                              eos_token_id=s.eos, **kw)
    fns = {"AR": one_batch()}
    for k in s.ks:
        fns[f"K={k}"] = one_batch(drafter=s.drafter, policy=FixedK(k))
    if s.args.decisions and b is not None:
        k_max = table.max_drafts
        k = k_per_batch_size(table, acceptance_curve(s.summary, k_max), [b], k_max)[b]
        fns["K table"] = one_batch(drafter=s.drafter, policy=FixedK(k)) if k else one_batch()
    if s.head is not None:  # the paper's rule, each row stopping alone, at the h and K_max the prediction prices
        fns["SpecDec++"] = one_batch(drafter=s.drafter, policy=SpecDecPP(s.head, s.summary.threshold, table.max_drafts))
    if s.head is not None:  # the rule `specdraft generate --stop-rule batch-aware` serves with
        fns["batch-aware lockstep"] = one_batch(drafter=s.drafter, policy=LockstepBatchAwareSpecDec(
            s.head, table, s.prior, table.max_drafts))
    return fns


def header_lines(s: Setup, argv, agree: list, table, pair: str) -> list[str]:
    """The section's title, what was decoded and how, the cost table (when one prices every B) and the header."""
    args, sizes = s.args, s.args.sizes
    device = table.device if table is not None else device_name(input_device(s.target))
    return [f"## Predicted vs measured throughput ({datetime.date.today()}, {device}, torch {torch.__version__})", "",
            f"`python benchmarks/predict/bench_predict.py {' '.join(argv if argv is not None else sys.argv[1:])}`; "
            f"{pair}; mean greedy agreement {float(torch.cat(agree).mean()):.3f}; {args.runs} interleaved runs, "
            f"{args.max_new_tokens} new tokens, the first {max(sizes)} prompts (median length {s.context} tokens) in "
            f"batches of B at every B, compile {args.compile}, {args.threads} thread(s); "
            + ("each pass profiles its own table at B and decodes every method once right after it (--paired; "
               "the last pass's table per B below)." if args.paired else
               "each batch size's cost table profiled right before its decodes (below)." if args.profile_each_batch
               else "cost table profiled in this run."), "",
            *(() if args.profile_each_batch or args.paired else ("```", table.render(), "```")), "",
            *(PAIRED_HEADER if args.paired else FASTEST_HEADER)]


def paired_batch_size(s: Setup, b: int, groups, worst: dict, decisions: dict) -> tuple[list[str], str]:
    """--paired at batch size b (`paired_rows`): -> (rows, the last pass's table rendered)."""
    def decodes(table, groups):
        return {name: (lambda fn=fn: [r for g in groups for r in fn(g, 0)]) for name, fn in methods(s, table, b).items()}
    rows, last = paired_rows(b, groups, lambda: profile(s, sorted({1, b})), functools.partial(predicted_at, s),
                             decodes, s.args.runs, worst, s.args.device, decisions)
    return rows, last.render()


def unpaired_batch_size(s: Setup, b: int, groups, table, worst: dict, worst_fastest: dict, rendered: list,
                        decisions: dict) -> tuple[list[str], object]:
    """One table's prediction at batch size b against the decodes (`unpaired_rows`): -> (rows, the table,
    profiled anew here with --profile-each-batch past the first B and added to `rendered`). With --decisions,
    decisions[b] takes each pass's (the K predict chose from this one table, the pass's best fixed K, the ratio)."""
    args = s.args
    if args.profile_each_batch:  # minutes, not tens of minutes, between a table and the decodes it prices
        # eager decodes drop finished rows (down to one), which the simulation prices at B = 1 too
        table = table if b == args.sizes[0] else profile(s, [b] if args.compile != "none" else sorted({1, b}))
        rendered.append(table.render())
    predicted = predicted_at(s, table, groups, b)
    times, outs = interleave(methods(s, table, b), groups, args.runs, args.device)  # batch by batch
    if "K table" in times:  # greedy: every pass decodes the same tokens, so a pass's rate is tokens / its time
        rates = {name: [sum(r.metrics.n_generated for res in outs[name][0] for r in res) / sum(per_pass)
                        for per_pass in passes] for name, passes in times.items()}
        decisions[b] = decision_quality(rates, [predicted["K table"]["k"]] * args.runs)
    return unpaired_rows(b, predicted, times, outs, worst, worst_fastest), table


def closing_lines(worst: dict, worst_fastest: dict, rendered: list[str]) -> list[str]:
    """The worst errors per method, and the tables profiled along the way."""
    lines = ["", "Worst |error| per method: " + ", ".join(f"{m} {e:.1%}" for m, e in worst.items()) + "."]
    if worst_fastest:
        lines += ["", "Worst |error| against the fastest passes: "
                  + ", ".join(f"{m} {e:.1%}" for m, e in worst_fastest.items()) + "."]
    if rendered:
        lines += ["", "```", *rendered, "```"]
    return lines


def main(argv=None, owner: pathlib.Path | None = None) -> int:
    """Run the benchmark; its section is the one of the script `owner` (default: this one), for a wrapper that runs
    it on another pair (bench_predict_real.py)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    fail_past_recompile_limit()  # a shape run eagerly past dynamo's limit would be timed as compiled
    if args.paired and (args.compile != "none" or args.profile_each_batch):
        ap.error("--paired profiles a table every pass: eager only (--compile none), and it replaces --profile-each-batch")
    torch.set_num_threads(args.threads)
    sizes = args.sizes = [int(x) for x in args.batch_sizes.split(",")]
    ks = [int(x) for x in args.ks.split(",")]
    target, drafter, head, prior, prompts, pair, eos = load_pair(ap, args)
    s, agree = prepare(args, ks, target, drafter, head, prior, prompts, eos)
    # --paired profiles its own table every pass: none before them
    table = None if args.paired else profile(s, sorted({1, sizes[0]}) if args.profile_each_batch else sizes)
    lines = header_lines(s, argv, agree, table, pair)
    worst: dict[str, float] = {}
    worst_fastest: dict[str, float] = {}
    rendered = []
    decisions: dict[int, list] = {}
    for b in sizes:
        groups = [s.prompts[i:i + b] for i in range(0, len(s.prompts), b)]
        if args.paired:
            rows, last = paired_batch_size(s, b, groups, worst, decisions)
            rendered.append(last)
        else:
            rows, table = unpaired_batch_size(s, b, groups, table, worst, worst_fastest, rendered, decisions)
        lines += rows
        print("\n".join(rows), flush=True)  # a long run shows each batch size as it ends
    lines += closing_lines(worst, worst_fastest, rendered) + (decision_lines(decisions) if decisions else [])
    publish_for("\n".join(lines), not args.no_append, owner or pathlib.Path(__file__), args.section, args.page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
