"""What one drafter token and one (K+1)-token verification cost, in units of one target token.

Speculative decoding pays only when the drafter is cheap (c = t_draft / t_target small) and the
target's verification of K drafted tokens plus the bonus position costs little more than one token
(v = t_verify(K+1) / t_target near 1). The expected speedup of a fixed-K round is
E[tokens per round] / (K c + v) (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", Theorem 3.8 with v in place of 1), so the demo world is only a fair showcase
if c and v are measured on the machine that decodes, with the cache and thread count the decoder uses.

`measure_forward_costs` times cached forwards through `decoding.kv` (the decoder's own call), at a
fixed context, interleaving the three kinds of call so a shared machine's load drifts into all of
them alike, and reports medians with the interquartile spread. It also reports the same ratios in
process CPU time, which a busy shared machine inflates far less than wall time (a process waiting for
a core accrues none); with one thread and a quiet machine the two agree.
"""
from __future__ import annotations

import time

import torch

from decoding import kv


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    s = sorted(xs)
    n = len(s)
    return s[n // 4], s[n // 2], s[(3 * n) // 4]


@torch.no_grad()
def measure_forward_costs(target, drafter, k: int = 4, context: int = 120, reps: int = 30, seed: int = 0) -> dict:
    """Median wall time of a cached forward of 1 target token, 1 drafter token and K+1 target tokens
    after `context` tokens of cache, and the ratios c = t_draft / t_target, v = t_verify / t_target.

    Each rep runs the three calls in turn and rolls the caches back, so every call sees the same context.
    """
    if k < 1 or context < 1 or reps < 3:
        raise ValueError(f"need k >= 1, context >= 1, reps >= 3; got k={k}, context={context}, reps={reps}")
    g = torch.Generator().manual_seed(seed)
    vocab = min(target.config.vocab_size, drafter.config.vocab_size)
    prefix = torch.randint(3, vocab, (context,), generator=g).tolist()
    block = torch.randint(3, vocab, (k + 1,), generator=g).tolist()
    t_cache, d_cache = kv.new_cache(), kv.new_cache()
    kv.forward(target, t_cache, prefix)
    kv.forward(drafter, d_cache, prefix)
    runs = {"target": [], "drafter": [], "verify": []}
    cpu = {"target": [], "drafter": [], "verify": []}
    sync = torch.cuda.is_available() and kv.input_device(target).type == "cuda"
    for rep in range(reps + 2):  # the first two reps warm up allocators and are dropped
        for name, model, cache, ids in (("target", target, t_cache, block[:1]), ("drafter", drafter, d_cache, block[:1]),
                                        ("verify", target, t_cache, block)):
            t0, c0 = time.perf_counter(), time.process_time()
            kv.forward(model, cache, ids, last=len(ids))
            if sync:
                torch.cuda.synchronize()
            elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - c0
            kv.crop(cache, context)
            if rep >= 2:
                runs[name].append(elapsed)
                cpu[name].append(cpu_s)
    q = {name: _quartiles(ts) for name, ts in runs.items()}
    t_target, t_draft, t_verify = q["target"][1], q["drafter"][1], q["verify"][1]
    cpu_target, cpu_draft, cpu_verify = (_quartiles(cpu[n])[1] for n in ("target", "drafter", "verify"))
    return {
        "k": k, "context": context, "reps": reps, "threads": torch.get_num_threads(),
        "t_target_ms": round(t_target * 1e3, 4), "t_draft_ms": round(t_draft * 1e3, 4),
        "t_verify_ms": round(t_verify * 1e3, 4),
        "iqr_ms": {name: [round(lo * 1e3, 4), round(hi * 1e3, 4)] for name, (lo, _, hi) in q.items()},
        "c": round(t_draft / t_target, 4), "v": round(t_verify / t_target, 4),
        "cpu_ms": {"target": round(cpu_target * 1e3, 4), "drafter": round(cpu_draft * 1e3, 4),
                   "verify": round(cpu_verify * 1e3, 4)},
        "c_cpu": round(cpu_draft / cpu_target, 4) if cpu_target > 0 else None,
        "v_cpu": round(cpu_verify / cpu_target, 4) if cpu_target > 0 else None,
    }


def forward_cost_lines(costs: dict | None) -> list[str]:
    """The report's paragraph on c and v (empty when the run did not measure them)."""
    if not costs:
        return []
    return ["## Forward costs on this machine (measured in this run)", "",
            f"Cached forwards after {costs['context']} tokens of context, {costs['threads']} thread(s), median of "
            f"{costs['reps']} interleaved reps: target {costs['t_target_ms']:.3f} ms/token, drafter "
            f"{costs['t_draft_ms']:.3f} ms/token, verifying K+1 = {costs['k'] + 1} tokens {costs['t_verify_ms']:.3f} ms. "
            f"So c = t_draft / t_target = {costs['c']:.3f} and v = t_verify / t_target = {costs['v']:.3f}; a fixed-K "
            f"round costs K c + v target tokens. In process CPU time (less sensitive to a busy machine): "
            f"c = {costs['c_cpu']}, v = {costs['v_cpu']}.", ""]
