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
       drafter forward, exactly as the batch-1 catch-up. An EAGLE-1 drafter instead writes its entries
       (f_j, x_{j+1}) for the positions the round committed, f_j from the verify forward's hidden states
       (its cache holds C - 1 entries; the prompt's come from the target's prefill)
    5. one `.cpu()` of per-row counts (k, n, dropped, active, done): the only host transfer
       (SpecDec++ adds one flag per draft step: whether any row still drafts, to end the round early)
Counts per row follow `decoding.rounds.lengths` exactly (Lemma 3.1: N_draft + N_target = N + N_discarded); a
finished row is masked and not counted, and once half the rows are done an eager decode drops them
(a copy of the caches; compiled steps keep their shapes). The prefills belong to the first round
(the target's over prompt[:-1], the drafter's over the prompt: its q_1), as in batch 1.
"""
from __future__ import annotations

import re
import time
import types
import weakref
from dataclasses import dataclass, field

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.policies.batch_length_ucb import LengthUCB, RowBandits
from specdraft.decoding.rounds.batch_verify import verify_greedy, verify_sampled
from specdraft.decoding.compat import check_head, check_pair, check_prompt
from specdraft.decoding.rounds.kv import input_device
from specdraft.decoding.metrics import GenerationMetrics, GenerationResult
from specdraft.decoding.speculators.eagle_model import EagleDrafter
from specdraft.decoding.rounds.sampling import SamplingConfig, probs
from specdraft.decoding.rounds.static_cache import RowStaticCache, eagle_rows, forward_rows
from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP

COMPILE_MODES = ("none", "default", "reduce-overhead")
GREEDY = SamplingConfig(temperature=0.0)
_CACHE_ROUND = 64  # cache lengths are rounded up so that calls of similar length share a cache (and a compile)


# ----------------------------------------------------------------------------------------------------
# compiled steps and reusable caches (gpt-fast style: compile the forward from outside, fixed shapes)

_steps: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()
_caches: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def model_step(model: torch.nn.Module, compile: str):
    """forward_rows bound to `model` (for an EAGLE drafter: `eagle_rows`, called with (cache, features,
    ids)), compiled once per (model, mode) and reused across calls. Each distinct width (1 and 2 for the
    drafter, W + 1 for the verify) is one graph. A compiled step holds its model for the life of the
    process (the point is compiling once); an eager one is made per call and holds nothing."""
    if isinstance(model, EagleDrafter):
        def step(cache, features, ids):
            return eagle_rows(model, cache, features, ids)
    else:
        def step(cache, ids, hidden=False):
            return forward_rows(model, cache, ids, hidden)
    if compile == "none":
        return step
    table = _steps.setdefault(model, {})
    if compile not in table:
        compiled = compile_for_model(step, model, compile)
        table[compile] = fresh_outputs(compiled) if compile == "reduce-overhead" else compiled
    return table[compile]


def compile_for_model(fn, model: torch.nn.Module, mode: str):
    """torch.compile of `fn`, a closure over `model` alone, with `compile_options` and the weights in the
    graph. dynamo keeps its graphs with the function's code object, which every closure of `fn` shares, and
    the guards kept (`argument_guards`) do not tell models apart: each model's function gets a code object
    of its own."""
    import torch._dynamo.config as dynamo_config
    # one graph per (width, batch size): the benchmark sweeps B, so allow more than the default 8
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 64)
    fn = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    device = model.get_input_embeddings().weight.device
    return weights_in_graph(torch.compile(fn, dynamic=False, options=compile_options(mode, device)))


def model_draft(model: torch.nn.Module):
    """`draft_round` with greedy picks and no stopping head (fixed K, length bandits), compiled per model
    into one graph per (width, batch size): the W - 1 drafter forwards and the picks and bookkeeping between
    them, which run eagerly as ~10 small ops per drafted token otherwise (no host transfer happens inside:
    only a head's stop check reads a flag). Called as draft(cache, q_logits, cap, plan, eos) -> (tokens, k).
    Always inductor's default mode, as the round's tails: its outputs are the round's state, which a CUDA
    graph's next replay would overwrite. Why: on the demo pair (batch 1, K = 4, compiled) a round made 6
    compiled calls (verify, tail, catch-up and 3 drafter steps), and the calls' own overhead and the eager
    ops between them were ~10% of its time (benchmarks/RESULTS.md, bench_batch_decoder)."""
    table = _steps.setdefault(model, {})
    if "draft" not in table:
        def draft(cache, q_logits, cap, plan, eos):
            def step(cache, ids, hidden=False):
                return forward_rows(model, cache, ids, hidden)
            drafts = draft_round(step, cache, q_logits, cap, plan, GREEDY, None, eos)
            return drafts.tokens, drafts.k
        table["draft"] = compile_for_model(draft, model, "default")
    return table["draft"]


def weights_in_graph(compiled):
    """Trace with the model's weights as constants of the graph (dynamo's `install_free_tensors`) rather
    than graph inputs that dynamo's code before each call gathers from the modules (~150 tensors for the
    demo target: 0.1-0.2 ms a call, 5% of its compiled one-token step). A config patch around the call,
    not a process-wide setting: dynamo reads it when it traces (the first call of each shape), and other
    compiles in the process keep their defaults."""
    import torch._dynamo.config as dynamo_config

    def step(*args):
        with dynamo_config.patch(install_free_tensors=True):
            return compiled(*args)
    return step


def compile_options(compile: str, device: torch.device) -> dict:
    """Inductor's options for `compile` (the mode's own settings), plus what keeps a small step's call
    overhead small. On the demo-shaped target's one-token step (16 x 128, CPU, 1 thread, variants
    interleaved in one process; eager 4.3 ms): the mode's defaults 2.76 ms, keeping only the guards on the
    step's arguments 2.30 ms, with the C++ wrapper as well 1.79-1.93 ms (a second run: 2.99 -> 2.25 ms).
    The C++ wrapper adds ~30-60 s to a first compile (inductor's cache keeps it for later processes).
      - guards: only those on the step's arguments (`argument_guards`)
      - cpp_wrapper on CPU: the generated code calls its kernels from C++ instead of Python. On a GPU,
        reduce-overhead's CUDA graphs already replay the kernels without the wrapper.
    Tried and left out (no gain beyond the spread here): inductor's freezing (with and without mkldnn
    weight prepacking) and max_autotune's CPU GEMM templates."""
    options = dict(torch._inductor.list_mode_options(compile))
    options["guard_filter_fn"] = argument_guards
    if device.type == "cpu":
        options["cpp_wrapper"] = True
    return options


def argument_guards(entries) -> list[bool]:
    """Dynamo's guards a compiled step keeps: those on its arguments (the cache's tensors and buffers, the
    input's shape, the `hidden` flag), which pick the graph for a width or a batch size. Dropped: the
    thousands of guards on the model (parameters, config, module attributes; the step's closure variable
    `model`) and on library globals, and the Python-level identity checks (a cache's layers point back at it), which cost
    more to evaluate than a small model's forward. Sound because a compiled step belongs to one model
    (`_steps` is keyed by it, and its code object is its own) that is not changed while it decodes."""
    return [not e.is_global and e.guard_type != "LAMBDA_GUARD" and re.search(r"\bmodel\b", e.name) is None
            for e in entries]


def fresh_outputs(compiled):
    """A CUDA-graph step: each call starts a new graph iteration, and its outputs are copied out of the
    graph's memory pool, which the next replay overwrites (the round reads q_1 from the catch-up after
    other steps ran). The copies are (B, T, V) and (B, T, H): small next to the forward."""
    def step(*args):
        torch.compiler.cudagraph_mark_step_begin()
        logits, states = compiled(*args)
        return logits.clone(), (states.clone() if states is not None else None)
    return step


def model_cache(model: torch.nn.Module, batch: int, max_len: int) -> RowStaticCache:
    """A RowStaticCache for (model, batch, max_len), reused across calls: its buffers keep their addresses
    (what compiled graphs and CUDA graphs were built against). A few shapes are kept per model."""
    table = _caches.setdefault(model, {})
    key = (batch, max_len)
    if key not in table:
        if len(table) >= 4:
            table.pop(next(iter(table)))
        weight = model.get_input_embeddings().weight
        config = model.body.config if isinstance(model, EagleDrafter) else model.config  # EAGLE: its own layers
        table[key] = RowStaticCache(config, batch, max_len, weight.dtype, weight.device, layer_devices(model))
    cache = table[key]
    cache.lengths.zero_()
    return cache


def layer_devices(model: torch.nn.Module) -> list[torch.device] | None:
    """The device of each decoder layer (a model placed by device_map spans several); None when the
    layers cannot be found (then every cache layer sits with the input embedding)."""
    base = model.body if isinstance(model, EagleDrafter) else (
        model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None))
    layers = getattr(base, "layers", None)
    if layers is None:
        return None
    devices = [next(layer.parameters()).device for layer in layers]
    return devices if len(devices) == len(layers) else None


# ----------------------------------------------------------------------------------------------------
# request checks

@dataclass
class Plan:
    width: int  # drafts per round at most (K, K_max, max length arm; 0 = autoregressive)
    head: torch.nn.Module | None = None
    threshold: float = 0.0
    bandit: LengthUCB | None = None
    eagle: bool = False  # the drafter is an EAGLE layer reading the target's features
    lockstep: bool = False  # SpecDec++ stops the whole batch on its rows' mean risk (LockstepSpecDecPP)
    eos: list[int] = field(default_factory=list)


def check_request(target, prompts, max_new_tokens, drafter, policy, sampling, eos_token_id, compile) -> Plan:
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise InputError("prompts must be a non-empty list of token-id lists; give at least one prompt")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise InputError(f"prompt {i} must be a list of integer token ids, got {type(prompt).__name__}")
        check_prompt(list(prompt), max_new_tokens, target, *([drafter] if drafter is not None else []))
    if not isinstance(sampling, SamplingConfig):
        raise InputError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
    if compile not in COMPILE_MODES:
        raise InputError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {compile!r}")
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
    if policy is None:
        if drafter is not None:
            raise InputError("a drafter was given without a policy; pass policy=FixedK(k), SpecDecPP(...) or LengthUCB(...)")
        return Plan(width=0, eos=eos)
    if drafter is None:
        raise InputError(f"policy {policy!r} needs a drafter; pass drafter=... or policy=None for autoregressive decoding")
    eagle = isinstance(drafter, EagleDrafter)
    if eagle and drafter.variant != "eagle1":
        raise InputError(f"the batched decoder drafts with EAGLE-1 chains; decode this {drafter.variant} drafter one "
                         "prompt at a time with generate_speculative (EagleSpeculator)")
    if not eagle and (not hasattr(drafter, "get_output_embeddings") or getattr(drafter, "config", None) is None):
        raise InputError(f"the batched decoder drafts with a causal LM or an EAGLE drafter, not {type(drafter).__name__}; "
                         "decode model-free speculators one prompt at a time with generate_speculative")
    check_pair(target, drafter)
    if isinstance(policy, FixedK):
        return Plan(width=policy.max_tokens, eos=eos, eagle=eagle)
    if isinstance(policy, SpecDecPP):
        if isinstance(policy.head, torch.nn.Module):
            check_head(policy.head, drafter)
        return Plan(width=policy.max_tokens, head=policy.head, threshold=policy.threshold, eos=eos, eagle=eagle,
                    lockstep=isinstance(policy, LockstepSpecDecPP))
    if isinstance(policy, LengthUCB):
        return Plan(width=policy.max_tokens, bandit=policy, eos=eos, eagle=eagle)
    raise InputError(f"the batched decoder supports FixedK, SpecDecPP and LengthUCB policies, not {policy!r}; "
                     "decode other speculators one prompt at a time with generate_speculative")


# ----------------------------------------------------------------------------------------------------
# one round's pieces

def right_pad(prompts, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L_max) ids right-padded with 0 and (B,) lengths: slot = position from each row's first token."""
    lengths = [len(p) for p in prompts]
    ids = torch.zeros(len(prompts), max(lengths), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(p, dtype=torch.long)
    return ids.to(device), torch.tensor(lengths, dtype=torch.long, device=device)


def pick(logits: torch.Tensor, sampling: SamplingConfig, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, V) logits -> (token (B,), q (B, V) or None under greedy)."""
    if sampling.greedy:
        return logits.argmax(-1), None
    q = probs(logits, sampling)
    return torch.multinomial(q, 1, generator=generator).squeeze(1), q


def head_sigma(head, hidden: torch.Tensor) -> torch.Tensor:
    param = next(head.parameters(), None) if isinstance(head, torch.nn.Module) else None
    if param is not None:
        hidden = hidden.to(device=param.device, dtype=param.dtype)
    return torch.sigmoid(head(hidden).float()).reshape(hidden.shape[0]).to(hidden.device)


@dataclass
class Drafts:
    tokens: torch.Tensor  # (B, W) long, zero past k
    q: torch.Tensor | None  # (B, W, V) sampled-from distributions (None under greedy)
    k: torch.Tensor  # (B,) candidates drafted per row
    steps: int  # positions drafted by the batch (max k; W when no early exit)


def draft_round(step, cache: RowStaticCache, q_logits: torch.Tensor, cap: torch.Tensor, plan: Plan,
                sampling: SamplingConfig, generator, eos: torch.Tensor | None) -> Drafts:
    """Draft up to cap[b] tokens per row in SpecDec++ Alg. 1 order. q_logits (B, V): the logits behind
    q_1 (from the catch-up). The drafter cache advances by the tokens fed (y_1..y_{k-1})."""
    B, W = cap.shape[0], plan.width
    tokens = torch.zeros(B, W, dtype=torch.long, device=cap.device)
    qs = None if sampling.greedy else torch.zeros(B, W, q_logits.shape[-1], device=cap.device)
    k = torch.zeros(B, dtype=torch.long, device=cap.device)
    drafting = cap > 0
    p_hat = torch.ones(B, dtype=torch.float64, device=cap.device)
    logits, hidden, steps = q_logits, None, 0
    for i in range(W):
        if plan.head is not None and i > 0 and not bool(drafting.any()):
            break  # every row stopped: end the round early (one flag to the host per step)
        y, q = pick(logits, sampling, generator)
        tokens[:, i] = torch.where(drafting, y, 0)
        if qs is not None:
            qs[:, i] = q
        k += drafting
        steps = i + 1
        go_on = drafting & (k < cap)
        if eos is not None:
            go_on &= ~torch.isin(y, eos)  # drafting past EOS is wasted work
        if plan.head is not None and hidden is not None:  # decision i + 1 reads e_i
            p_hat = p_hat * head_sigma(plan.head, hidden).double()
            risk = 1.0 - p_hat
            if plan.lockstep:  # the mean risk of the rows that would go on decides for all of them
                risk = (risk * go_on).sum() / go_on.sum().clamp_min(1)
            go_on &= ~(risk > plan.threshold)
        drafting = go_on
        if i == W - 1:
            break  # y_W is never fed in its own round
        out, states = step(cache, y[:, None], plan.head is not None)
        logits = out[:, -1]
        hidden = states[:, -1] if states is not None else None
        cache.lengths += drafting  # rows that stopped keep their length: the slot just written is stale
    return Drafts(tokens=tokens, q=qs, k=k, steps=steps)


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


_tails: dict[str, tuple] = {}


def round_tails(compile: str) -> tuple:
    """(commit_round, verify_commit_greedy), compiled unless compile is "none"; always in inductor's
    default mode: their outputs are the decode's state, which no CUDA graph may own (a replay would
    overwrite it)."""
    if compile == "none":
        return commit_round, verify_commit_greedy
    if "compiled" not in _tails:
        options = {"guard_filter_fn": argument_guards}
        _tails["compiled"] = (torch.compile(commit_round, dynamic=False, options=options),
                              torch.compile(verify_commit_greedy, dynamic=False, options=options))
    return _tails["compiled"]


def prefill_width(length: int) -> int:
    """The width a compiled prefill runs at for prompts of at most `length` tokens: the next power of two,
    at least 16, so a few graphs serve every prompt length (each width compiles once). Measured on the demo
    target (batch 1, one thread, 48-token decodes of ~40-token prompts): its eager prefill was ~10 of
    ~130 ms per compiled autoregressive decode."""
    return max(16, 1 << (length - 1).bit_length())


def verify_width(steps: int, width: int) -> int:
    """The drafts a compiled round verifies: the positions drafted (`steps`, the longest row's) rounded up
    to a power of two, at most the policy's `width`. A few fixed shapes (0, 1, 2, 4, ..., W) instead of
    one per length, and a round whose rows all stopped early (SpecDec++, short length arms) does not pay
    for W + 1 positions (measured on the demo pair before: compiled SpecDec++ at K_max = 8 ran at 0.87x
    autoregressive at batch 1, verifying 9 positions per round for rounds of 2.7 tokens)."""
    return 0 if steps == 0 else min(width, 1 << (steps - 1).bit_length())


class EagleChainStep:
    """The drafting step of an EAGLE chain in `draft_round`'s shape, step(cache, y (B, 1), hidden): input
    (f^ of the previous position, y_k); its output f^ gives q_{k+1} and is the hidden state e_k a SpecDec++
    head reads. `feature` is set to f^ at the last committed token before each round."""

    def __init__(self, eagle_step):
        self.eagle_step = eagle_step
        self.feature: torch.Tensor | None = None

    def __call__(self, cache, ids, hidden=False):
        logits, pred = self.eagle_step(cache, self.feature[:, None], ids)
        self.feature = pred[:, -1]
        return logits, pred


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
    feature: torch.Tensor | None = None  # EAGLE: (rows, H) the predicted feature f^ at the last committed token

    def select(self, keep: torch.Tensor) -> "RowState":
        return RowState(**{name: (value[keep] if value is not None else None) for name, value in vars(self).items()})


def gather_row(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x (B, T), index (B,) -> x[b, index[b]]."""
    return x.gather(1, index[:, None]).squeeze(1)


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
    compile: str = "none",
) -> list[GenerationResult]:
    """Decode every prompt; one GenerationResult per prompt, in order. policy: FixedK(k),
    SpecDecPP(head, threshold, k_max) (each row stops alone), LockstepSpecDecPP (the same arguments; the
    batch stops together), LengthUCB(lengths) (needs `drafter`), or None for batched autoregressive
    decoding. Greedy output equals each prompt decoded alone; sampled output follows the target
    distribution under `sampling`. Sampling draws from a generator on the target's device seeded with
    `seed`. compile: "default" / "reduce-overhead" wrap the drafter step and the verify forward with
    torch.compile (the drafts verified padded to a power of two up to K_max, the prompts prefilled padded
    to a power of two: a few fixed shapes); the first call of each shape pays its compilation. Times in
    the metrics are the batch's wall time, shared by its rows."""
    plan = check_request(target, prompts, max_new_tokens, drafter, policy, sampling, eos_token_id, compile)
    start = time.perf_counter()
    device = input_device(target)
    B, W = len(prompts), plan.width
    ids, plens = right_pad(prompts, device)
    longest = ids.shape[1]
    if compile != "none":  # the prefills run compiled too, at a few padded widths (`prefill_width`)
        ids = torch.nn.functional.pad(ids, (0, prefill_width(longest) - longest))
    max_len = -(-(ids.shape[1] + max_new_tokens + W + 2) // _CACHE_ROUND) * _CACHE_ROUND
    generator = torch.Generator(device=device).manual_seed(seed)
    eos = torch.tensor(plan.eos, dtype=torch.long, device=device) if plan.eos else None

    tcache = model_cache(target, B, max_len)
    target_step = model_step(target, compile)
    features = None
    if longest > 1:  # the target never holds the last committed token (it goes out with the drafts)
        # eager: the prompt less its last token; compiled: the padded width (what it writes past a row's
        # length is rolled back below and overwritten before any query can see it)
        features = target_step(tcache, ids if compile != "none" else ids[:, :-1], plan.eagle)[1]
    tcache.rollback(plens - 1)
    last = gather_row(ids, plens - 1)
    prev = gather_row(ids, (plens - 2).clamp_min(0))
    q_logits = feature = eagle_step = None
    if drafter is not None:
        if plan.eagle:
            drafter.attach_target(target)
        dcache = model_cache(drafter, B, max_len)
        drafter_step = model_step(drafter, compile)
        if plan.eagle:
            # EAGLE entry j is (f_j, x_{j+1}) at position j: the prompt's entries 0..L-2 from the target's
            # prefill features; a one-token prompt has none yet and drafts nothing in its first round
            eagle_step = EagleChainStep(drafter_step)
            hidden = drafter.config.hidden_size
            if features is not None:
                logits, pred = drafter_step(dcache, features[:, : ids.shape[1] - 1], ids[:, 1:])
                at = (plens - 2).clamp_min(0)
                q_logits = logits.gather(1, at[:, None, None].expand(-1, 1, logits.shape[-1])).squeeze(1)
                feature = pred.gather(1, at[:, None, None].expand(-1, 1, hidden)).squeeze(1)
            else:
                q_logits = torch.zeros(B, target.config.vocab_size, device=device)
                feature = torch.zeros(B, hidden, device=device, dtype=drafter.fc.weight.dtype)
            dcache.rollback(plens - 1)
        else:
            prefill = drafter_step(dcache, ids)[0]  # (B, L_max, V)
            q_logits = prefill.gather(1, (plens - 1)[:, None, None].expand(-1, 1, prefill.shape[-1])).squeeze(1)
            dcache.rollback(plens)
    # compiled greedy drafting without a head: the whole draft loop is one graph (`model_draft`)
    fused = compile != "none" and drafter is not None and sampling.greedy and plan.head is None and not plan.eagle
    fused_draft = model_draft(drafter) if fused else None
    bandits = RowBandits(plan.bandit, B, device) if plan.bandit is not None else None
    commit, greedy_tail = round_tails(compile)

    out = torch.zeros(B, max_new_tokens + W + 2, dtype=torch.long, device=device)
    state = RowState(origin=torch.arange(B, device=device), last=last, prev=prev, plens=plens,
                     n_out=torch.zeros(B, dtype=torch.long, device=device),
                     done=torch.zeros(B, dtype=torch.bool, device=device),
                     q_logits=q_logits, feature=feature)
    row_ids = list(range(B))  # the original index of each current row (finished rows may be dropped)
    metrics = [GenerationMetrics() for _ in range(B)]
    finished = [False] * B
    while True:
        rows = len(row_ids)
        # -- draft
        cap = (max_new_tokens - state.n_out - 1).clamp_min(0)  # leave room for the token every round emits
        if bandits is not None:
            cap = torch.minimum(cap, bandits.select(generator))
        else:
            cap = cap.clamp_max(W)
        cap = torch.where(state.done, 0, cap)
        if plan.eagle:  # no EAGLE entries before the first committed position: no draft
            cap = torch.where(state.plens + state.n_out >= 2, cap, 0)
            eagle_step.feature = state.feature
        if W and fused_draft is not None:
            tokens, k = fused_draft(dcache, state.q_logits, cap, plan, eos)
            drafts = Drafts(tokens=tokens, q=None, k=k, steps=W)
        elif W:
            drafts = draft_round(eagle_step or drafter_step, dcache, state.q_logits, cap, plan, sampling, generator, eos)
        else:
            drafts = Drafts(tokens=torch.zeros(rows, 0, dtype=torch.long, device=device), q=None,
                            k=torch.zeros(rows, dtype=torch.long, device=device), steps=0)
        width = verify_width(drafts.steps, W) if compile != "none" else drafts.steps
        tokens = drafts.tokens[:, :width]
        # -- verify and commit
        logits, verified = target_step(tcache, torch.cat([state.last[:, None], tokens], dim=1), plan.eagle)  # (rows, width + 1, V)
        committed_before = state.plens + state.n_out
        rest = (state.n_out, state.done, state.last, state.prev, tcache.lengths, out, state.origin, eos, max_new_tokens)
        if sampling.greedy:
            n, emitted, count, active, *advanced, stats = greedy_tail(logits, tokens, drafts.k, *rest)
        else:
            q = drafts.q[:, :width] if drafts.q is not None else logits.new_zeros(rows, 0, logits.shape[-1])
            n, extra = verify_sampled(probs(logits, sampling), q.float(), tokens, drafts.k, generator)
            emitted, count, active, *advanced, stats = commit(tokens, drafts.k, n, extra, *rest)
        state.n_out, state.done, state.last, state.prev, tcache.lengths = advanced
        if bandits is not None:
            bandits.update(n, drafts.k, active)
        if plan.eagle:  # entries (f_j, x_{j+1}) for the positions this round committed, from the verify's features
            dcache.rollback(committed_before - 1)
            logits, pred = drafter_step(dcache, verified, emitted)
            at = (count - 1).clamp_min(0)
            state.q_logits = logits.gather(1, at[:, None, None].expand(-1, 1, logits.shape[-1])).squeeze(1)
            state.feature = pred.gather(1, at[:, None, None].expand(-1, 1, pred.shape[-1])).squeeze(1)
            dcache.lengths += count
        elif drafter is not None:  # launched before the host transfer so the device keeps working
            dcache.rollback(state.plens + state.n_out - 2)
            state.q_logits = drafter_step(dcache, torch.stack([state.prev, state.last], dim=1))[0][:, -1]
            dcache.lengths += 2
        # -- the one host transfer of the round
        stats = stats.cpu().tolist()
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
        if all(finished):
            break
        live = [i for i, b in enumerate(row_ids) if not finished[b]]
        if compile == "none" and len(live) <= rows // 2:
            # half the rows are done: drop them (a copy of the caches), so they stop costing work; compiled
            # steps keep the batch (a new batch size would be a new graph)
            keep = torch.tensor(live, device=device)
            row_ids = [row_ids[i] for i in live]
            state = state.select(keep)
            tcache = tcache.select_rows(keep)
            if drafter is not None:
                dcache = dcache.select_rows(keep)
            if bandits is not None:
                bandits.select_rows(keep)
    tokens_out = out.cpu().tolist()
    elapsed = time.perf_counter() - start
    results = []
    for b in range(B):
        m = metrics[b]
        m.time_total = elapsed
        results.append(GenerationResult(tokens=tokens_out[b][: m.n_generated], metrics=m))
    return results
