"""What the hardware charges per forward: the cached forward costs the counted cost model prices a
decode with (SpecDec++ Eq. 3.1 with the measured v(K) and t_draft).

Shared by two stages, so it sits below both: evaluate prices every run's counts with it (its passes spread
through the run loop), and train-heads measures c = t_draft / t_target the same way, so the heads'
thresholds are picked with the c their counted speedup is later priced with. It times models with the
decoder's own cached forwards (decoding.rounds.kv) but is measurement for the pipelines, not decoding: the
decoder never reads it.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.metrics import GenerationMetrics
from specdraft.decoding.speculators.eagle_model import is_eagle
from specdraft.decoding.timing import quantile, timed_call


class Priced(Protocol):
    """What `Calibration.cost` reads of a run (pipelines.evaluate.run.Record is one)."""

    key: Any  # its method key: family "ar" is the target decoding alone
    metrics: GenerationMetrics
    drafter: str | None


@dataclass(frozen=True)
class Calibration:
    """Robust seconds of one cached forward (a low quantile over the passes: load only adds time): the
    target's per n tokens fed, each drafter's per token."""

    target_s: dict[int, float]  # n -> seconds (n = 1 .. max K + 1)
    drafter_s: dict[str, float]
    context: int
    reps: int
    draft_run: int = 1  # drafter forwards timed in a row after each target forward (a round's K)

    def target(self, n: int) -> float:
        if n in self.target_s:
            return self.target_s[n]
        hi = max(self.target_s)  # beyond the calibrated sizes: extend the last step linearly
        return self.target_s[hi] + (n - hi) * (self.target_s[hi] - self.target_s.get(hi - 1, self.target_s[hi]))

    def v(self, k: int) -> float:
        """The (K+1)-token verification forward in units of a 1-token forward."""
        return self.target(k + 1) / self.target(1)

    def cost(self, rec: Priced) -> float:
        """Seconds the run's counts predict (SpecDec++ Eq. 3.1 with the target's cost per round size)."""
        m = rec.metrics
        if rec.key.family == "ar":
            return m.n_target * self.target(1)
        t_draft = self.drafter_s.get(rec.drafter, statistics.mean(self.drafter_s.values()))
        # target forwards outside speculative rounds (the sequential cascades' deferrals) as one-token forwards:
        # TokenCascade's catch-up covers the tokens since its last deferral, so its count is priced low
        outside = max(0, m.n_target - len(m.drafted))
        return sum(self.target(k + 1) for k in m.drafted) + outside * self.target(1) + m.n_draft * t_draft

    def as_dict(self) -> dict[str, Any]:
        return {"target_ms": {str(n): round(t * 1e3, 3) for n, t in sorted(self.target_s.items())},
                "v": {str(n - 1): round(t / self.target_s[1], 3) for n, t in sorted(self.target_s.items())},
                "drafter_ms": {n: round(t * 1e3, 3) for n, t in self.drafter_s.items()},
                "drafter_mean_ms": round(statistics.mean(self.drafter_s.values()) * 1e3, 3),
                # c = t_draft / t_target (SpecDec++ §3): the mean drafter's 1-token forward over the target's
                "cost_ratio": round(statistics.mean(self.drafter_s.values()) / self.target_s[1], 3),
                "context": self.context, "reps": self.reps, "draft_run": self.draft_run}


class Calibrator:
    """Samples the forward costs the counted speedup needs: per pass, every target forward size once and
    each drafter's 1-token forward, interleaved (so a load phase hits all sizes alike). `sample` can be
    called between prompts of the run loop, so the calibration sees the same load phases as the runs."""

    @torch.inference_mode()
    def __init__(self, target, drafters: dict[str, torch.nn.Module], max_n: int, context: int, device: str,
                 seed: int, draft_run: int = 4):
        gen = torch.Generator().manual_seed(seed)
        vocab = int(target.config.vocab_size)
        prefix = torch.randint(3, vocab, (context,), generator=gen).tolist()
        self.target, self.drafters, self.context, self.device = target, drafters, context, device
        self.caches = {}
        for name, model in {"target": target, **drafters}.items():
            self.caches[name] = kv.new_cache()
            if is_eagle(model):  # an EAGLE drafter reads the target's features: random ones cost the same
                kv.forward_eagle(model, self.caches[name], torch.randn(context, model.config.hidden_size,
                                                                       generator=gen), prefix, list(range(context)))
            else:
                kv.forward(model, self.caches[name], prefix, device=kv.input_device(model))
        self.sizes = list(range(1, max_n + 1))
        # a drafter drafts `draft_run` tokens in a row after each verification, and only the first of them
        # finds its weights evicted from the CPU caches by the target's forward; timing a lone forward
        # would price every drafted token as that cold first one (1.4x too dear on the demo pair:
        # benchmarks/predict/bench_forward_costs.py)
        self.draft_run = max(1, draft_run)
        self.feed = torch.randint(3, vocab, (max(max_n, self.draft_run),), generator=gen).tolist()
        self.times: dict[Any, list[float]] = {}
        self.passes = 0
        self.sample(2, keep=False)  # warm-up

    def _drafter_run(self, model, cache) -> None:
        """`draft_run` drafting forwards of one token each, one after the other, as in a round: N_draft
        counts each of them."""
        for i in range(self.draft_run):
            if is_eagle(model):
                feature = torch.zeros(1, model.config.hidden_size)
                kv.forward_eagle(model, cache, feature, self.feed[i:i + 1], [self.context + i])
            else:
                kv.forward(model, cache, self.feed[i:i + 1])

    @torch.inference_mode()
    def sample(self, passes: int, keep: bool = True) -> None:
        names = list(self.drafters)
        for _ in range(passes):
            # every drafter's run comes right after a target forward, as in decoding (where the target's
            # weights have just evicted the drafter's from the CPU caches); more drafters than sizes cost
            # extra, untimed-again target forwards
            for j in range(max(len(self.sizes), len(names))):
                n = self.sizes[j % len(self.sizes)]
                _, t = timed_call(lambda: kv.forward(self.target, self.caches["target"], self.feed[:n], last=n),
                                  self.device)
                kv.crop(self.caches["target"], self.context)
                if keep and j < len(self.sizes):
                    self.times.setdefault(n, []).append(t.time)
                if j < len(names):
                    name = names[j]
                    _, t = timed_call(lambda: self._drafter_run(self.drafters[name], self.caches[name]), self.device)
                    kv.crop(self.caches[name], self.context)
                    if keep:
                        self.times.setdefault(name, []).append(t.time / self.draft_run)
            self.passes += keep

    def take(self) -> dict[str, Any]:
        """The samples since the last take, as JSON (target sizes and drafter names kept apart), and
        forget them: what a shard stores beside the records of the runs those samples priced."""
        taken = {"target": {str(n): self.times.get(n, []) for n in self.sizes},
                 "drafters": {name: self.times.get(name, []) for name in self.drafters}, "passes": self.passes}
        self.times, self.passes = {}, 0
        return taken

    def pool(self, taken: list[dict[str, Any]]) -> None:
        """Add samples `take` handed out (this process's or another shard's of the same plan)."""
        for t in taken:
            for n, xs in t["target"].items():
                self.times.setdefault(int(n), []).extend(xs)
            for name, xs in t["drafters"].items():
                self.times.setdefault(name, []).extend(xs)
            self.passes += t["passes"]

    def result(self) -> Calibration:
        """Per size the 10% quantile over the passes (load only adds time), then for the target the
        least-squares line t(n) = a + b (n - 1) through them: on CPU a cached forward's cost is close to
        affine in the tokens fed, and the line pools all sizes' samples, so one noisy size cannot move v(K)."""
        sizes, times = self.sizes, self.times
        lows = {n: quantile(times[n], 0.1) for n in sizes}
        mean_x = statistics.mean(n - 1 for n in sizes)
        mean_y = statistics.mean(lows.values())
        sxx = sum((n - 1 - mean_x) ** 2 for n in sizes)
        slope = max(0.0, sum((n - 1 - mean_x) * (lows[n] - mean_y) for n in sizes) / sxx) if sxx else 0.0
        base = max(mean_y - slope * mean_x, min(lows.values()) * 0.5)
        target_s = {n: base + slope * (n - 1) for n in sizes}
        # drafters of one architecture cost the same per token: their samples are pooled, so measurement
        # noise does not make one specialist look dearer than its twin
        shape = {name: (sum(p.numel() for p in m.parameters()), int(getattr(m.config, "num_hidden_layers", 0)))
                 for name, m in self.drafters.items()}
        pooled = {s: [t for name in self.drafters if shape[name] == s for t in times[name]]
                  for s in set(shape.values())}
        return Calibration(target_s, {name: quantile(pooled[shape[name]], 0.1) for name in self.drafters},
                           self.context, self.passes, self.draft_run)


def calibrate(target, drafters: dict[str, torch.nn.Module], max_n: int, context: int, reps: int, device: str,
              seed: int, draft_run: int = 4) -> Calibration:
    """All `reps` passes at once (the stage spreads them through its run loop instead)."""
    cal = Calibrator(target, drafters, max_n, context, device, seed, draft_run)
    cal.sample(reps)
    return cal.result()

