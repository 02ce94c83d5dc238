"""The shapes of a round and of a decode's caches, the arithmetic the loop runs at and the cost model prices:
the widths a compiled round verifies and prefills at, the segments its draft graphs cover, the drafter feeds a
round runs, and the static cache lengths a decode allocates. Plain integers from a policy's width and whether it
reads a head (`max_tokens`, `needs_hidden`): below both the batched loop (decoding/batched.py) and the policies
that price its rounds (decoding/policies/), so neither imports the other for them.
"""
from __future__ import annotations

CACHE_ROUND = 64  # cache lengths are rounded up so that calls of similar length share a cache (and a compile)

# Compiled drafting under a stopping head runs a round in segments, one graph each, the first of this many
# positions and each later one as long as all before it ([0, 4), [4, 8), [8, 16), ...: `segments`), with one
# host read after each segment (whether any row still drafts, and the longest row's drafts): the head's stop is
# a tensor inside the graph, the round ends at the first segment after which no row drafts. A stop inside a
# segment wastes the drafter forwards left in it (masked; never counted): doubling keeps that waste, past the
# first segment, below the drafts already made, and a round's graph calls to log2 (segments of 4 made a
# 16-draft round call four graphs). Scratch runs on the demo pair (SpecDec++, K_max = 16, batch 1, compiled,
# 9-11 interleaved passes, the median per-pass ratio to fixed K = 16): greedy (D4_w3, h = 0.7; rounds stopped
# anywhere in 1..16) 0.911 against 0.887 in segments of 4, 0.853 in 2, 2, 4, 8 and 0.849 in one graph of 16;
# T = 0.7 (D1_w3, h = 0.9; rounds mostly of 16) 0.988 / 1.009 against 0.982 / 0.948 in two runs, within the
# spread. At K_max = 8 the two plans are one. Four first, not two: on the demo pair compiled at batch 1
# (inductor, CPU), K_max = 8, h = 0.7, a round cost +12.8% over fixed K = 8's in segments of 2, +8.3% in
# segments of 4 and +9.2% in one graph of 8 (one noisy run, 5 passes each; a profile put a segment's call at
# ~0.15 ms of a ~6.5 ms round, a drafter step at ~0.16 ms). Tried since and left out: a rule choosing per batch
# size between these segments and one graph of K_max, from a profiled price of a second graph (0.12-0.35 ms at
# B = 1 / 2): one graph ran 615 / 903 tokens/s against segments' 625 / 913 at B = 1 / 2 (one process, 11
# interleaved passes), as the stops a segment boundary allows save more than its call costs.
HEAD_SEGMENT = 4


def segments(width: int, policy) -> list[tuple[int, int]]:
    """A compiled round's draft graphs: one over all positions for a rule without a head (it never ends a
    round early for the whole batch), else `HEAD_SEGMENT` positions and then segments as long as all before
    them: [0, 4), [4, 8), [8, 16), [16, 32), the last one cut at `width`."""
    if not policy.needs_hidden:
        return [(0, width)]
    bounds, start = [], 0
    while start < width:
        end = min(width, max(HEAD_SEGMENT, 2 * start))
        bounds.append((start, end))
        start = end
    return bounds


def round_feeds(policy, steps: int, compiled: bool) -> int:
    """The drafter's width-1 forwards (feeds of y_i) a round runs beyond its catch-up when its longest row
    drafted `steps` positions of the policy's W: eagerly steps - 1 (no feed after the last decision; W - 1 at
    most). Compiled, a draft graph runs every position of its segment (`segments`) and feeds each but the
    round's last (W - 1): a rule without a head drafts all W in one graph; a rule with a head stops between
    its `segments`, so a stop inside one still pays its remaining feeds (steps = 3 of W = 8: 4; 9 of 16: 15)."""
    if steps <= 0:
        return 0
    width = policy.max_tokens
    if not compiled:
        return min(steps, width) - 1
    end = next(end for _, end in segments(width, policy) if steps <= end) if steps < width else width
    return end if end < width else width - 1


def prefill_width(length: int) -> int:
    """The width a compiled prefill runs at for prompts of at most `length` tokens: the next power of two,
    at least 16, so a few graphs serve every prompt length (each width compiles once). Measured on the demo
    target (batch 1, one thread, 48-token decodes of ~40-token prompts): its eager prefill was ~10 of
    ~130 ms per compiled autoregressive decode."""
    return max(16, 1 << (length - 1).bit_length())


def prefill_positions(longest: int, compile: str) -> int:
    """The positions per row a call's prefill runs at when its longest prompt is `longest` tokens (the batch is
    right-padded to it): compiled, `prefill_width`'s power of two, so a call's start steps up at 65, 129, ...
    tokens (on the demo target, B = 8: a batch whose longest prompt was 68 tokens paid ~2x the prefill of one
    whose longest was 52, which scaling by the length put at 1.3x); eager, the length itself."""
    return longest if compile == "none" else prefill_width(longest)


# The fewest rows (batch rows x positions) a target forward of a decode runs at in bf16 on a CPU (`verify_floor`).
HALF_CPU_FLOOR = 4


def verify_floor(dtype: str, device_type: str, rows: int = 1) -> int:
    """The fewest positions per row a decode's target forwards run at when `rows` rows are live (a round's verify,
    a plain AR step and the prefill are padded with filler up to it; nothing reads the filler's logits, and what it
    writes in the cache lies past every row's length, overwritten before any query sees it): in bf16 on a CPU
    enough for the forward to hold 4 rows of positions, ceil(4 / rows) (4 at batch 1, 2 at 2, 1 from 4 on); else 1.

    Why: this CPU's bf16 kernels compute a row at one query position, at two or three and at four or more in three
    different ways (on an AMD EPYC with avx512_bf16 under torch 2.13, SmolLM2-135M's and the Qwen pair's logits at
    widths 4 to 16 are equal bit for bit, at 1 and at 2-3 not: `near_ties.width_classes`, printed by
    benchmarks/real/bench_bf16_equality.py), so at batch 1 a one-token AR step and a (K + 1)-token verify round a
    token's logits differently and greedy outputs part where two tokens nearly tie (4 of 16 held-out prompts at 64
    tokens on the Qwen pair's 0.5B). At four or more positions every step computes a position alike, and with the
    cache's length the same for every K (`drafts_reserved`) greedy speculative output equals greedy AR output by
    construction. Counted in rows, not positions a row: past a few rows a product's kernel is chosen by the rows it
    multiplies (a packed 8960 -> 1536 projection rounded 32 rows otherwise than 1 on an Intel Xeon with AMX), so at
    batch 8 a floor of 4 positions a row (32 rows) buys no equality over 1 (8 rows). Checked by hand on the Xeon with
    AMX (2 threads, packed): on Qwen2.5-Coder-0.5B, 8 chat prompts x 48 tokens, K = 4 against AR in the same batch
    was 7 of 8 rows equal either way, at batch 2 and 4 every row; AR's wall time fell 1.3-1.5x at 1 (SmolLM2: 2.6
    against 1.7 s). The benchmarked effect is distill-data's (training/bench_distill_speed.py, batch 32). fp32 keeps 1: a
    4-position step costs ~1.8-2 one-position ones there, and fp32's rounding leaves greedy outputs equal."""
    if dtype == "bfloat16" and device_type == "cpu":
        return -(-HALF_CPU_FLOOR // max(1, rows))
    return 1


def drafts_reserved(width: int, floor: int) -> int:
    """The cache slots a decode reserves for a round beyond its prompt and new tokens (`decode_cache_length`'s
    max_drafts): the policy's width; under a verify floor (`verify_floor` > 1 at one row) CACHE_ROUND - 2 whatever the width
    (when the width fits in it), so that AR and every K up to 62 decode over a cache of the same length. Attention's
    sum over the keys runs over the whole cache, masked, and its blocking follows the cache's length: on the Qwen
    pair's 1.5B in bf16, AR over a 256-slot cache and K = 4 over a 320-slot one parted at a prompt's 4th token."""
    return max(width, CACHE_ROUND - 2) if floor > 1 else width


def verify_width(steps: int, width: int) -> int:
    """The drafts a compiled round verifies: the positions drafted (`steps`, the longest row's) rounded up
    to a power of two, at most the policy's `width`. A few fixed shapes (0, 1, 2, 4, ..., W) instead of
    one per length, and a round whose rows all stopped early (SpecDec++, short length arms) does not pay
    for W + 1 positions (on the demo pair, compiled SpecDec++ at K_max = 8 yields 2.7 tokens a round at batch
    1: verifying 9 positions for each makes it slower than autoregressive decoding)."""
    return 0 if steps == 0 else min(width, 1 << (steps - 1).bit_length())


def decode_cache_length(longest: int, new_tokens: int, max_drafts: int, compile: str) -> int:
    """The static cache slots a decode allocates: its longest prompt, the new tokens, a round's drafts and two
    more, rounded up (`static_length`); compiled, at least the padded prefill's width, whose every position the
    prefill writes. Sized from the longest prompt, not from the padded width plus the new tokens: the padding
    is never read (rows attend up to their own length), and each step attends over every slot (compiled, B = 16
    on the demo target, a batch with a 68-token prompt prefilled 128 wide: a one-token step over the 192 slots
    that width plus the new tokens would give takes 11.3 ms, against 9.0 over the 128 that suffice)."""
    need = longest + new_tokens + max_drafts + 2
    return static_length(need if compile == "none" else max(need, prefill_width(longest)))


def static_length(tokens: int) -> int:
    """A static cache's length for `tokens` slots, rounded up (`CACHE_ROUND`)."""
    return -(-tokens // CACHE_ROUND) * CACHE_ROUND
