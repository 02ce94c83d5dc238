"""The drafting half of the batched decoder's round (`decoding.batched`): every row drafts in lockstep, in
SpecDec++ Alg. 1 order (sample y_i, decide, feed y_i), eagerly or as compiled segments, from a causal-LM drafter
or an EAGLE chain. A row that stopped keeps the batch shape but is masked. The verifying half is
`decoding.rounds.batch_verify`; the loop that joins them, and what a round commits, is `decoding.batched`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.policies.decide import decide
from specdraft.decoding.rounds.sampling import SamplingConfig, probs, sample_inverse
from specdraft.decoding.rounds.static_cache import forward_rows


def rule_key(policy) -> tuple:
    """What tells one policy's compiled draft graphs from another's: its kind and numbers (repr), its head (the
    graph holds the head's weights) and its cost table (the batch-aware rules' thresholds are the table's
    constants in the graph; two rules that differ only in their tables print alike, and the second reused the
    first's graphs, deciding with the first's table). Identities: a graph holds its policy, so neither object
    dies and leaves its id to another while the compiler lives."""
    return (type(policy).__name__, repr(policy), id(getattr(policy, "head", None)),
            id(getattr(policy, "table", None)))


def pick(logits: torch.Tensor, sampling: SamplingConfig, u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, V) logits -> (token (B,), q (B, V) or None under greedy); sampled by the inverse CDF at the row's
    uniform u (B,) (`sample_inverse`): eager and compiled drafting draw the same tokens from one seed."""
    if sampling.greedy:
        return logits.argmax(-1), None
    q = probs(logits, sampling)
    return sample_inverse(q, u), q


@dataclass
class Drafts:
    tokens: torch.Tensor  # (B, W) long, zero past k
    q: torch.Tensor | None  # (B, W, V) sampled-from distributions (None under greedy)
    k: torch.Tensor  # (B,) candidates drafted per row
    steps: int  # positions drafted by the batch (at least max k; W when no early exit)


def reads_each_decision(policy) -> bool:
    """Whether an eager round reads, after each of `policy`'s decisions, if any row drafts on: a rule that can stop
    the whole batch (a head, or one that decides at 0). `costs.rules._rule_round` prices these reads."""
    return policy.needs_hidden or getattr(policy, "decides_at_zero", False)


def draft_positions(step, policy, cache, cap, eos, sampling: SamplingConfig, uniforms: torch.Tensor | None, carry: tuple,
                    positions: range, width: int, reads: list[bool] | None = None) -> tuple:
    """Draft positions `positions` of a round in SpecDec++ Alg. 1 order, every row in lockstep: sample y_i
    from the logits behind q_i (uniforms (B, W): the round's, drawn before it; None under greedy), then
    decision i + 1 (the cap, EOS, and the policy's tensor rule reading e_i), then feed y_i unless it is the
    round's last position. A row that stopped keeps the batch shape but is masked: its drafts are zero, its
    cache length does not move. carry = (tokens (B, W), q (B, W, V) or None, k, drafting, logits behind the
    next q, e of the last fed token or None, the rule's state); returns the carry advanced. No host read
    unless `reads` is a list (eager only): then after each decision but the round's last, whether any row drafts
    on is read and appended to it, and no feed once none does (a feed after the round's last decision is a
    drafter forward nothing reads: on the demo pair, eager, a whole drafter step per head-stopped round, ~1 ms
    at B = 8). The caller's loop reuses that read rather than reading the flag again. A compiled segment reads
    nothing: it is one graph."""
    tokens, qs, k, drafting, logits, hidden, rule = carry
    for i in positions:
        y, q = pick(logits, sampling, None if uniforms is None else uniforms[:, i])
        # functional, not an indexed store into the carried tensor: a graph that mutates its inputs hit an
        # inductor CPU codegen error (KeyError in outer-loop fusion, torch 2.13)
        column = torch.arange(tokens.shape[1], device=tokens.device) == i
        tokens = torch.where(column[None], torch.where(drafting, y, 0)[:, None], tokens)
        if qs is not None:
            qs = torch.where(column[None, :, None], q[:, None], qs)
        k = k + drafting
        go_on = drafting & (k < cap)
        if eos is not None:
            go_on &= ~torch.isin(y, eos)  # drafting past EOS is wasted work
        rule, stop = decide(policy, rule, i + 1, go_on, hidden=hidden)
        drafting = go_on & ~stop
        if i == width - 1:
            break  # y_W is never fed in its own round
        if reads is not None:
            reads.append(bool(drafting.any()))
            if not reads[-1]:
                break  # eagerly, no token is fed after every row stopped
        out, states = step(cache, y[:, None], policy.needs_hidden)
        logits = out[:, -1]
        hidden = states[:, -1] if states is not None else None
        cache.lengths += drafting  # rows that stopped keep their length: the slot just written is stale
    return tokens, qs, k, drafting, logits, hidden, rule


def compiled_segment(compiler: StepCompiler, model: torch.nn.Module, policy, bounds: tuple[int, int], width: int,
                     sampling: SamplingConfig, decide_zero: bool = False):
    """`draft_positions` over positions bounds[0]..bounds[1] - 1 as one graph per (model, policy, sampling,
    bounds, batch size); sampled picks read the round's uniforms, an argument of the graph. Always inductor's
    default mode: its outputs are the round's state, which a CUDA graph's next replay would overwrite. Why:
    on the demo pair (batch 1, K = 4, compiled) a round made 6 compiled calls (verify, tail, catch-up and 3
    drafter steps), and the calls' own overhead and the eager ops between them were ~10% of its time
    (benchmarks/decoder/RESULTS.md). decide_zero: the graph first makes decision 0 (the rule's round state and its
    decision before any draft; the carry's rule state is then None), which no host read has to see
    (`zero_decision`)."""
    def segment(cache, cap, eos, uniforms, carry):
        def step(cache, ids, hidden=False):
            return forward_rows(model, cache, ids, hidden)
        if decide_zero:
            tokens, qs, k, drafting, logits, hidden, _ = carry
            rule, stop = decide(policy, policy.round_state(drafting.shape[0], drafting.device), 0, drafting)
            carry = (tokens, qs, k, drafting & ~stop, logits, hidden, rule)
        return draft_positions(step, policy, cache, cap, eos, sampling, uniforms, carry, range(*bounds), width)
    return compiler.apply(segment, model, ("draft", rule_key(policy), sampling, bounds, width, decide_zero))


def zero_decision(policy, rows: int) -> bool | None:
    """Decision 0 of a round at `rows` rows when the host knows it without reading a tensor: False when no row
    can stop before drafting (a rule that does not decide at zero: whatever it computes there, the round is not
    ended before its first draft), True / False when the rule's decision 0 is one for every row at this batch
    size (`zero_stop`: its rows all start a round alike), else None (it must be computed and read)."""
    if not getattr(policy, "decides_at_zero", False):
        return False
    known = getattr(policy, "zero_stop", None)
    return known(rows) if known is not None else None


class EagleChainStep:
    """The drafting step of an EAGLE chain in `draft_positions`' shape, step(cache, y (B, 1), hidden): input
    (f^ of the previous position, y_k); its output f^ gives q_{k+1} and is the hidden state e_k a SpecDec++
    head reads. `feature` is set to f^ at the last committed token before each round."""

    def __init__(self, eagle_step):
        self.eagle_step = eagle_step
        self.feature: torch.Tensor | None = None

    def __call__(self, cache, ids, hidden=False):
        logits, pred = self.eagle_step(cache, self.feature[:, None], ids)
        self.feature = pred[:, -1]
        return logits, pred
