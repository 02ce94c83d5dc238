"""Lossless in bf16, honestly: whether a speculative decode that left the target's own greedy output did so on a
numerical near-tie or on a real error.

In fp32 greedy speculative output equals greedy autoregressive output token for token. In bf16 the target's own
greedy output depends on the shape of the step that computes it: a (K + 1)-row verify rounds its products
differently from a one-row step, so where two tokens' logits lie within that rounding of each other the two decodes
may pick different ones, and from there on continue different (equally valid) texts. Such a divergence is a
property of the target in bf16, not of the decoder. The batched decoder removes it on CPUs whose kernels compute
every width from some floor on alike (`width_classes` tells; `rounds.shapes.verify_floor` pads every target forward
to that floor): there its greedy outputs are equal by construction, and this judge is for every other decode (the
per-prompt decoder's DynamicCache steps, other machines, an engine). A bug (a verify that accepts a wrong draft, a
cache rolled back to the wrong length) also makes the outputs differ, at a token the target does not rank near its
top.

The test (`classify`), at the first token where the two decodes differ (`first_divergence`), from their common
prefix:
    z       the target's logits for that token computed in fp32 (its bf16 weights, widened: the same model
            without bf16's rounding of activations)
    z_s     the same row's logits in the target's own dtype at the shapes a decode computes it with: the whole
            prefix in one forward, and a step of w positions over the cache of the rest, for w = 1 (the
            autoregressive step) and w = K + 1 (the verify)
    delta   max over those shapes s and the vocabulary v of |z_s(v) - z(v)|: how far the dtype's rounding moved
            that row's logits
    gap     max_v z(v) - min(z(a), z(b)) for the two tokens a, b the decodes chose: how far below the fp32 top the
            lower of them lies (their top-2 gap when they are the fp32 top two)
The divergence is a near-tie when gap <= 2 delta. Why twice: a decode whose row logits are within delta of z picks
a token x whose z(x) is within 2 delta of z's maximum (z(x) >= z_x(x) - delta >= z_x(m) - delta >= z(m) - 2 delta,
m the fp32 argmax), so a divergence caused by rounding alone always passes, and one caused by a wrong token the
target ranks further down fails. delta is measured on these representative shapes, not replayed from each
decode's own history of shapes (a batched decode's cache was written by other widths), so it is an estimate of
the rounding, not its exact value; docs/decoder.md ("Lossless in bf16") says how it was tested.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch

from specdraft.decoding.rounds.packed_linear import unpack_linears
from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.rounds import kv
from specdraft.decoding.rounds.shapes import static_length
from specdraft.decoding.rounds.static_cache import forward_rows


@dataclass(frozen=True)
class Divergence:
    """Where two greedy decodes of one prompt first differ, and whether that was a numerical near-tie."""

    position: int  # index into the generated tokens
    speculative: int  # the token the speculative decode chose there
    autoregressive: int  # the target's own greedy choice there
    gap: float  # max_v z(v) - min(z(speculative), z(autoregressive)), z the fp32 logits
    delta: float  # the largest |bf16 logit - fp32 logit| of that row over the sampled shapes
    near_tie: bool  # gap <= 2 delta

    @property
    def bound(self) -> float:
        return 2.0 * self.delta


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where `a` and `b` differ (a token, or one ending before the other), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def judge(reference: torch.Tensor, shaped: Sequence[torch.Tensor], chosen: tuple[int, int]) -> tuple[float, float, bool]:
    """(gap, delta, near_tie) of one row (module docstring): `reference` the fp32 logits (V,), `shaped` the same row's
    logits at each sampled shape (V,) in the model's dtype, `chosen` the two decodes' tokens."""
    z = reference.double()
    delta = max(float((s.double() - z).abs().max()) for s in shaped)
    gap = float(z.max() - torch.minimum(z[chosen[0]], z[chosen[1]]))
    return gap, delta, gap <= 2.0 * delta


def row_logits(model: torch.nn.Module, prefix: list[int], width: int | None, rows: int = 1) -> torch.Tensor:
    """The logits (V,) `model` gives for the token after `prefix`: the whole prefix in one forward (width None), or
    a step over its last `width` tokens after the rest is cached; in a batch of `rows` copies of it (a product's
    kernel, and so its rounding, can change with the rows it multiplies: on an AMX Xeon a tiny Llama's logits
    came out bit-equal over steps of 1, 5 and 40 positions and 1-8 ulps apart over 9)."""
    device = kv.input_device(model)
    ids = torch.tensor([prefix] * rows, dtype=torch.long, device=device)
    cache = kv.new_cache()
    if width is not None and width < len(prefix):
        model(input_ids=ids[:, :-width], past_key_values=cache, use_cache=True, logits_to_keep=1)
        ids = ids[:, -width:]
    return model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float().cpu()


def fp32_copy(target: torch.nn.Module) -> torch.nn.Module:
    """The target widened to fp32 (its weights exactly, its activations no longer rounded), eval mode."""
    wide = copy.deepcopy(target)
    unpack_linears(wide)  # a packed bf16 layer takes bf16 inputs only
    return wide.float().eval()


@torch.inference_mode()
def classify(target: torch.nn.Module, prompt: list[int], speculative: Sequence[int], autoregressive: Sequence[int],
             verify_width: int, rows: int = 1, reference: torch.nn.Module | None = None) -> Divergence | None:
    """None when the two greedy decodes of `prompt` agree, else their first divergence judged (module docstring).
    verify_width: the speculative decode's widest verify, K + 1; rows: the batch the decodes ran in (the shapes
    are sampled alone and in a batch of that many). reference: `fp32_copy(target)` when the caller judges many
    prompts (made here otherwise). A decode that stopped (an end-of-turn token, or fewer tokens) where the other
    went on is not a near-tie: there is no pair of tokens to weigh."""
    i = first_divergence(speculative, autoregressive)
    if i is None:
        return None
    prefix = list(prompt) + list(autoregressive[:i])
    if i >= len(speculative) or i >= len(autoregressive):  # one decode stopped: no pair of tokens to weigh
        return Divergence(i, speculative[i] if i < len(speculative) else -1,
                          autoregressive[i] if i < len(autoregressive) else -1, float("inf"), 0.0, False)
    reference = fp32_copy(target) if reference is None else reference
    z = row_logits(reference, prefix, None)
    # one forward; the autoregressive step and the verify, alone and in a batch of `rows`
    shapes = [(None, 1)] + [(w, b) for w in (1, verify_width) for b in sorted({1, rows})]
    shaped = [row_logits(target, prefix, w, b) for w, b in shapes]
    gap, delta, near = judge(z, shaped, (speculative[i], autoregressive[i]))
    return Divergence(i, speculative[i], autoregressive[i], gap, delta, near)


def classify_all(target: torch.nn.Module, prompts: Sequence[Sequence[int]], decodes: Sequence[Sequence[int]],
                 references: Sequence[Sequence[int]], verify_width: int, rows: int = 1,
                 wide: dict | None = None) -> list[Divergence | None]:
    """classify() of every prompt's decode against its reference decode. The fp32 copy is made only once a
    divergence needs it (a 1.5B target's is 7 GB) and kept in `wide["fp32"]`, so a caller judging several sets
    passes one dict to every call."""
    wide = {} if wide is None else wide
    out = []
    for p, d, r in zip(prompts, decodes, references):
        if first_divergence(d, r) is not None and "fp32" not in wide:
            wide["fp32"] = fp32_copy(target)
        out.append(classify(target, list(p), d, r, verify_width, rows=rows, reference=wide.get("fp32")))
    return out


def width_classes(model: torch.nn.Module, ids: Sequence[int], widths: Sequence[int],
                  positions: int = 16) -> dict[int, int]:
    """Which decode widths compute a position's logits alike on this machine, in the model's dtype: the model's
    static-cache step (`forward_rows`, the batched decoder's) over the first len(ids) - positions tokens, then the
    last `positions` in blocks of each width (every row kept, as a verify whose drafts were all accepted: the cache
    each width writes is read by its next block). Returns width -> the smallest of `widths` whose logits at all those
    positions were equal bit for bit (its class). On an AMD EPYC with avx512_bf16 (torch 2.13) the Qwen pair's 0.5B
    in bf16 gave {1: 1, 2: 2, 3: 2, 4: 4, 5: 4, ..., 16: 4}: `verify_floor`'s 4."""
    ids = list(ids)
    if len(ids) <= positions:
        raise ValueError(f"width_classes needs more than {positions} ids (a context, then the positions compared)")
    start, compiler, device = len(ids) - positions, StepCompiler("none"), model.get_input_embeddings().weight.device
    seq = torch.tensor([ids], device=device)
    logits = {}
    with torch.inference_mode():
        for w in widths:
            cache = compiler.cache(model, 1, static_length(len(ids) + max(widths) + 2))  # as the decoder sizes it
            forward_rows(model, cache, seq[:, :start])
            cache.lengths += start
            rows = []
            for at in range(start, len(ids), w):
                block = seq[:, at:at + w]
                block = torch.nn.functional.pad(block, (0, w - block.shape[1]))  # the last block's filler
                rows.append(forward_rows(model, cache, block)[0][0, : min(w, len(ids) - at)].float())
                cache.lengths += w
            logits[w] = torch.cat(rows)
    return {w: next(v for v in widths if torch.equal(logits[v], logits[w])) for w in widths}
