"""Timing that holds up on a shared machine, and the statistics every reported speed carries.

On a CPU box shared with other processes, wall time measures the neighbours as much as our code: a
busy core stretches every call. Per-process CPU time (`time.process_time`) counts only the cycles this
process ran, so it moves far less with load; wall time is kept beside it. On a GPU the kernels run
asynchronously, so the host clocks measure launch overhead: CUDA events around the call time the device.

Speeds are then compared as ratios of runs made close together (methods interleaved per prompt,
repeated), and every ratio is reported with its spread over prompts (the evaluate stage pools a ratio of
totals, `bootstrap_ratio`, with a bootstrap 90% interval), so a difference is called an effect only when it
exceeds that spread.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import numpy as np
import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Timing:
    """One timed call. `time` is the robust measure: CPU seconds of this process on CPU, CUDA event
    seconds on a GPU; `wall` is plain wall-clock seconds beside it."""

    time: float
    wall: float
    cpu: float

    def as_dict(self) -> dict[str, float]:
        return {"time_s": self.time, "wall_s": self.wall, "cpu_s": self.cpu}


def timed_call(fn: Callable[[], T], device: str | torch.device = "cpu") -> tuple[T, Timing]:
    """Run fn() once; (its result, its Timing). On CUDA the device is synchronised before and after,
    so the events bracket exactly this call's kernels."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start_ev.record()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out = fn()
    if cuda:
        end_ev.record()
        torch.cuda.synchronize(device)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    robust = start_ev.elapsed_time(end_ev) / 1e3 if cuda else cpu
    return out, Timing(time=robust, wall=wall, cpu=cpu)


@dataclass(frozen=True)
class Spread:
    """A median and the bounds of its spread (a bootstrap 90% interval, or the IQR where so named)."""

    median: float
    lo: float
    hi: float

    def as_dict(self, digits: int = 3) -> dict[str, float]:
        return {"median": round(self.median, digits), "lo": round(self.lo, digits), "hi": round(self.hi, digits)}


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of a non-empty sequence."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    i = int(pos)
    return s[i] if i + 1 >= len(s) else s[i] + (s[i + 1] - s[i]) * (pos - i)


def iqr(xs: Sequence[float]) -> Spread:
    return Spread(statistics.median(xs), quantile(xs, 0.25), quantile(xs, 0.75))


def bootstrap_median(xs: Sequence[float], seed: int = 0, n_boot: int = 1000, level: float = 0.9) -> Spread:
    """The median of xs with a percentile-bootstrap `level` interval over its items (e.g. prompts).
    One item gives a zero-width interval: there is nothing to resample."""
    x = np.asarray(list(xs), dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_median needs at least one value")
    med = float(np.median(x))
    if x.size == 1:
        return Spread(med, med, med)
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))
    meds = np.median(x[idx], axis=1)
    tail = (1 - level) / 2
    return Spread(med, float(np.quantile(meds, tail)), float(np.quantile(meds, 1 - tail)))


def verdict(spread: Spread, threshold: float) -> str:
    """'above' / 'below' when the whole interval lies on one side of threshold, else 'within noise'."""
    if spread.lo > threshold:
        return "above"
    if spread.hi < threshold:
        return "below"
    return "within noise"


def bootstrap_ratio(pairs: Sequence[tuple[float, float]], seed: int = 0, n_boot: int = 1000,
                    level: float = 0.9) -> Spread:
    """sum(a) / sum(b) over paired items (a, b) (e.g. per prompt: the baseline's time, the method's),
    with a percentile-bootstrap `level` interval from resampling the items. The point estimate is the
    ratio of totals, so it matches the pooled numbers of a table."""
    return bootstrap_rate_ratio([(a, 1.0, b, 1.0) for a, b in pairs], seed, n_boot, level)


def bootstrap_rate_ratio(items: Sequence[tuple[float, float, float, float]], seed: int = 0, n_boot: int = 1000,
                         level: float = 0.9) -> Spread:
    """(sum a / sum a_per) / (sum b / sum b_per) over paired items (a, a_per, b, b_per), e.g. per prompt a
    baseline's target calls and tokens, then a method's: the ratio of two pooled rates (MAT of the method
    over the baseline's), with a percentile-bootstrap `level` interval from resampling the items. Pooling
    before dividing keeps it equal to the ratio of the tables' pooled numbers, and a prompt whose sampled
    generation ended after one token weighs one token, not a whole prompt."""
    x = np.asarray(list(items), dtype=np.float64).reshape(-1, 4)
    if x.shape[0] == 0:
        raise ValueError("bootstrap_rate_ratio needs at least one item")

    def rate_ratio(s: np.ndarray) -> np.ndarray:  # s: (..., 4) column sums
        return (s[..., 0] / s[..., 1]) / (s[..., 2] / s[..., 3])

    point = float(rate_ratio(x.sum(0)))
    if x.shape[0] == 1:
        return Spread(point, point, point)
    idx = np.random.default_rng(seed).integers(0, x.shape[0], size=(n_boot, x.shape[0]))
    stats = rate_ratio(x[idx].sum(1))
    tail = (1 - level) / 2
    return Spread(point, float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail)))
