"""Batched speculative decoding on the model's device: B prompts, ragged acceptance, per-row static KV
caches (`decoding.rounds.static_cache`), tensor verification (`decoding.rounds.batch_verify`) and one host transfer
per round. The batch-1 loop in `decoding.speculative` stays the reference (and the home of trees,
SpecTr, cascades and model-free speculators); this module reproduces it row by row.

State between rounds, per row b (all device tensors):
    committed tokens C_b = prompt + output so far; `last` / `prev` its last two tokens
    target cache length  C_b - 1   (the last committed token is fed with the next drafts)
    drafter cache length C_b       (after the end-of-round catch-up, which also gave q_1)
A round (SpecDec++ Alg. 1 order, `decoding.rounds.lengths`):
    1. draft: sample y_i ~ q_i, decision i (cap / EOS / head on e_{i-1}), feed y_i unless stopping;
       rows draft in lockstep, a row that stopped keeps the batch shape but is masked
    2. verify: one target forward over [last, y_1..y_W] (W = the round's width; under compile rounded up
       to a power of two, at most K_max)
    3. accept per row (`verify_greedy` / `verify_sampled`), write the n + 1 emitted tokens into the
       output buffer with one scatter, truncate at EOS, advance the cache lengths (= rollback)
    4. catch-up: the drafter re-feeds the last two committed tokens at slots C - 2, C - 1 (a fixed
       width of 2 covers both "y_k and the bonus" and "the correction"; re-writing an already cached
       slot writes the same K/V), which yields next round's q_1; counted as that round's first
       drafter forward, exactly as the batch-1 catch-up. An EAGLE drafter instead writes its entries
       (f_j, x_{j+1}) for the positions the round committed, f_j from the verify forward's hidden states
       (EAGLE-1: the final state; EAGLE-3: its low, middle and high layers, concatenated) (its cache holds
       C - 1 entries; the prompt's come from the target's prefill)
    5. one `.cpu()` of per-row counts (k, n, dropped, active, done): the only host transfer
       (a rule with a head, or one that decides at 0, adds one flag per draft step: whether any row still
       drafts, read eagerly before the feed, so a round that stopped feeds nothing more)
Counts per row follow `decoding.rounds.lengths` exactly (Lemma 3.1: N_draft + N_target = N + N_discarded); a
finished row is masked and not counted, and once half the rows are done an eager decode drops them
(a copy of the caches; compiled steps keep their shapes). The prefills belong to the first round
(the target's over prompt[:-1], the drafter's over the prompt: its q_1), as in batch 1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.compat import check_head, check_pair, check_prompt
from specdraft.decoding.batch_draft import (Drafts, EagleChainStep, compiled_segment, draft_positions,
                                           reads_each_decision, zero_decision)
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.metrics import GenerationMetrics, GenerationResult
from specdraft.decoding.policies.batch_length_ucb import LengthUCB, RowBandits
from specdraft.decoding.policies.decide import decide
from specdraft.decoding.rounds.batch_verify import verify_greedy, verify_sampled
from specdraft.decoding.rounds.kv import input_device
from specdraft.decoding.rounds.sampling import SamplingConfig, probs
from specdraft.decoding.rounds.shapes import (decode_cache_length, drafts_reserved, prefill_width, segments,
                                               static_length, verify_width)
from specdraft.decoding.rounds.static_cache import eagle_rows, forward_rows, model_floor
from specdraft.decoding.speculators.eagle_model import EagleDrafter

GREEDY = SamplingConfig(temperature=0.0)
# rounds with no draft that may pass before the drafter catches up anyway (each pending round widens the catch-up
# by one token: a compiled decode compiles one graph per width)
MAX_BEHIND = 6


# ----------------------------------------------------------------------------------------------------
# request checks

def check_request(target, prompts, max_new_tokens, drafter, policy, sampling, eos_token_id) -> list[int]:
    """Every argument one that can work (InputError naming it otherwise); returns the EOS ids."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise InputError("prompts must be a non-empty list of token-id lists; give at least one prompt")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise InputError(f"prompt {i} must be a list of integer token ids, got {type(prompt).__name__}")
        check_prompt(list(prompt), max_new_tokens, target, *([drafter] if drafter is not None else []))
    if not isinstance(sampling, SamplingConfig):
        raise InputError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
    if policy is None:
        if drafter is not None:
            raise InputError("a drafter was given without a policy; pass policy=FixedK(k), SpecDecPP(...) or LengthUCB(...)")
        return eos
    if drafter is None:
        raise InputError(f"policy {policy!r} needs a drafter; pass drafter=... or policy=None for autoregressive decoding")
    if not isinstance(drafter, EagleDrafter) and (not hasattr(drafter, "get_output_embeddings")
                                                  or getattr(drafter, "config", None) is None):
        raise InputError(f"the batched decoder drafts with a causal LM or an EAGLE drafter, not {type(drafter).__name__}; "
                         "decode model-free speculators one prompt at a time with generate_speculative")
    check_pair(target, drafter)
    if not hasattr(policy, "stop_rows") or getattr(policy, "hindsight", False):
        raise InputError(f"the batched decoder supports FixedK, SpecDecPP and LengthUCB policies, not {policy!r}; "
                         "decode other speculators one prompt at a time with generate_speculative")
    if isinstance(getattr(policy, "head", None), torch.nn.Module):
        check_head(policy.head, drafter)
    return eos


# ----------------------------------------------------------------------------------------------------
# one round's pieces

def right_pad(prompts, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L_max) ids right-padded with 0 and (B,) lengths: slot = position from each row's first token."""
    lengths = [len(p) for p in prompts]
    ids = torch.zeros(len(prompts), max(lengths), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p, dtype=torch.long)
    return ids.to(device), torch.tensor(lengths, dtype=torch.long, device=device)


def commit_round(tokens, k, n, extra, n_out, done, last, prev, target_lengths, out, origin, eos, max_new: int):
    """Everything a round does after verification, as fixed-shape tensor ops (one compiled graph under
    `compile`): emitted = y_1..y_n, extra, truncated after the first EOS; written into the output buffer
    `out` (rows of the caller's prompts, `origin`) with one indexed store; the per-row state advanced
    (the target keeps context + y_1..y_n: its length grows by n + 1, the rollback). Finished rows are
    left as they are. Returns (emitted, count, active, n_out, done, last, prev, target_lengths, stats);
    stats (5, rows) = k, n, dropped, active, done: what the host reads once per round."""
    width = tokens.shape[1]
    emitted = torch.cat([tokens, torch.zeros_like(extra)[:, None]], dim=1)
    emitted.scatter_(1, n[:, None], extra[:, None])
    count = n + 1
    j = torch.arange(width + 1, device=tokens.device)
    hit_eos = torch.zeros_like(done)
    if eos is not None:
        is_eos = torch.isin(emitted, eos) & (j[None] < count[:, None])
        hit_eos = is_eos.any(1)
        count = torch.where(hit_eos, is_eos.int().argmax(1) + 1, count)
    dropped = n + 1 - count  # the bonus after an accepted drafted EOS: computed, never emitted
    active = ~done
    count = torch.where(active, count, 0)
    dump = out.shape[1] - 1  # where positions past a row's emitted tokens go
    slots = torch.where(j[None] < count[:, None], n_out[:, None] + j[None], dump)
    out[origin[:, None], slots] = emitted
    prev = torch.where(count >= 2, gather_row(emitted, (count - 2).clamp_min(0)), torch.where(count == 1, last, prev))
    last = torch.where(count >= 1, gather_row(emitted, (count - 1).clamp_min(0)), last)
    n_out = n_out + count
    done = done | hit_eos | (n_out >= max_new)
    target_lengths = target_lengths + torch.where(active, n + 1, 0)
    stats = torch.stack([k, n, dropped, active.long(), done.long()])
    return emitted, count, active, n_out, done, last, prev, target_lengths, stats


def verify_commit_greedy(logits, tokens, k, *rest):
    """Greedy verification and the commit in one function (one graph when compiled): (n, *commit_round)."""
    n, extra = verify_greedy(logits, tokens, k)
    return (n, *commit_round(tokens, k, n, extra, *rest))


@dataclass
class RowState:
    """Per-row decode state between rounds (device tensors, one entry per current row)."""

    origin: torch.Tensor  # (rows,) the row's index in the caller's prompt list
    last: torch.Tensor  # last committed token
    prev: torch.Tensor  # the one before it
    plens: torch.Tensor  # prompt length
    n_out: torch.Tensor  # tokens emitted so far
    done: torch.Tensor  # EOS or the length limit reached
    q_logits: torch.Tensor | None  # (rows, V) the drafter's logits behind next round's q_1
    prompt: torch.Tensor | None = None  # (rows, L) the prompt ids, right-padded (a deferred catch-up reads them)
    feature: torch.Tensor | None = None  # EAGLE: (rows, H) the predicted feature f^ at the last committed token

    def select(self, keep: torch.Tensor) -> "RowState":
        return RowState(**{name: (value[keep] if value is not None else None) for name, value in vars(self).items()})


def gather_row(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, T), index (B,) -> x[b, index[b]]."""
    return x.gather(1, index[:, None]).squeeze(1)


def gather_at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, T, D), index (B,) -> x[b, index[b]] (B, D)."""
    return x.gather(1, index[:, None, None].expand(-1, 1, x.shape[-1])).squeeze(1)


@dataclass
class Decode:
    """What one `generate_batch` call fixes: the models and their (possibly compiled) steps, the caches,
    the policy, the sampling, and the output buffer. The rounds change only `RowState` and the caches."""

    target: torch.nn.Module
    drafter: torch.nn.Module | None
    policy: object  # a length rule (`decoding.policies.stopping.LengthRule`); None: autoregressive
    sampling: SamplingConfig
    generator: torch.Generator
    eos: torch.Tensor | None
    max_new: int
    compiler: StepCompiler
    tcache: object
    target_step: Callable
    out: torch.Tensor
    dcache: object = None
    drafter_step: Callable | None = None
    eagle_step: EagleChainStep | None = None
    bandits: RowBandits | None = None
    commit: Callable = commit_round  # the round's tails, compiled by `start` (their graphs hold no model)
    greedy_tail: Callable = verify_commit_greedy
    behind: int = 0  # rounds since the drafter's last catch-up (rounds with no draft defer it: `catch_up`)

    @property
    def width(self) -> int:
        return self.policy.max_tokens if self.policy is not None else 0

    @property
    def eagle(self) -> bool:
        return self.eagle_step is not None

    @property
    def feature_layers(self) -> tuple[int, ...] | None:
        """The target hidden states an EAGLE-3 drafter reads (its low, middle and high layers, fused by its own
        fc); None: the final state (EAGLE-1, and no EAGLE drafter)."""
        layers = tuple(self.drafter.feature_layers) if self.eagle else (-1,)
        return None if layers == (-1,) else layers

    @property
    def fused(self) -> bool:
        """Drafting runs as compiled segments (`compiled_segment`): causal-LM drafters."""
        return not self.compiler.eager and self.drafter is not None and not self.eagle


def prefill(d: Decode, ids: torch.Tensor, plens: torch.Tensor) -> RowState:
    """The first round's prefills: the target's over each prompt less its last token (compiled: the padded
    width; what it writes past a row's length is rolled back and overwritten before any query sees it),
    the drafter's over the prompt (its q_1); an EAGLE drafter's entries from the target's features."""
    B, device = ids.shape[0], ids.device
    features = None
    if ids.shape[1] > 1:  # the target never holds the last committed token (it goes out with the drafts)
        # no logits read: the head runs at one position per row only (`forward_rows`' at)
        none_read = torch.zeros(B, dtype=torch.long, device=device)
        features = d.target_step(d.tcache, ids if not d.compiler.eager else ids[:, :-1], d.eagle, none_read,
                                 d.feature_layers)[1]
    d.tcache.rollback(plens - 1)
    state = RowState(origin=torch.arange(B, device=device), last=gather_row(ids, plens - 1),
                     prev=gather_row(ids, (plens - 2).clamp_min(0)), plens=plens,
                     n_out=torch.zeros(B, dtype=torch.long, device=device),
                     done=torch.zeros(B, dtype=torch.bool, device=device), q_logits=None, prompt=ids)
    if d.eagle:
        # EAGLE entry j is (f_j, x_{j+1}) at position j: the prompt's entries 0..L-2 from the target's
        # prefill features; a one-token prompt has none yet and drafts nothing in its first round
        if features is not None:
            logits, pred = d.drafter_step(d.dcache, features[:, : ids.shape[1] - 1], ids[:, 1:])
            at = (plens - 2).clamp_min(0)
            state.q_logits, state.feature = gather_at(logits, at), gather_at(pred, at)
        else:
            state.q_logits = torch.zeros(B, d.target.config.vocab_size, device=device)
            state.feature = torch.zeros(B, d.drafter.config.hidden_size, device=device, dtype=d.drafter.fc.weight.dtype)
        d.dcache.rollback(plens - 1)
    elif d.drafter is not None:
        state.q_logits = d.drafter_step(d.dcache, ids, False, plens - 1)[0][:, 0]  # the logits behind q_1 only
        d.dcache.rollback(plens)
    return state


def draft(d: Decode, state: RowState, room: int) -> Drafts:
    """This round's drafts for every row: each row's cap (the length limit, the policy's K or its bandit's
    arm; 0 once done), decision 0 of the policy, then the draft loop (eager: one position at a time, ending
    when no row drafts; compiled: `segments`, one host read after each). room: the most drafts the length
    limit leaves any unfinished row, as the host counts them (`record_round`): no position past it is drafted,
    and a rule that reads nothing between positions (fixed K, length bandits) runs a round of at most that many
    (compiled: a graph of its padded width) instead of all W (on the demo pair's 48-token rows at K = 16, a
    row's last rounds drafted 16 positions and verified 17 for a cap of a few drafts, and its very last round,
    with room for the bonus token alone, as many)."""
    rows, W, device = state.last.shape[0], min(d.width, room), state.last.device
    if not d.compiler.eager and W:
        W = verify_width(W, d.width)  # compiled: graphs (draft, verify) per padded width, not per room
    if W == 0:  # no policy width, or no room left for a draft: a plain target step
        return Drafts(tokens=torch.zeros(rows, 0, dtype=torch.long, device=device), q=None,
                      k=torch.zeros(rows, dtype=torch.long, device=device), steps=0)
    cap = (d.max_new - state.n_out - 1).clamp_min(0)  # leave room for the token every round emits
    cap = torch.minimum(cap, d.bandits.select(d.generator)) if d.bandits is not None else cap.clamp_max(W)
    cap = torch.where(state.done, 0, cap)
    if d.eagle:  # no EAGLE entries before the first committed position: no draft
        cap = torch.where(state.plens + state.n_out >= 2, cap, 0)
        d.eagle_step.feature = state.feature
    # the round's uniforms for sampled drafts, drawn whether or not it drafts: eager and compiled decodes of one
    # seed then draw the same stream (a compiled graph takes them as an argument: no generator inside it)
    # (K_max wide whatever the room: a round near the end reads the uniforms it would have read anyway)
    uniforms = None if d.sampling.greedy else torch.rand(rows, d.width, generator=d.generator, device=device)[:, :W]
    # compiled, decision 0 is made inside the first draft graph where the host knows its outcome (`zero_decision`):
    # its eager ops and the read of whether any row drafts were ~3% of a batch-1 round of the batch-aware rule
    known = zero_decision(d.policy, rows) if d.fused else None
    zeros = torch.zeros(rows, dtype=torch.long, device=device)
    if known is True:  # every row stops before drafting: a plain target step
        return Drafts(tokens=torch.zeros(rows, W, dtype=torch.long, device=device), q=None, k=zeros, steps=0)
    if known is False:
        rule, drafting = None, cap > 0
    else:
        rule, stop = decide(d.policy, d.policy.round_state(rows, device), 0, cap > 0)
        drafting = (cap > 0) & ~stop
    if d.behind and bool(drafting.any()):  # some row drafts: the drafter first sees what it missed
        catch_up_behind(d, state, 2 + d.behind)
    qs = None if d.sampling.greedy else torch.zeros(rows, W, state.q_logits.shape[-1], device=device)
    carry = (torch.zeros(rows, W, dtype=torch.long, device=device), qs, zeros, drafting, state.q_logits, None, rule)
    reads: list[bool] | None = None  # eager: the host's reads of whether any row drafts on, one per decision
    if d.fused:
        graphs = [(bounds, compiled_segment(d.compiler, d.drafter, d.policy, bounds, W, d.sampling,
                                            decide_zero=known is False and bounds[0] == 0))
                  for bounds in segments(W, d.policy)]
        parts = [(bounds, lambda cache, cap, eos, carry, graph=graph: graph(cache, cap, eos, uniforms, carry))
                 for bounds, graph in graphs]
    else:
        step = d.eagle_step or d.drafter_step
        if reads_each_decision(d.policy):
            reads = []
        parts = [((i, i + 1), lambda cache, cap, eos, carry, i=i: draft_positions(
            step, d.policy, cache, cap, eos, d.sampling, uniforms, carry, range(i, i + 1), W, reads))
            for i in range(W)]
    steps = 0
    # a rule that may stop rows before any draft (decision 0) ends a round with no drafter step when it
    # stops them all; other rules read the flag only between segments
    first = getattr(d.policy, "decides_at_zero", False) and known is None
    for (start, end), part in parts:
        if (start or first) and (d.policy.needs_hidden or first):
            # eagerly the position before read this flag after its decision: not read twice (each read is a
            # device sync; on a GPU it waits for the queue)
            if not (reads[-1] if start and reads is not None else bool(carry[3].any())):
                break  # no row drafts on: the round ends (the one host read of a segment)
        carry = part(d.dcache, cap, d.eos, carry)
        steps = end
    tokens, qs, k = carry[:3]
    widths = getattr(d.policy, "widths", None)
    if widths is not None:  # a rule that decides after drafting (a global verify budget): each row keeps a prefix
        k = torch.minimum(k, widths(carry[6]))
        tokens = torch.where(torch.arange(W, device=device)[None] < k[:, None], tokens, 0)
        steps = int(k.max())  # one more host read: the verify shrinks to the longest prefix kept
    elif d.fused and d.policy.needs_hidden and steps:
        # the verify runs at the longest row's drafts (as the cost table prices a round), not at its last segment's
        # end: a round that stops after 1 or 2 drafts of a 4-position segment verifies 2 or 3 positions, not 5 (at
        # B = 1 on the demo pair, compiled: 2.7-3.3 ms against 3.7). One small host read, after the draft graphs
        # (on a GPU it waits for them, as each segment's read does).
        steps = int(k.max())
    return Drafts(tokens=tokens, q=qs, k=k, steps=steps)


def verify_and_commit(d: Decode, state: RowState, drafts: Drafts):
    """One target forward over [last, y_1..y_W] (compiled: W rounded up, `verify_width`), acceptance per
    row, and the commit (`commit_round`); the row state advanced in place. Returns (emitted, count,
    stats, the verify's hidden states, each row's committed length before the round)."""
    width = verify_width(drafts.steps, d.width) if not d.compiler.eager else drafts.steps
    tokens, q = drafts.tokens[:, :width], (drafts.q[:, :width] if drafts.q is not None else None)
    # the floor counts the rows still live (`verify_floor`; an eager decode drops finished ones)
    floor = model_floor(d.target, tokens.shape[0])
    if width + 1 < floor:  # filler past every row's drafts (k stays): its logits are never read
        tokens = torch.nn.functional.pad(tokens, (0, floor - 1 - width))
        q = torch.nn.functional.pad(q, (0, 0, 0, floor - 1 - width)) if q is not None else None
    logits, verified = d.target_step(d.tcache, torch.cat([state.last[:, None], tokens], dim=1), d.eagle,
                                     None, d.feature_layers)
    committed_before = state.plens + state.n_out
    rest = (state.n_out, state.done, state.last, state.prev, d.tcache.lengths, d.out, state.origin, d.eos, d.max_new)
    if d.sampling.greedy:
        n, emitted, count, active, *advanced, stats = d.greedy_tail(logits, tokens, drafts.k, *rest)
    else:
        q = q if q is not None else logits.new_zeros(*tokens.shape, logits.shape[-1])  # no draft: no q
        # acceptance uniforms for every position up to K_max: a compiled verify, padded wider, draws what eager draws
        r = torch.rand(tokens.shape[0], d.width, generator=d.generator, device=tokens.device)
        r = torch.nn.functional.pad(r, (0, max(0, tokens.shape[1] - d.width)), value=1.0)  # the floor's filler: none drafted
        n, extra = verify_sampled(probs(logits, d.sampling), q.float(), tokens, drafts.k, d.generator, r)
        emitted, count, active, *advanced, stats = d.commit(tokens, drafts.k, n, extra, *rest)
    state.n_out, state.done, state.last, state.prev, d.tcache.lengths = advanced
    if d.bandits is not None:
        d.bandits.update(n, drafts.k, active)
    return emitted, count, stats, verified, committed_before


def catch_up(d: Decode, state: RowState, emitted, count, verified, committed_before, drafted: int) -> None:
    """The drafter's catch-up, which yields next round's q_1 (launched before the round's host read, so the
    device keeps working): a causal LM re-feeds the last two committed tokens; an EAGLE drafter writes its
    entries (f_j, x_{j+1}) for the positions this round committed, from the verify's features. After a round
    with no draft under a rule that decides before drafting (`decides_at_zero`), a causal LM's catch-up waits
    for the next round that drafts (`catch_up_behind`): a plain target step then costs what batched AR costs."""
    if d.eagle:
        d.dcache.rollback(committed_before - 1)
        logits, pred = d.drafter_step(d.dcache, verified, emitted)
        at = (count - 1).clamp_min(0)
        state.q_logits, state.feature = gather_at(logits, at), gather_at(pred, at)
        d.dcache.lengths += count
    elif d.drafter is not None:
        if drafted == 0 and getattr(d.policy, "decides_at_zero", False) and d.behind < MAX_BEHIND:
            d.behind += 1  # a plain target step: no drafter forward now; the next round that drafts catches up
            return
        if d.behind:
            catch_up_behind(d, state, 2 + d.behind)
            return
        d.dcache.rollback(state.plens + state.n_out - 2)
        state.q_logits = d.drafter_step(d.dcache, torch.stack([state.prev, state.last], dim=1))[0][:, -1]
        d.dcache.lengths += 2


def committed_tokens(d: Decode, state: RowState, positions: torch.Tensor) -> torch.Tensor:
    """The committed token at each of `positions` (rows, w) of each row: its prompt's, else its output's."""
    in_prompt = positions < state.plens[:, None]
    prompt = state.prompt.gather(1, positions.clamp(max=state.prompt.shape[1] - 1))
    output = d.out[state.origin].gather(1, (positions - state.plens[:, None]).clamp_min(0))
    return torch.where(in_prompt, prompt, output)


def catch_up_behind(d: Decode, state: RowState, width: int) -> None:
    """The deferred catch-up: the drafter re-feeds each row's last `width` committed tokens (2 + the rounds it
    sat out), which yields q_1 at the last one; counted, as every catch-up, as the next drafted round's first
    drafter forward (`decoding.rounds.lengths`: it feeds every committed token the drafter has not seen)."""
    committed = state.plens + state.n_out
    start = (committed - width).clamp_min(0)
    positions = torch.minimum(start[:, None] + torch.arange(width, device=start.device), committed[:, None] - 1)
    d.dcache.rollback(start)
    logits = d.drafter_step(d.dcache, committed_tokens(d, state, positions))[0]
    state.q_logits = gather_at(logits, committed - 1 - start)
    d.dcache.rollback(committed)
    d.behind = 0


def record_round(metrics: list[GenerationMetrics], finished: list[bool], row_ids: list[int], stats: list[list[int]]) -> None:
    """The round's counts per row (read from `stats`, the round's one host transfer), as batch 1 counts
    them (`decoding.rounds.lengths`); finished rows are not counted."""
    for i, b in enumerate(row_ids):
        if not stats[3][i]:
            continue
        k_b, n_b, dropped_b = stats[0][i], stats[1][i], stats[2][i]
        m = metrics[b]
        m.n_target += 1
        m.n_draft += k_b
        m.n_discarded += k_b - n_b + dropped_b
        m.n_generated += n_b + 1 - dropped_b
        m.drafted.append(k_b)
        m.accepted.append(n_b)
        finished[b] = bool(stats[4][i])


def drop_finished(d: Decode, state: RowState, row_ids: list[int], finished: list[bool]) -> tuple[RowState, list[int]]:
    """Once half the rows are done, an eager decode drops them (a copy of the caches), so they stop costing
    work; compiled steps keep the batch (a new batch size would be a new graph)."""
    live = [i for i, b in enumerate(row_ids) if not finished[b]]
    if not d.compiler.eager or len(live) > len(row_ids) // 2:
        return state, row_ids
    keep = torch.tensor(live, device=state.last.device)
    d.tcache = d.tcache.select_rows(keep)
    if d.drafter is not None:
        d.dcache = d.dcache.select_rows(keep)
    if d.bandits is not None:
        d.bandits.select_rows(keep)
    return state.select(keep), [row_ids[i] for i in live]


def forward_step(compiler: StepCompiler, model: torch.nn.Module) -> Callable:
    """`model`'s forward over a RowStaticCache, step(cache, ids, hidden=False) -> (logits, hidden states or
    None) (an EAGLE drafter: step(cache, features, ids)), compiled by `compiler` once per model; each
    distinct width (1 and 2 for the drafter, W + 1 for the verify) is one graph."""
    if isinstance(model, EagleDrafter):
        def step(cache, features, ids):
            return eagle_rows(model, cache, features, ids)
    else:
        def step(cache, ids, hidden=False, at=None, layers=None):
            return forward_rows(model, cache, ids, hidden, at, layers)
    return compiler.apply(step, model, "forward", graphs=True)


def start(target, prompts, max_new_tokens, drafter, policy, sampling, eos, seed, compiler: StepCompiler):
    """The Decode of a call and its right-padded prompts (compiled: padded to `prefill_width`)."""
    device = input_device(target)
    B, W = len(prompts), (policy.max_tokens if policy is not None else 0)
    floor = model_floor(target, B)
    ids, plens = right_pad(prompts, device)
    # the prefill too runs at least `floor` positions (the last prompt token is not prefilled): a short prompt's
    # cache is then written by the kernels that write a long one's
    if floor > 1:
        ids = torch.nn.functional.pad(ids, (0, max(0, floor + 1 - ids.shape[1])))
    max_len = decode_cache_length(ids.shape[1], max_new_tokens, drafts_reserved(W, model_floor(target)), compiler.mode)
    if not compiler.eager:  # the prefills run compiled too, at a few padded widths
        ids = torch.nn.functional.pad(ids, (0, prefill_width(ids.shape[1]) - ids.shape[1]))

    d = Decode(target=target, drafter=drafter, policy=policy, sampling=sampling,
               generator=torch.Generator(device=device).manual_seed(seed),
               eos=torch.tensor(eos, dtype=torch.long, device=device) if eos else None, max_new=max_new_tokens,
               compiler=compiler, tcache=compiler.cache(target, B, max_len),
               target_step=forward_step(compiler, target),
               # the output buffer's width rounded up as a cache's is: the round's compiled tails guard on it, so
               # with max_new + K_max + 2 every K_max was a graph of its own at every width and batch size (a sweep
               # of K = 1, 2, 4, 8 and the head rules over B = 1..16 passed dynamo's limit and ran eagerly)
               out=torch.zeros(B, static_length(max_new_tokens + W + 2), dtype=torch.long, device=device))
    d.commit = compiler.apply(commit_round, None, "commit")
    d.greedy_tail = compiler.apply(verify_commit_greedy, None, "verify")
    if drafter is not None:
        d.dcache = compiler.cache(drafter, B, max_len)
        if isinstance(drafter, EagleDrafter):
            drafter.attach_target(target)
        d.drafter_step = forward_step(compiler, drafter)
        if isinstance(drafter, EagleDrafter):
            d.eagle_step = EagleChainStep(d.drafter_step)
    if isinstance(policy, LengthUCB):
        d.bandits = RowBandits(policy, B, device)
    return d, ids, plens


# ----------------------------------------------------------------------------------------------------
# the public API

@torch.inference_mode()
def generate_batch(
    target: torch.nn.Module,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    drafter: torch.nn.Module | None = None,
    policy=None,
    sampling: SamplingConfig = SamplingConfig(temperature=0.0),
    eos_token_id: int | list[int] | None = None,
    seed: int = 0,
    compile: str | StepCompiler = "none",
) -> list[GenerationResult]:
    """Decode every prompt; one GenerationResult per prompt, in order. policy: FixedK(k),
    SpecDecPP(head, threshold, k_max) (each row stops alone), LockstepSpecDecPP (the same arguments; the
    batch stops together), LengthUCB(lengths) (needs `drafter`), or None for batched autoregressive
    decoding. Greedy output equals each prompt decoded alone; sampled output follows the target
    distribution under `sampling`. Sampling draws from a generator on the target's device seeded with
    `seed`. compile: a `StepCompiler` (kept by a caller that decodes many times: it compiles once), or a
    mode name ("none", "default", "reduce-overhead": a compiler of its own for this call). Compiled, the
    drafts are verified padded to a power of two up to K_max and the prompts prefilled padded to a power of
    two: a few fixed shapes; the first call of each shape pays its compilation. Times in the metrics are
    the batch's wall time, shared by its rows."""
    compiler = compile if isinstance(compile, StepCompiler) else StepCompiler(compile)
    eos = check_request(target, prompts, max_new_tokens, drafter, policy, sampling, eos_token_id)
    began = time.perf_counter()
    d, ids, plens = start(target, prompts, max_new_tokens, drafter, policy, sampling, eos, seed, compiler)
    state = prefill(d, ids, plens)
    B = len(prompts)
    row_ids = list(range(B))  # the original index of each current row (finished rows may be dropped)
    metrics = [GenerationMetrics() for _ in range(B)]
    finished = [False] * B
    while True:
        # the most drafts the length limit leaves an unfinished row, counted on the host (n_generated is the
        # row's n_out): a bound `draft` needs no read for
        room = max(max_new_tokens - metrics[b].n_generated - 1 for b in row_ids if not finished[b])
        drafts = draft(d, state, room)
        emitted, count, stats, verified, committed_before = verify_and_commit(d, state, drafts)
        catch_up(d, state, emitted, count, verified, committed_before, drafts.steps)
        record_round(metrics, finished, row_ids, stats.cpu().tolist())  # the one host transfer of the round
        if all(finished):
            break
        state, row_ids = drop_finished(d, state, row_ids, finished)
    tokens_out = d.out.cpu().tolist()
    elapsed = time.perf_counter() - began
    for m in metrics:
        m.time_total = elapsed
    return [GenerationResult(tokens=tokens_out[b][: metrics[b].n_generated], metrics=metrics[b]) for b in range(B)]
