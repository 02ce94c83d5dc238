"""The ceiling of adaptive draft length at batch 1: how much faster than the best fixed K a stop rule could run
if it knew, before drafting, how many drafts the target will accept; priced with the decoder's own cost table.

    python benchmarks/adaptive/bench_length_ceiling.py --target DIR --drafter DIR --prompt-set DIR [--domain math]
        [--eos] [--ks 1,2,4,8] [--k-max 16] [--compile default] [--temperatures 0,0.7] [--seeds 5] [--no-append]

Issue 44 asks SpecDec++ for 1.05x the best fixed K at batch 1. No rule can beat a rule that knows the future, so
before tuning a rule against that goal this script asks whether the pair and the decoder leave 5% to win.

Every method's rounds are real: the decoder (`decoding.batched.generate_batch`, eager, batch 1) decodes each
prompt at each fixed K and at K_max, and each round's drafted and accepted counts are kept (exact counts; they
do not depend on the compile mode or the clock). A round that drafted k is priced at `CostTable.round_cost(1, k)`
(a catch-up, k - 1 drafter feeds, one verify at the compiled decoder's padded width, the loop's calibrated work)
and a call's start at `t_start`; predicted tokens/s = tokens / priced seconds. No rule's own work is priced (the
head, the decisions): the oracles decide for free, so their rates bound every real rule's from above.

    fixed K             the decoder's own rounds at K
    first rejection     SpecDec++'s oracle (its Theorem 4.1): a round drafts exactly the drafts the target accepts
                        (at most K_max), read from the K_max decode's rounds. Greedy, those rounds are exactly
                        the oracle's; sampled, it keeps K_max's accepted counts (its bonus token would come from p
                        instead of the residual: the same count, another token)
    optimal (greedy)    the cheapest schedule of draft lengths 0..K_max for the whole greedy output, by dynamic
                        programming over positions: from position i a round of k drafts accepts min(k, n_i) and
                        emits min(k, n_i) + 1 tokens, where n_i is how many of the drafter's greedy drafts from i
                        on match the target's greedy tokens (one teacher-forced drafter forward over the output:
                        while its drafts match, the drafter's context is the target's). It can also stop before
                        a rejection where a narrower verify pays (a compiled round of 9 drafts verifies 17)

The fixed-K replays of n_i are checked against the decoder's round counts (exact; a mismatch is printed).

The table is a model: it prices a round from steps timed alone. So the script also times the decoder itself
(greedy, batch 1, the table's compile mode, AR and the fixed Ks of every padded width, interleaved, --runs
passes) and prices the oracles again at those measured round costs ("measured costs": a round of k drafts costs
a whole fixed-K round of its padded width, so no less than a rule drafting k would pay for its drafts). The
measured fixed-K tokens/s stand beside the predicted: where the two ratios to the best fixed K differ, the table
misprices those rounds, and a rule deciding on it with them.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: benchmarks.harness

from specdraft.decoding.batched import generate_batch  # noqa: E402
from specdraft.decoding.compilation import StepCompiler, fail_past_recompile_limit  # noqa: E402
from specdraft.decoding.costs.profile import cache_length_for, profile_cost_table  # noqa: E402
from specdraft.decoding.costs.model import CostTable
from specdraft.decoding.rounds.shapes import verify_width  # noqa: E402
from specdraft.decoding.policies.stopping import FixedK  # noqa: E402
from specdraft.decoding.rounds.sampling import SamplingConfig  # noqa: E402
from benchmarks.harness.timing import warm_then_interleave  # noqa: E402
from benchmarks.harness.machine import machine  # noqa: E402
from benchmarks.harness.models import add_pair_flags, load, load_prompts  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402


def decode_rounds(target, drafter, prompt, n, k, sampling, seed, eos):
    """(tokens generated, [(drafted, accepted) per round]) of one batch-1 decode at fixed K = k (0: AR)."""
    r = generate_batch(target, [prompt], n, drafter=drafter if k else None, policy=FixedK(k) if k else None,
                       sampling=sampling, seed=seed, eos_token_id=eos)[0]
    m = r.metrics
    rounds = list(zip(m.drafted, m.accepted)) if k else [(0, 0)] * m.n_target
    return m.n_generated, rounds, r.tokens


@torch.inference_mode()
def matches_ahead(drafter, prompt: list[int], output: list[int]) -> list[int]:
    """n_i for i = 0..len(output) - 1: how many of the drafter's greedy drafts from output position i on equal
    the target's greedy tokens output[i], output[i + 1], ...: runs of teacher-forced argmax agreement."""
    ids = torch.tensor([prompt + output], device=drafter.get_input_embeddings().weight.device)
    logits = drafter(input_ids=ids).logits[0]
    # the logits at position p predict token p + 1: output[i] is predicted at len(prompt) - 1 + i
    picks = logits[len(prompt) - 1:len(prompt) - 1 + len(output)].argmax(-1).tolist()
    agree = [int(a == b) for a, b in zip(picks, output)]
    runs, run = [0] * len(output), 0
    for i in range(len(output) - 1, -1, -1):
        run = run + 1 if agree[i] else 0
        runs[i] = run
    return runs


def replay(n_ahead: list[int], k: int, limit: int) -> list[tuple[int, int]]:
    """The rounds a greedy decode at fixed K = k runs over an output of len(n_ahead) tokens (at most `limit`, the
    new-token limit; fewer where it ended at EOS): (drafted, accepted)."""
    rounds, i, total = [], 0, len(n_ahead)
    while i < total:
        drafted = min(k, limit - i - 1)  # the decoder leaves room for the token every round emits
        accepted = min(drafted, n_ahead[i])
        rounds.append((drafted, accepted))
        i += accepted + 1
    return rounds


def optimal_cost(n_ahead: list[int], costs: list[float], limit: int) -> tuple[float, int]:
    """(seconds, rounds) of the cheapest schedule of draft lengths over the output (module docstring); `limit`
    as in `replay`."""
    total = len(n_ahead)
    best: list[tuple[float, int]] = [(0.0, 0)] * (total + 1)
    for i in range(total - 1, -1, -1):
        options = []
        for k in range(min(len(costs) - 1, limit - i - 1) + 1):
            nxt = min(total, i + min(k, n_ahead[i]) + 1)
            options.append((costs[k] + best[nxt][0], best[nxt][1] + 1))
        best[i] = min(options)
    return best[0]


def collect(args, target, drafter, prompts, temperature: float) -> tuple[list[dict], list[str]]:
    """Per prompt and seed: {"starts": prefill positions, k: (tokens, rounds) for AR (k = 0), each fixed K and
    K_max, "optimal": the greedy output's n_i}; and notes of any replay that differs from the decoder's rounds."""
    sampling = SamplingConfig(temperature)
    records, notes = [], []
    for p_i, prompt in enumerate(prompts):
        for seed in range(1 if sampling.greedy else args.seeds):  # a greedy decode does not depend on the seed
            decoded = {k: decode_rounds(target, drafter, prompt, args.max_new_tokens, k, sampling, seed, args.eos)
                       for k in sorted({0, *args.ks, args.k_max})}
            record = {k: (tokens, rounds) for k, (tokens, rounds, _) in decoded.items()}
            record["positions"] = len(prompt)
            if sampling.greedy:
                n_ahead = matches_ahead(drafter, prompt, decoded[args.k_max][2])
                for k, (_, rounds_k, _) in decoded.items():
                    if [a for _, a in replay(n_ahead, k, args.max_new_tokens)] != [a for _, a in rounds_k]:
                        notes.append(f"prompt {p_i}: the replay of K = {k} differs from the decoder's rounds")
                record["optimal"] = n_ahead
            records.append(record)
    return records, notes


def price(args, records: list[dict], costs: list[float], table: CostTable, whole_rounds: bool = False) -> list[tuple]:
    """[(method, tokens, rounds, seconds)] summed over the records, each round priced at costs[drafts] and each
    call's start at the table's (module docstring). whole_rounds: a fixed-K round costs costs[K] whatever it
    drafted (measured costs are each fixed K's mean round, its rounds cut short by the length limit included)."""
    sums: dict[str, list[float]] = {}

    def add(method, tokens, rounds, seconds):
        s = sums.setdefault(method, [0, 0, 0.0])
        s[0], s[1], s[2] = s[0] + tokens, s[1] + rounds, s[2] + seconds

    for record in records:
        start = {k: table.t_start(1, k > 0, table.prefill_positions(record["positions"])) for k in (0, 1)}
        for k in sorted({0, *args.ks, args.k_max}):
            tokens, rounds = record[k]
            add("AR" if k == 0 else f"K={k}", tokens, len(rounds),
                start[k > 0] + sum(costs[k if whole_rounds else d] for d, _ in rounds))
        tokens, rounds = record[args.k_max]
        add("first rejection", tokens, len(rounds), start[1] + sum(costs[a] for _, a in rounds))
        if "optimal" in record:
            seconds, n_rounds = optimal_cost(record["optimal"], costs, args.max_new_tokens)
            add("optimal", tokens, n_rounds, start[1] + seconds)
    return [(m, *s) for m, s in sums.items()]


def measured_costs(args, target, drafter, prompts, table: CostTable) -> tuple[list[float], dict[str, tuple]]:
    """Round costs from the decoder itself: greedy batch-1 decodes of the prompts in the table's compile mode at AR
    and at every fixed K a round of k = 1..K_max drafts runs as (its padded width) and in --ks, interleaved over
    --runs passes after a warm-up (the compilation). A fixed-K round costs (median pass - the table's starts) / its
    rounds, and a round of k drafts is priced as the fixed K of its padded width's: a whole draft graph, so no
    cheaper than a rule drafting k would pay for its drafting. Returns (costs for k = 0..K_max, {method: measured
    (tokens/s median, min, max)})."""
    compiler = StepCompiler(args.compile)
    widths = sorted({0, *args.ks, *(verify_width(k, args.k_max) for k in range(1, args.k_max + 1))})
    fns = {k: (lambda k=k: [generate_batch(target, [p], args.max_new_tokens, drafter=drafter if k else None,
                                           policy=FixedK(k) if k else None, compile=compiler,
                                           eos_token_id=args.eos)[0] for p in prompts]) for k in widths}
    times, out = warm_then_interleave(fns, args.runs, "cpu")  # greedy: every pass decodes the same tokens
    per_round, rates = {}, {}
    for k in widths:
        starts = sum(table.t_start(1, k > 0, table.prefill_positions(len(p))) for p in prompts)
        rounds = sum(r.metrics.n_target for r in out[k][-1])
        tokens = sum(r.metrics.n_generated for r in out[k][-1])
        per_round[k] = (statistics.median(times[k]) - starts) / rounds
        rates["AR" if k == 0 else f"K={k}"] = (tokens / statistics.median(times[k]), tokens / max(times[k]),
                                                tokens / min(times[k]))
    return [per_round[verify_width(k, args.k_max) if k else 0] for k in range(args.k_max + 1)], rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_pair_flags(parser, required=True)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--eos", action="store_true", help="rows stop at the target's EOS, as served")
    parser.add_argument("--ks", default="1,2,4,8", help="the fixed Ks the best is chosen from")
    parser.add_argument("--k-max", type=int, default=16, help="the oracles' longest round")
    parser.add_argument("--compile", default="default", choices=["none", "default", "reduce-overhead"],
                        help="the compile mode whose costs price the rounds")
    parser.add_argument("--table", help="a saved cost table (CostTable.save) instead of profiling one here")
    parser.add_argument("--save-table", help="save the table profiled here (for a later --table)")
    parser.add_argument("--temperatures", default="0,0.7", help="comma list; 0 is greedy")
    parser.add_argument("--seeds", type=int, default=5, help="sampled decodes per prompt (seeds 0..)")
    parser.add_argument("--runs", type=int, default=7,
                        help="interleaved passes of the measured greedy decodes (0: price with the table only)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-append", action="store_true")
    args = parser.parse_args(argv)
    if not args.prompt_set:
        parser.error("give --prompt-set: the ceiling is measured on a run's test prompts")
    fail_past_recompile_limit()  # a shape run eagerly past dynamo's limit would be timed as compiled
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    args.ks = sorted({int(k) for k in args.ks.split(",")})
    if not args.ks or args.ks[0] < 1 or args.ks[-1] > args.k_max:
        parser.error(f"--ks must be fixed Ks in 1..K_max = {args.k_max}, got {args.ks}")
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    if args.seeds < 1 or any(t < 0 for t in args.temperatures):
        parser.error(f"--seeds must be >= 1 and --temperatures >= 0, got {args.seeds} and {args.temperatures}")
    torch.set_num_threads(args.threads)
    started = time.time()
    target, drafter = load(args.target, "cpu", torch.float32), load(args.drafter, "cpu", torch.float32)
    eos = getattr(target.generation_config, "eos_token_id", None) if args.eos else None
    if args.eos and not isinstance(eos, int):
        parser.error(f"--eos needs a target with one EOS token id in its generation config, got {eos!r}")
    args.eos = eos
    prompts = load_prompts(args, target.config.vocab_size)
    if args.table:
        table = CostTable.load(args.table)
        if table.max_drafts < args.k_max or table.compile != args.compile:
            parser.error(f"--table prices {table.max_drafts} drafts in compile mode {table.compile}; this run needs "
                         f"{args.k_max} in {args.compile}: profile it with max_width = K_max + 1 in that mode")
    else:
        slots = cache_length_for(max(len(p) for p in prompts), args.max_new_tokens, args.k_max, args.compile)
        table = profile_cost_table(target, drafter, [1], args.k_max + 1, args.compile, calibrate=True,
                                   cache_length=slots, context=int(statistics.median(len(p) for p in prompts)))
        if args.save_table:
            table.save(args.save_table)
    lines = [
        f"## Adaptive length's ceiling at batch 1 ({datetime.date.today()}, {machine()}, "
        f"costs of compile {args.compile})", "",
        f"`python benchmarks/adaptive/bench_length_ceiling.py {argv_text}`: {len(prompts)} {args.domain} prompts x "
        f"{args.max_new_tokens} tokens{' (up to EOS)' if args.eos is not None else ''}, K_max = {args.k_max}; every "
        "round a real decode's, priced with the cost table below; no rule's own work priced.", ""]
    measured, rates = measured_costs(args, target, drafter, prompts, table) if args.runs else (None, {})
    for temperature in args.temperatures:
        records, notes = collect(args, target, drafter, prompts, temperature)
        rows = price(args, records, table.round_costs(1, args.k_max), table)
        at_measured = price(args, records, measured, table, whole_rounds=True) if measured else None
        lines += render(args, temperature, rows, at_measured, notes, rates if temperature == 0 else {})
    lines += ["```", table.render(), "```", "",
              f"Run time {time.time() - started:.0f} s; load average at the end {os.getloadavg()[0]:.1f}.", ""]
    publish("\n".join(lines), write=not args.no_append)
    return 0


def render(args, temperature: float, rows, at_measured, notes, rates: dict) -> list[str]:
    """One table per temperature: every method priced with the table and at the measured round costs, and where
    measured (greedy) the decoder's own tokens/s beside them; each against the best fixed K priced the same way."""
    def ratios(priced):
        rate = {m: tokens / s for m, tokens, _, s in priced}
        best = max(rate[f"K={k}"] for k in args.ks)
        return {m: (r, r / best) for m, r in rate.items()}

    table, measured = ratios(rows), ratios(at_measured) if at_measured else {}
    best_run = max(rates[f"K={k}"][0] for k in args.ks) if rates else None
    mode = "greedy" if temperature == 0 else f"T = {temperature:g}, {args.seeds} seed(s) per prompt"
    lines = [f"### {mode}", "", "| method | tokens | rounds | MAT | table: tok/s | / best fixed K | measured costs: "
             "tok/s | / best fixed K | decoder: tok/s | / best fixed K |", "| --- |" + " ---: |" * 9]
    for m, tokens, rounds, _ in rows:
        cells = [f"{table[m][0]:.0f}", f"{table[m][1]:.3f}"]
        cells += [f"{measured[m][0]:.0f}", f"{measured[m][1]:.3f}"] if measured else ["", ""]
        v = rates.get(m)
        cells += [f"{v[0]:.0f} ({v[1]:.0f}-{v[2]:.0f})", f"{v[0] / best_run:.3f}"] if v else ["", ""]
        lines.append(f"| {m} | {tokens} | {rounds} | {tokens / rounds:.2f} | " + " | ".join(cells) + " |")
    check = ("Every fixed-K replay of the teacher-forced matches equals the decoder's rounds." if temperature == 0
             else "Sampled: no replay (it checks greedy rounds).")
    return lines + ["", f"{' '.join(notes) or check}", ""]


if __name__ == "__main__":
    sys.exit(main())
