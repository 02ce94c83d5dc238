"""Profiling the decoder's own costs into a `CostTable` (decoding/costs/model.py): the one module
that runs models to price rounds.

    table = profile_cost_table(target, drafter, batch_sizes=(1, 2, 4, 8), max_width=9, compile="none")

What is timed is exactly what a round of `decoding.batched.generate_batch` calls: the compiled (or eager)
step of `forward_step` over a `StepCompiler.cache` static cache, at batch B,
    verify    the target's step over w positions per row, w = 1 (a plain autoregressive step) .. max_width
    drafting  the drafter's steps as a round runs them, one after another right after a target step: the
              catch-up over 2 positions (the end-of-round re-feed that yields the round's q_1), then n
              width-1 steps (y_i fed to get q_{i+1}), timed as one call for n = 1 and n = D = max_width - 2;
              the table's draft = (T(D) - T(1)) / (D - 1), a step in the middle of a chain, and catchup =
              T(1) - draft, so that a round of k >= 2 drafts is priced at its own chain, T(k - 1); under a
              compile mode the n steps are one draft graph of n + 1 positions, as the decoder drafts
              (`_draft_graph`: a step fused in it costs half of one called alone on the demo pair)
each over a cache already holding `context` tokens, rolled back before every call (so every call sees the
same context). Drafter steps are timed in chains because that is what they cost in a round: timed alone,
each after some other shape, a width-1 drafter step on the demo pair cost 1.0 / 1.5 ms at B = 1 / 16, in a
chain 0.55 / 0.9 ms (the caches and the allocator stay warm); priced alone, a K = 8 round at B = 16 came
out ~8% dearer than in decodes, and the batch-aware rules drafted too little. For the same reason every
call is timed right after an untimed run of itself (a decode's step follows the same step, the last
token's or the last round's, and a round's drafting follows its verify): timed right after other batch
sizes' calls, a step pays for their data in the CPU's caches (compiled, B = 1's one-token step cost 2.8 ms
after itself, 3.2 ms after B = 32's 9-wide one, 3.5 ms after every other shape), more than the loop's own
work per round, which the calibration then priced at 0. One untimed warm-up pass over every (batch size,
shape) (which is also each shape's compilation), then `repeats` passes, each over every batch size and
shape in turn; the table keeps the fastest of each (`fastest`), then puts the steps in order: no wider or
bigger-batch step priced below a narrower or smaller one (`monotone_grid`, `isotonic`). On a shared machine a
call's time is its own cost plus what its neighbours took from it, which only adds: a slow phase spanning some
of the passes leaves the fastest pass alone (with medians, a slow phase in one bench_batch_decoder run's 8-second
profile priced B = 16's 9-wide verify at 41 ms where a quieter profile found 29, and the rule drafted less at B = 8
and 16), and a phase spanning all of them slows every entry
alike, which the rules' decisions (costs against costs, lam from the same table) do not see. The price: a
table of fastest passes predicts a decode timed by its median a few % fast. Under a compile mode only the widths
the compiled decoder runs are timed (1 and 2^j + 1, `rounds.shapes.verify_width`): a width is a graph.
With `calibrate` (off by default: it decodes, minutes where the steps take seconds; `specdraft predict`
turns it on) the prefill steps are timed too, target's and drafter's, at every power of two from 16 positions
to the cache's slots (the widths a compiled call pads its prompts to; an eager call's are interpolated), for a
call's start at its own width, and the loop's own work beyond these steps, per round, per drafting round and per draft step, is priced from short
decodes of `generate_batch` itself (`calibrate_loop`): on a small model the round's verification, commit
and host transfer are a measurable share of its time (bench_predict.py: without them predictions ran up
to 45% above measured tokens/s on the demo-shaped pair). On the demo-shaped pair (eager, 1 thread, B = 1,
2, 4, ..., 64, widths 1..9, 5 repeats) the steps took 23 s, with the calibration 168 s (a loaded box).

With a head each stopping rule's own work is priced too (decoding/costs/rules.py: the head's forward and
the rule's decisions per draft step, timed apart from decodes in a fraction of a second).

A table is cached on disk per (device, torch version, compile mode, models, batch sizes, widths,
context, head shape): a second decoder start on the same machine reads it in milliseconds instead of
re-timing (`cached_cost_table`), and processes started together profile one at a time, each reading what
the others wrote. The directory: `cache_dir`, else $SPECDRAFT_COST_CACHE, else
~/.cache/specdraft/cost_tables.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Callable, Sequence

import torch

from specdraft.core.devices import device_name
from specdraft.core.errors import InputError
from specdraft.decoding.batch_draft import compiled_segment
from specdraft.decoding.batched import GREEDY, forward_step
from specdraft.decoding.defaults import COMPILE_MODES
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.costs.model import CostTable, nnls2
from specdraft.decoding.costs.rules import price_head_rules
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.rounds.shapes import (CACHE_ROUND, decode_cache_length, static_length,
                                              verify_width)
from specdraft.decoding.rounds.static_cache import forward_rows, model_floor
from specdraft.decoding.rounds.int8_linear import is_quantized
from specdraft.decoding.timing import timed_call


def model_identity(model: torch.nn.Module) -> str:
    """A model's identity for its costs: the sha256 of its config (architecture, sizes), dtype, and int8 weights
    where it has them (`rounds.int8_linear`: a one-row step of other cost). The weights' values do not change a
    step's time, so a retrained drafter of the same shape shares a table."""
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(vars(model.config))
    for volatile in ("_name_or_path", "transformers_version", "_commit_hash"):
        config.pop(volatile, None)
    dtype = str(model.get_input_embeddings().weight.dtype)
    ident = {"config": config, "dtype": dtype, "class": type(model).__name__}
    if is_quantized(model):  # only then: every identity recorded before int8 weights existed stays as it was
        ident["weights"] = "int8"
    blob = json.dumps(ident, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def profiled_widths(max_width: int, compile: str) -> tuple[int, ...]:
    """The verify widths a table measures: every w in 1..max_width eagerly; under compile the widths the
    compiled decoder runs, 1 and verify_width(k) + 1 for k = 1..max_width - 1."""
    if compile == "none":
        return tuple(range(1, max_width + 1))
    return tuple(sorted({1} | {verify_width(k, max_width - 1) + 1 for k in range(1, max_width)}))


def fastest(samples: Sequence[float]) -> float:
    """What a table keeps of a step's timed samples: the fastest (module docstring: on a shared machine the
    neighbours' load only adds to a call's time)."""
    return min(samples)


def isotonic(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest `values` in least squares (pool adjacent violators: a run of entries
    out of order is replaced by its mean)."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled run
    for v in values:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def monotone_grid(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    """rows[batch index][width index] made non-decreasing along every row (width), then along every column
    (batch size): a step over more positions, or more rows, does not cost less. Isotonic regression preserves
    order (x <= y elementwise gives isotonic(x) <= isotonic(y)), so the column pass keeps the rows in order.
    Why: the fastest of a few passes still carries a slow phase that caught every pass of one entry, and an
    entry out of order is a decision the rules get wrong, not just a price off by its noise: a 3-wide verify
    priced below a 1-wide one makes a round of 2 drafts look cheaper than a plain target step, so the
    batch-aware rules draft at any acceptance (tables in benchmarks/predict/RESULTS.md, bench_predict: B = 1's v(w=3)
    9.33 ms under its v(w=1) 10.13, B = 32's v(w=3) 43.15 over its v(w=4) 38.12)."""
    by_width = [isotonic(row) for row in rows]
    by_batch = [isotonic(column) for column in zip(*by_width)]
    return tuple(tuple(row) for row in zip(*by_batch))


def least_cache_length(context: int, max_width: int) -> int:
    """The slots a profile's cache gets by default: the smallest static length holding `context` and a round."""
    return static_length(context + max_width + 2)


def cache_length_for(longest_prompt: int, new_tokens: int, k_max: int, compile: str) -> int:
    """The static cache slots a decode of `new_tokens` after a batch whose longest prompt is `longest_prompt`
    allocates at K_max `k_max` in mode `compile` (`decoding.rounds.shapes.decode_cache_length`): what its steps
    attend over."""
    return decode_cache_length(longest_prompt, new_tokens, k_max, compile)


def _check(batch_sizes, max_width, compile, repeats, context) -> tuple[int, ...]:
    sizes = tuple(batch_sizes)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in sizes):
        raise InputError(f"batch sizes must be integers >= 1, got {list(sizes)}")
    if isinstance(max_width, bool) or not isinstance(max_width, int) or max_width < 2:
        raise InputError(f"max_width (K_max + 1 verify positions) must be an integer >= 2, got {max_width!r}")
    if compile not in COMPILE_MODES:
        raise InputError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {compile!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats must be an integer >= 1, got {repeats!r}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise InputError(f"context must be an integer >= 1, got {context!r}")
    return tuple(sorted(set(sizes)))


@torch.inference_mode()
def profile_cost_table(target: torch.nn.Module, drafter: torch.nn.Module, batch_sizes: Sequence[int],
                       max_width: int, compile: str = "none", *, repeats: int = 5, context: int = 64,
                       seed: int = 0, calibrate: bool = False, cache_length: int | None = None) -> CostTable:
    """Time the decoder's steps (module docstring) and return the fastest of each as a CostTable. max_width:
    the widest verify, K_max + 1. seed: the random token ids fed (their values do not change a step's
    time; seeded so a profile is reproducible in everything but the clock). calibrate: also time the prefill
    steps and price the loop's own work per round and per draft step and a call's setup (`calibrate_loop`). cache_length: the slots of the static
    cache the priced decodes allocate, about longest prompt + new tokens + K_max + 2 (`cache_length_for`;
    attention runs over all of them: CostTable); default the smallest that holds `context` and a round."""
    sizes = _check(batch_sizes, max_width, compile, repeats, context)
    least = context + max_width + 2
    if cache_length is None:
        cache_length = least
    elif isinstance(cache_length, bool) or not isinstance(cache_length, int) or cache_length < least:
        raise InputError(f"cache_length must be an integer >= context + max_width + 2 = {least} (the cache holds the "
                         f"context and a round), got {cache_length!r}")
    widths = profiled_widths(max_width, compile)
    device = target.get_input_embeddings().weight.device
    vocab = min(target.config.vocab_size, drafter.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    max_len = static_length(cache_length)  # rounded up as the decoder sizes its caches
    compiler = StepCompiler(compile)
    target_step, drafter_step = forward_step(compiler, target), forward_step(compiler, drafter)
    calls, at, tcaches, widest = {}, {}, {}, {}
    prefill_widths = tuple(w for w in (16 << i for i in range(max_len.bit_length())) if w <= max_len) if calibrate else ()
    chain_long = max(2, max_width - 2)  # the longest round's width-1 drafter steps (K_max - 1), at least 2
    # compiled: a round's drafting is one draft graph (`_draft_graph`), looked up once here, not in the timed call
    graphs = {} if compiler.eager else {n: _draft_graph(compiler, drafter, n) for n in (1, chain_long)}
    for batch in sizes:  # every batch size's caches at once (about twice the largest one's memory)
        tcache, dcache = compiler.cache(target, batch, max_len), compiler.cache(drafter, batch, max_len)
        tcaches[batch] = tcache
        prompt = torch.randint(0, vocab, (batch, context), generator=gen).to(device)
        forward_rows(target, tcache, prompt)  # eager prefill: the compiled steps never see this width
        forward_rows(drafter, dcache, prompt)
        at[batch] = torch.full((batch,), context, dtype=torch.long, device=device)
        widest[batch] = torch.randint(0, vocab, (batch, widths[-1]), generator=gen).to(device)
        floor = model_floor(target, batch)
        ids = {w: torch.randint(0, vocab, (batch, w), generator=gen).to(device) for w in sorted(set(widths) | {2, floor})}
        # a w-wide verify runs at least `floor` positions in the decoder (`verify_floor`): priced as it runs
        calls.update({(batch, "verify", w): (lambda t=tcache, x=ids[max(w, floor)]: target_step(t, x)) for w in widths})

        def chain(n, d=dcache, ids=ids, start=at[batch]):
            # a round's drafting: the catch-up, then n width-1 steps, each committed as the round commits it
            d.rollback(start)
            logits = drafter_step(d, ids[2])[0][:, -1]
            d.lengths.add_(2)
            if graphs:  # as the decoder drafts: one graph of n + 1 positions
                graphs[n](d, logits)
                return
            for _ in range(n):
                drafter_step(d, ids[1])
                d.lengths.add_(1)
        calls.update({(batch, "chain", n): (lambda n=n, chain=chain: chain(n)) for n in (1, chain_long)})
        if calibrate:  # a call's prefills, at the widths a compiled one pads to (`prefill_width`) that the cache holds
            for w in prefill_widths:
                ids_w = torch.randint(0, vocab, (batch, w), generator=gen).to(device)
                calls[(batch, "prefill", w)] = lambda t=tcache, x=ids_w: _prefill(target_step, t, x)
                calls[(batch, "prefill_draft", w)] = lambda d=dcache, x=ids_w: _prefill(drafter_step, d, x)
    times = _time_calls(calls, tcaches, at, widest, target_step, repeats, device)
    del calls, tcaches
    # each entry the fastest of its passes, then the whole table in order (`monotone_grid`)
    verify = monotone_grid([[fastest(times[(b, "verify", w)]) for w in widths] for b in sizes])
    one = isotonic([fastest(times[(b, "chain", 1)]) for b in sizes])
    long = isotonic([fastest(times[(b, "chain", chain_long)]) for b in sizes])
    # noise cannot make a step free: at least a microsecond (the validation wants every time > 0)
    draft = isotonic([max((tl - t1) / (chain_long - 1), 1e-6) for t1, tl in zip(one, long)])
    catchup = [max(t1 - d, 1e-6) for t1, d in zip(one, draft)]
    prefills = {part: monotone_grid([[fastest(times[(b, part, w)]) for w in prefill_widths] for b in sizes])
                for part in ("prefill", "prefill_draft")} if calibrate else {}
    table = CostTable(batch_sizes=sizes, widths=widths, verify=verify, draft=tuple(draft), catchup=tuple(catchup),
                      device=device_name(device), torch_version=torch.__version__, compile=compile,
                      dtype=str(target.get_input_embeddings().weight.dtype).removeprefix("torch."),
                      target_id=model_identity(target), drafter_id=model_identity(drafter), context=context,
                      cache_length=max_len, repeats=repeats, prefill_widths=prefill_widths, **prefills)
    # the decodes' fastest of as many passes as the steps': the loop terms are differences of decode times, and a
    # slow phase catching every pass of one decode lands in them whole. Capped at 3 passes (to save time), 6 of 24
    # (calibration, batch size) cells of eight eager calibrations at B = 1, 4, 8 priced over 1 ms of loop work a
    # round (one 7.0; 0.0-0.6 typical), and bench_predict missed by 10-26% at the B such a cell hit; the same
    # decodes' fastest of 7: 1 of 24 (1.07), fastest of 5: 0 of the 12 it was computed for
    return calibrate_loop(target, drafter, table, repeats=repeats, seed=seed) if calibrate else table


def _time_calls(calls: dict, tcaches: dict, at: dict, widest: dict, target_step: Callable, repeats: int,
                device) -> dict[tuple, list[float]]:
    """The profile's passes over its calls (`profile_cost_table`): per call, its timed samples after the warm-up."""
    times: dict[tuple, list[float]] = {key: [] for key in calls}
    # pass 0 is the warm-up (and each shape's compilation); each pass visits every batch size and shape, so a
    # batch size's samples are spread over the whole profile and a slow phase of the machine caught by some
    # passes moves no entry (timed one batch size after another, a phase caught one row: 50% dearer B = 1 steps)
    for rep in range(repeats + 1):
        for key, call in calls.items():
            batch = key[0]
            tcache = tcaches[batch]
            # what precedes the call in a decode, untimed: the same call, and before a round's drafting the last
            # round's verify (after other batch sizes' calls a step pays for cold CPU caches: module docstring)
            tcache.rollback(at[batch])
            call()
            tcache.rollback(at[batch])
            if key[1] == "chain":
                target_step(tcache, widest[batch])
            _, timing = timed_call(call, device)
            if rep:
                times[key].append(timing.time)
    return times


def _draft_graph(compiler: StepCompiler, drafter: torch.nn.Module, feeds: int) -> Callable:
    """A compiled round's drafting after its catch-up, as `decoding.batched.draft` runs it for fixed K = feeds + 1:
    one graph (`compiled_segment`) that picks K greedy drafts and feeds all but the last, every row drafting.
    Fused, a drafter step costs less than the same step called alone (demo pair, B = 1: 0.094 ms a feed inside
    the graph against 0.20 called alone), and pricing the called step overpriced long rounds (a K = 8 round at
    8.3 ms against 6.5 measured; the batch-aware rule stopped at 4 drafts and ran 0.87x fixed K = 8)."""
    width = feeds + 1
    graph = compiled_segment(compiler, drafter, build_policy(PolicySpec("fixed", k=width)), (0, width), width, GREEDY)

    def run(cache, logits):
        rows = logits.shape[0]
        zeros = torch.zeros(rows, dtype=torch.long, device=logits.device)
        carry = (torch.zeros(rows, width, dtype=torch.long, device=logits.device), None, zeros,
                 torch.ones(rows, dtype=torch.bool, device=logits.device), logits, None, ())
        return graph(cache, zeros + width, None, None, carry)
    return run


def _prefill(step, cache, ids) -> None:
    """A call's prefill: `step` over `ids` from an empty cache, the logits of one position per row read
    (`decoding.batched.prefill`)."""
    cache.rollback(torch.zeros_like(cache.lengths))
    step(cache, ids, False, cache.lengths + ids.shape[1] - 1)


LOOP_SHORT, LOOP_SPAN = 4, 32  # new tokens of the short decode, and the long one's more, whose difference prices the loop


def calibration_ks(max_drafts: int) -> tuple[int, ...]:
    """The fixed Ks whose decodes price the loop's work in drafting rounds: two lengths, so that what every
    drafting round pays (`loop_spec`) and what each draft step pays (`loop_draft`) come apart: (2, 8), or
    (1, 2) / (2, K_max) for a shorter K_max; (1,) at K_max = 1, where every round drafts one and the two are one
    price. With one K a round's fixed work could only be charged per draft, which prices long
    rounds against short ones by an assumption: the adaptive rules choose between exactly those. On the demo
    pair on this CPU the split found little fixed work (compiled: 0.34 ms a drafting round at B = 1, none at
    B = 4..16, 0.18-0.24 ms a draft; benchmarks/decoder/RESULTS.md, bench_batch_decoder); a decoder whose round has a
    host cost of its own (a GPU's launches) is where the two differ. It adds ~20% to a calibration (eager, demo
    pair, B = 1 and 3, widths to 21: 16 -> 19 s)."""
    hi = min(8, max_drafts)
    return (hi,) if hi == 1 else (min(2, hi - 1), hi)


@torch.inference_mode()
def calibrate_loop(target: torch.nn.Module, drafter: torch.nn.Module, table: CostTable, *, repeats: int = 5,
                   seed: int = 0) -> CostTable:
    """The table with the decode loop's own work per round (`loop`), per drafting round (`loop_spec`) and per
    draft step (`loop_draft`), and a call's start (`start`, `start_draft`), filled in, from
    `decoding.batched.generate_batch` itself: per batch size, an autoregressive decode and fixed-K decodes (the
    two Ks of `calibration_ks`) of n1 = LOOP_SHORT and n2 = n1 + LOOP_SPAN new tokens each (fewer where the cache
    has no room), over prompts long enough that every decode allocates the table's `cache_length` (they attend
    over the slots the table's steps did), interleaved (each pass visits every batch
    size), each after an untimed short decode of its own batch size and method (as the steps are timed after
    themselves; after another batch size's, compiled, B = 1's loop came out 0 in a table of B = 1, 8, 32 and
    0.44 ms in one of B = 1 alone), the fastest of `repeats` after a warm-up pass (as the steps: `fastest`). Every row decodes the same prompt (`context` random tokens): greedy rows then accept alike, so
    the batch stays in lockstep and no row finishes early. The difference of the two lengths cancels the
    prefills; what the steps the table prices do not explain, per round and per draft step, is the loop's:
        loop = (T_ar(n2) - T_ar(n1)) / (n2 - n1) - t_v(B, 1)
        E_K  = (T_K(n2) - T_K(n1)) - (S_K(n2) - S_K(n1)) - loop (R_K(n2) - R_K(n1))
             = loop_spec (R_K(n2) - R_K(n1)) + loop_draft (D_K(n2) - D_K(n1))     for both Ks, non-negative
    with S the table's step cost of the decode's rounds, R its rounds and D its drafts (both from its
    counters). What the short decodes spend beyond their rounds is the call's start; with the table's prefill
    steps (P: the target's, P_d: the drafter's, at the positions the prompts prefill at), its setup beyond them:
        start       = T_ar(n1) - n1 (t_v(B, 1) + loop) - P
        start_draft = T_K(n1) - S(n1) - (loop + loop_spec) R(n1) - loop_draft D(n1) - (start + P) - P_d   (the shorter K)
    (without: the whole start, scaled from the prompts' length to `context` tokens). `loop` is signed: where the
    decodes run a round's steps faster than the steps time alone, the table's steps are what is off and every round
    carries the difference (on one H200, eager, the demo pair: ~13 ms a target step inside the decodes against 17.3
    timed alone, and clamped at 0 this term left every prediction 3-31% low; benchmarks/predict/RESULTS.md, bench_predict).
    It stays above minus the one-wide step (a step is never free). The others are clamped at 0: noise must not
    make a round's own work, or a call's start, negative."""
    from specdraft.decoding.batched import generate_batch

    device = target.get_input_embeddings().weight.device
    vocab = min(target.config.vocab_size, drafter.config.vocab_size)
    gen = torch.Generator().manual_seed(seed + 1)
    ks = calibration_ks(table.max_drafts)
    slots = table.cache_length or least_cache_length(table.context, table.widths[-1])
    # generate_batch allocates static_length(prompt + new + W + 2) slots (W = 0 for AR; `decode_cache_length`): the
    # prompts are long enough that the short AR decode's cache is already `slots` (prompt + n1 + 2 > slots -
    # CACHE_ROUND), the long decode short enough that the fixed-K ones' still is (prompt + n2 + K + 2 <= slots).
    # Compiled, a cache is also at least the prefill's padded width: a power of two, which is more than `slots` for
    # some (384, 448, 640, ...); those calibrate over that larger cache
    n1 = LOOP_SHORT
    prompt_length = max(table.context, slots - CACHE_ROUND - n1 - 1)
    n2 = min(n1 + LOOP_SPAN, slots - prompt_length - ks[-1] - 2)
    if n2 <= n1:
        raise InputError(f"calibrating the loop needs a cache of at least context + {ks[-1] + n1 + 3} slots, the table "
                         f"has {slots} for a context of {table.context}; profile it with a longer cache_length")
    calls = {}
    # one compiler for every decode: a mode string would give each call a compiler of its own, and every timed
    # decode its compilation again (a compiled table's start came out 6 s at B = 1, its draft step 17 ms)
    compiler = StepCompiler(table.compile)
    for batch in table.batch_sizes:
        prompts = [torch.randint(0, vocab, (prompt_length,), generator=gen).tolist()] * batch
        calls.update({(batch, k, n): (lambda prompts=prompts, k=k, n=n: generate_batch(
            target, prompts, n, drafter=drafter if k else None, policy=build_policy(PolicySpec("fixed", k=k)) if k else None,
            compile=compiler)) for k in (0, *ks) for n in (n1, n2)})
    times: dict[tuple, list[float]] = {key: [] for key in calls}
    drafted: dict[tuple, list[int]] = {}
    for rep in range(repeats + 1):  # pass 0 warms up (and compiles); every pass visits every batch size
        for key, call in calls.items():
            # after an untimed short decode of the same batch size and method, as a batch follows a batch (after
            # another batch size's, the cold caches' cost came out of the loop term: docstring)
            calls[key[:2] + (n1,)]()
            out, timing = timed_call(call, device)
            if rep:
                times[key].append(timing.time)
            if key[1]:
                drafted[key] = out[0].metrics.drafted  # per round, the drafts of every (identical) row
    terms = [_loop_terms(table, batch, {key[1:]: fastest(v) for key, v in times.items() if key[0] == batch},
                         {key[1:]: d for key, d in drafted.items() if key[0] == batch}, ks, n1, n2, prompt_length)
             for batch in table.batch_sizes]
    loop, loop_spec, loop_draft, start, start_draft = (tuple(column) for column in zip(*terms))
    return dataclasses.replace(table, loop=loop, loop_spec=loop_spec, loop_draft=loop_draft, start=start,
                               start_draft=start_draft)


def _loop_terms(table: CostTable, batch: int, t: dict, drafted_at: dict, ks: tuple[int, ...], n1: int, n2: int,
                prompt_length: int) -> tuple[float, float, float, float, float]:
    """(loop, loop_spec, loop_draft, start, start_draft) at `batch` from its fastest decode times t[(K, n)] (K = 0:
    AR) and the fixed-K decodes' drafts per round drafted_at[(K, n)] (`calibrate_loop`'s docstring gives the
    formulas; with one K, the drafting rounds' work is all per draft step, as it cannot be told apart)."""
    # signed: where the loop runs a target step faster than it times alone, the steps are what is off (docstring)
    step = table.t_verify(batch, 1)
    per_round = max((t[(0, n2)] - t[(0, n1)]) / (n2 - n1) - step, (1e-3 - 1.0) * step)
    rows, extras, steps_of = [], [], {}
    for k in ks:
        steps = steps_of[k] = {n: sum(table.round_cost(batch, d) for d in drafted_at[(k, n)]) for n in (n1, n2)}
        rounds = len(drafted_at[(k, n2)]) - len(drafted_at[(k, n1)])
        drafting = sum(d > 0 for d in drafted_at[(k, n2)]) - sum(d > 0 for d in drafted_at[(k, n1)])
        rows.append((float(drafting), float(sum(drafted_at[(k, n2)]) - sum(drafted_at[(k, n1)]))))
        extras.append((t[(k, n2)] - t[(k, n1)]) - (steps[n2] - steps[n1]) - per_round * rounds)
    if len(ks) == 1:
        per_spec, per_draft = 0.0, max(0.0, extras[0] / rows[0][1]) if rows[0][1] > 0 else 0.0
    else:
        per_spec, per_draft = (float(v) for v in nnls2(torch.tensor(rows, dtype=torch.float64),
                                                        torch.tensor(extras, dtype=torch.float64)))
    short = ks[0]
    ar_start = max(0.0, t[(0, n1)] - n1 * (table.t_verify(batch, 1) + per_round))
    short_rounds = drafted_at[(short, n1)]
    spec_rounds = (steps_of[short][n1] + per_round * len(short_rounds)
                   + per_spec * sum(d > 0 for d in short_rounds) + per_draft * sum(short_rounds))
    spec_start = max(0.0, t[(short, n1)] - spec_rounds - ar_start)
    if table.prefill:  # the setup beyond the prefills, which `CostTable.t_start` prices at a call's own width
        positions = table.prefill_positions(prompt_length)
        target_prefill = table.t_prefill(batch, positions, False)
        drafter_prefill = table.t_prefill(batch, positions, True) - target_prefill
        return (per_round, per_spec, per_draft, max(0.0, ar_start - target_prefill),
                max(0.0, spec_start - drafter_prefill))
    # the starts of prompt_length-token prompts, priced at `context` tokens as `CostTable.t_start` scales them
    scale = table.prefill_positions(table.context) / table.prefill_positions(prompt_length)
    return per_round, per_spec, per_draft, ar_start * scale, spec_start * scale


def cache_dir(path: str | Path | None = None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get("SPECDRAFT_COST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specdraft" / "cost_tables"


def head_identity(head: torch.nn.Module | None) -> str:
    """A head's identity for the cost of its forward: its class and its parameters' names, shapes and dtypes."""
    if head is None:
        return "-"
    blob = json.dumps([type(head).__name__, [(n, list(p.shape), str(p.dtype)) for n, p in head.named_parameters()]])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cache_key(target: torch.nn.Module, drafter: torch.nn.Module, batch_sizes: Sequence[int], max_width: int,
              compile: str, context: int, calibrate: bool = False, head: torch.nn.Module | None = None,
              cache_length: int | None = None, repeats: int = 5) -> str:
    """What a cached table must match: the device and torch version it was timed under, the compile mode,
    both models' identities, the grid it covers, the head its rules were priced with, and its timed passes
    (a decoder's start times fewer than `specdraft predict`, and reads only its own)."""
    device = target.get_input_embeddings().weight.device
    # "start": calibrated tables price a call's start since that field came; "chain": drafter steps are timed
    # in a round's chains, "fastest": a table keeps each step's fastest pass, "prefill": calibrated tables
    # time the prefill steps, "prefill-at": a prefill runs the LM head at one position per row, "fused": a
    # compiled table times drafting as one draft graph, and "spec": a calibrated table prices a drafting round's
    # own work apart from its draft steps' (`calibration_ks`), "monotone": a table's steps are put in order
    # (`monotone_grid`), and "dtype": a table records its target's dtype (`CostTable.check_dtype`), since then;
    # older cached tables are re-timed
    blob = json.dumps([device_name(device), torch.__version__, compile, model_identity(target),
                       model_identity(drafter), sorted(set(batch_sizes)), max_width, context, calibrate, "start",
                       "chain", "fastest", "prefill", "prefill-at", "fused", "spec", "monotone", "dtype", head_identity(head),
                       static_length(cache_length) if cache_length else least_cache_length(context, max_width),
                       *((f"repeats={repeats}",) if repeats != 5 else ())])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def cached_cost_table(target: torch.nn.Module, drafter: torch.nn.Module, batch_sizes: Sequence[int],
                      max_width: int, compile: str = "none", *, repeats: int = 5, context: int = 64, seed: int = 0,
                      directory: str | Path | None = None, refresh: bool = False,
                      calibrate: bool = False, head: torch.nn.Module | None = None, prior=None,
                      threshold: float = 0.7, cache_length: int | None = None,
                      on_wait: Callable[[str], object] | None = None) -> tuple[CostTable, Path, bool]:
    """profile_cost_table through the on-disk cache: (table, its file, whether it was a cache hit).
    refresh: re-time and overwrite. A cached file that no longer reads is re-profiled, not trusted.
    head (with the batch-aware rules' `prior`, and SpecDec++'s `threshold`): the head rules' own work priced
    too (`price_head_rules`, K_max = max_width - 1) and cached with the table.

    One process profiles at a time per cache directory (`profiling_lock`): two would time each other's load
    into both tables and take twice as long; a process that waited reads the table the other one wrote
    instead of timing it again. on_wait(message): told once when another process holds the lock."""
    sizes = _check(batch_sizes, max_width, compile, repeats, context)
    if head is not None and prior is None:
        raise InputError("pricing a head's rules needs the batch-aware prior (Bundle.prior_for); pass prior=...")
    key = cache_key(target, drafter, sizes, max_width, compile, context, calibrate, head, cache_length, repeats)
    path = cache_dir(directory) / f"{key}.json"
    table = None if refresh else _read_cached(path)
    if table is not None:
        return table, path, True
    with profiling_lock(path.parent, on_wait):
        table = None if refresh else _read_cached(path)  # written by the process this one waited for
        if table is not None:
            return table, path, True
        table = profile_cost_table(target, drafter, sizes, max_width, compile, repeats=repeats, context=context,
                                   seed=seed, calibrate=calibrate, cache_length=cache_length)
        if head is not None:
            table = price_head_rules(table, head, drafter.config.hidden_size, prior, max_width - 1, threshold)
        table.save(path)
    return table, path, False


def _read_cached(path: Path) -> CostTable | None:
    if not path.is_file():
        return None
    try:
        return CostTable.load(path)
    except InputError:
        return None  # a torn or foreign file: time again and overwrite it


@contextlib.contextmanager
def profiling_lock(directory: Path, on_wait: Callable[[str], object] | None = None):
    """An exclusive advisory lock on `directory`/.profiling.lock (fcntl.flock: released by the kernel when the
    holder exits, even killed), held while this process profiles."""
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".profiling.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(f"waiting for another process profiling into {directory} (its table may be this one)")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
