"""Timing several methods on a shared machine so that its load hits them alike.

Every timed call goes through `decoding.timing.timed_call` (this process's CPU time on a CPU, CUDA events on a GPU,
wall time beside it). The methods take turns: within a pass each unit (a prompt, a batch of prompts) is decoded by
every method back to back, the order turning by one each unit and pass (`rotated`), after one untimed warm-up
call of each (a compiled method builds its graphs there). A ratio of two methods is then taken within a pass or
over the same units, where a slow phase of the box cancels.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.timing import timed_call

REPO = Path(__file__).resolve().parents[2]


def rotated(names: Sequence, turn: int) -> list:
    """`names` starting at position `turn` (modulo their count): the order of a pass's turn, so that no method
    always runs first (right after another method's cache-cold work) or last."""
    names = list(names)
    turn %= len(names)
    return names[turn:] + names[:turn]


def interleave(fns: dict, units: list, runs: int, device: str, seeded: bool = False) -> tuple[dict, dict]:
    """Methods timed unit by unit: for each unit (a batch of prompts), every method's call on it, back to back,
    the order turning by one each unit and pass. First one untimed call of each method on each unit (the
    warm-up; compiled, its graphs), then `runs` passes. fns: {name: fn(unit, seed)}. Returns ({name: [[seconds
    per unit] per pass]}, {name: [[output per unit] per pass]}).
    Why by unit: this box's load moves within seconds. A pass that runs each method over all units before the
    next puts seconds between two methods' decodes of the same prompts (B = 1 on 16 prompts: ~2.5 s a method), and
    their per-pass ratio spanned 0.49-1.31 in one run; by unit, they are a decode apart.
    seeded: pass i calls with seed = i (sampled decodes: one seed would repeat one draw of every method's tokens,
    and a method's MAT then moves by a draw's luck: at T = 0.7 on the demo pair, K = 8's MAT over seeds 0..7 was
    6.4-7.7 and K = 16's 8.3-10.9, more than the methods differ by), and the warm-up decodes every seed a pass
    will: a compiled decode builds a graph the first time a round needs its width, and a seed the warm-up did not
    draw may round differently (SpecDec++ at T = 0.7, batch 1, compiled: one pass at 49-79 tokens/s against ~700
    when only seed 0 was warmed). Not seeded: every call gets seed 0."""
    seeds = range(runs) if seeded else [0]
    for unit in units:
        for fn in fns.values():
            for seed in seeds:
                fn(unit, seed)
    names = list(fns)
    times: dict[str, list[list[float]]] = {name: [[] for _ in range(runs)] for name in names}
    out: dict[str, list[list]] = {name: [[] for _ in range(runs)] for name in names}
    for run in range(runs):
        for u, unit in enumerate(units):
            for name in rotated(names, run * len(units) + u):
                result, t = timed_call(lambda: fns[name](unit, run if seeded else 0), device)
                out[name][run].append(result)
                times[name][run].append(t.time)
    return times, out


def warm_then_interleave(fns: dict, runs: int, device: str, seeded: bool = False) -> tuple[dict[str, list[float]], dict]:
    """`interleave` with one unit: fns {name: fn() or, seeded, fn(seed=...)} -> ({name: [seconds per pass]},
    {name: [each pass's output]})."""
    calls = {name: (lambda unit, seed, fn=fn: fn(seed=seed) if seeded else fn()) for name, fn in fns.items()}
    times, out = interleave(calls, [None], runs, device, seeded)
    return ({name: [t for (t,) in ts] for name, ts in times.items()},
            {name: [o for (o,) in os_] for name, os_ in out.items()})


def interleaved(fns: dict, runs: int, device: str) -> dict:
    """Each fn once to warm up, then `runs` passes over all of them in turn (interleaved, so load phases
    hit every method alike). Returns name -> (median robust seconds, median wall seconds, last result)."""
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    out = {}
    for _ in range(runs):
        for name, fn in fns.items():
            out[name], t = timed_call(fn, device)
            times[name].append(t)
    return {name: (statistics.median(t.time for t in ts), statistics.median(t.wall for t in ts), out[name])
            for name, ts in times.items()}


def fastest_total(per_pass: list[list[float]]) -> float:
    """Seconds of one pass made of each unit's fastest time over the passes (`interleave`'s [[seconds per unit]
    per pass]): the least-disturbed estimate where every pass does the same work (greedy)."""
    return sum(map(min, zip(*per_pass)))


def compile_times(methods: dict, device: str) -> dict[str, float]:
    """The first call of each method, timed alone: the compilation (plus one decode)."""
    return {name: timed_call(fn, device)[1].wall for name, fn in methods.items()}


def median_times(calls: dict, reset: Callable[[], object], reps: int, device: str, warmup: int = 5) -> dict:
    """name -> median robust seconds of `call()` over `reps` calls after `warmup` untimed ones, the calls
    alternating one by one (a load phase hits all alike), `reset()` (the cache back to its context) before
    each."""
    times: dict = {name: [] for name in calls}
    for i in range(reps + warmup):
        for name, call in calls.items():
            reset()
            _, t = timed_call(call, device)
            if i >= warmup:
                times[name].append(t.time)
    return {name: statistics.median(ts) for name, ts in times.items()}


@torch.inference_mode()
def forward_time(model, n_tokens: int, context: int = 64, reps: int = 60, device: str = "cpu") -> float:
    """The model alone (no decoder around it): median robust seconds of one n-token cached forward."""
    cache = kv.new_cache()
    kv.forward(model, cache, torch.randint(3, model.config.vocab_size, (context,)).tolist())
    call = lambda: kv.forward(model, cache, list(range(3, 3 + n_tokens)), last=n_tokens)  # noqa: E731
    return median_times({"forward": call}, lambda: kv.crop(cache, context), reps, device)["forward"]


def run_child(cmd: list[str], log: Path, env: dict | None = None) -> dict:
    """Run `cmd` from the repository (output to `log`) -> {"seconds", "cpu_s", "peak_rss_mib", "rc"}: its wall clock,
    its own CPU time (user + system, every thread) and peak resident memory (os.wait4's rusage, ru_maxrss in KiB on
    Linux), not this process's."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"seconds": round(seconds, 1), "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mib": round(usage.ru_maxrss / 1024), "rc": proc.returncode}


def tail(log: Path, n: int = 15) -> str:
    """The last `n` lines of a child's log (what a failure message quotes)."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:]) if log.exists() else ""
