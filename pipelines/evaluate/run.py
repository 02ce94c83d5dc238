"""The run loop: every run of a plan decoded, per prompt `repeats` interleaved passes, each whole generate
call timed; a `Record` keeps the counts of the first pass and every pass's times."""
from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from tqdm.auto import tqdm

from specdraft.decoding.batched import generate_batch
from specdraft.decoding.metrics import GenerationMetrics, GenerationResult, aggregate
from specdraft.decoding.speculators.multi_drafter import MultiDrafterSpeculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.timing import Timing, timed_call
from specdraft.pipelines.evaluate.methods import MethodKey
from specdraft.pipelines.evaluate.plan import Built, Run


@dataclass
class Record:
    """A run done: its counts (first pass) and every pass's timing."""

    key: MethodKey
    prompt: str
    set: str
    domain: str
    metrics: GenerationMetrics
    times: list[Timing] = field(default_factory=list)
    drafter: str | None = None  # the drafter that decoded it, where one did (a router's pick included)
    arms: list[str] | None = None  # multi-drafter runs: the arm chosen per round
    switch_s: float = 0.0
    tokens: list[int] | None = None  # the generated tokens (first pass)
    quality: float | None = None  # sampling mode, scored domains: data/quality.py's primary metric vs the reference
    # a batch run (Prompt.batch): each row's counts (`metrics` holds their sums, time_total the batch's), the
    # rows' prompt ids in row order and the seed the batch decoded with
    rows: list[GenerationMetrics] | None = None
    row_prompts: list[str] | None = None
    seed: int | None = None

    @property
    def time(self) -> float:
        """Seconds of the whole call: the mean over its passes. Pooled over prompts as a ratio of totals (aggregate.py),
        this is the total CPU time of every pass, the timed estimator that moved least between a quiet and a busy
        run of the same plan (`bench_evaluate_load.py --estimators` on the earlier demo target: 63 of 89
        cells within 10%, against 58 for the fastest pass and 42 for the median of per-prompt ratios). The
        fastest of 2-3 passes is itself a noisy extreme; the mean averages the noise away."""
        return statistics.fmean(t.time for t in self.times) if self.times else self.metrics.time_total

    @property
    def wall(self) -> float:
        return statistics.fmean(t.wall for t in self.times) if self.times else self.metrics.time_total

    def as_json(self) -> dict[str, Any]:
        """Everything the run loop measured, as JSON (a shard's records on disk; floats round-trip exactly).
        Quality is scored after the loop, on every record at once, so it is not kept."""
        return {"key": self.key.fields(), "prompt": self.prompt, "set": self.set, "domain": self.domain,
                "metrics": dataclasses.asdict(self.metrics), "times": [t.as_dict() for t in self.times],
                "drafter": self.drafter, "arms": self.arms, "switch_s": self.switch_s, "tokens": self.tokens,
                "rows": [dataclasses.asdict(m) for m in self.rows] if self.rows is not None else None,
                "row_prompts": self.row_prompts, "seed": self.seed}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Record":
        return cls(MethodKey.from_fields(d["key"]), d["prompt"], d["set"], d["domain"],
                   GenerationMetrics(**d["metrics"]),
                   [Timing(time=t["time_s"], wall=t["wall_s"], cpu=t["cpu_s"]) for t in d["times"]],
                   drafter=d["drafter"], arms=d["arms"], switch_s=d["switch_s"], tokens=d["tokens"],
                   rows=[GenerationMetrics(**m) for m in d["rows"]] if d.get("rows") is not None else None,
                   row_prompts=d.get("row_prompts"), seed=d.get("seed"))



@dataclass(frozen=True)
class TimingPolicy:
    """How the loop times (config: evaluate.warmup, repeats, repeats_max, repeat_ci). Each prompt's runs get
    `repeats` interleaved timed passes; a run whose 90% interval of its mean time is still wider than
    +-repeat_ci of that mean gets further passes (interleaved with the other wide runs of the prompt), up
    to `repeats_max`. With `warmup`, the first time a method meets a prompt-length class (`shape`) it first
    decodes once untimed: lazy initialisation (CUDA context and kernels, allocator growth, a speculator's
    first code path) is nobody's per-token cost."""

    repeats: int = 1
    repeats_max: int | None = None  # None: = repeats (fixed passes)
    repeat_ci: float = 0.0  # target relative half-width of the 90% interval of a run's mean time
    warmup: bool = False

    @property
    def cap(self) -> int:
        return max(self.repeats, self.repeats_max or self.repeats)


Z90 = 1.645  # two-sided 90% normal quantile


def relative_half_width(times: list[float]) -> float:
    """Half-width of the 90% interval of the mean of these times, over that mean (inf below two times)."""
    if len(times) < 2 or statistics.fmean(times) <= 0:
        return math.inf
    return Z90 * statistics.stdev(times) / math.sqrt(len(times)) / statistics.fmean(times)


def shape(run: Run) -> tuple[MethodKey, int]:
    """A method at a prompt-length class (the next power of two): what one warm-up covers. A batch run's key
    names its batch size, and one warm-up covers it (its rows' lengths vary within every batch)."""
    if run.prompt.batch:
        return run.key, 0
    return run.key, 1 << max(len(run.prompt.ids) - 1, 0).bit_length()


def execute(plan: list[Run], target: torch.nn.Module, max_new_tokens: int, sampling: Mapping[str, SamplingConfig],
            eos, device: str, repeats: int, progress: bool = True,
            between: Callable[[], None] | None = None, bar: tqdm | None = None,
            policy: TimingPolicy | None = None, warmed: set | None = None) -> list[Record]:
    """Every run of the plan; per prompt `repeats` interleaved passes, more for runs whose time is not yet
    narrow (`policy`; non-repeatable runs once). A run's speculator is built before its timed call
    (`Run.timed_build`: a build that is the method's own serving work, e.g. routing, stays inside);
    each timed call is one whole generation, synchronized on CUDA (`decoding.timing.timed_call`).
    `between()` runs after each prompt (the stage samples its calibration there). `bar`: a progress bar
    the caller keeps over several calls (one per unit of a shard), else one of its own. `warmed`: the
    shapes already warmed up, kept by a caller over several calls."""
    policy = policy or TimingPolicy(repeats=repeats)
    warmed = set() if warmed is None else warmed
    by_prompt: dict[str, list[Run]] = {}
    for run in plan:
        by_prompt.setdefault(run.prompt.id, []).append(run)
    total = calls(plan, repeats)
    own_bar = bar is None
    if own_bar:
        bar = tqdm(total=total, desc="evaluate", unit="run", disable=not progress)
    records: list[Record] = []
    for runs in by_prompt.values():
        done: dict[MethodKey, GenerationResult] = {}
        mine: dict[MethodKey, Record] = {}
        for rep in range(policy.cap):
            for run in runs:
                if rep and not run.repeatable:
                    continue
                if rep >= policy.repeats and \
                        relative_half_width([t.time for t in mine[run.key].times]) <= policy.repeat_ci:
                    continue
                mode = sampling[run.key.mode]
                if rep == 0 and policy.warmup and run.repeatable and shape(run) not in warmed:
                    _decode(run, run.build(done), target, max_new_tokens, mode, eos)  # untimed
                    warmed.add(shape(run))
                prebuilt = None if run.timed_build else run.build(done)
                (built, res), t = timed_call(lambda: _decode(
                    run, prebuilt if prebuilt is not None else run.build(done), target, max_new_tokens, mode, eos),
                    device)
                if rep >= policy.repeats:  # a pass beyond the planned ones
                    bar.total += 1
                bar.update(1)
                if rep == 0:
                    spec = built.speculator
                    m = dataclasses.replace(res.metrics, time_cpu=t.cpu)
                    batch = isinstance(res, BatchResult)
                    rec = Record(run.key, run.prompt.id, run.prompt.set, run.prompt.domain, m, [t],
                                 drafter=built.drafter or run.key.drafter,
                                 arms=[spec.arms[h["arm"]].name for h in spec.history]
                                 if isinstance(spec, MultiDrafterSpeculator) else None,
                                 switch_s=float(getattr(spec, "switch_seconds", 0.0)),
                                 tokens=None if batch else list(res.tokens),
                                 rows=[r.metrics for r in res.results] if batch else None,
                                 row_prompts=[p.id for p in run.prompt.batch] if batch else None,
                                 seed=run.seed if batch else None)
                    done[run.key], mine[run.key] = res, rec
                    records.append(rec)
                else:
                    mine[run.key].times.append(t)
        if between is not None:
            between()
    if own_bar:
        bar.close()
    return records


def calls(plan: list[Run], repeats: int) -> int:
    """The generate calls `execute` makes for a plan (its progress bar's length)."""
    return sum(repeats if r.repeatable else 1 for r in plan)


@dataclass
class BatchResult:
    """A batch decoded together (`decoding.batched.generate_batch`): each row's result, and their counts summed
    with the batch's one wall time (every row's `time_total` is that same time)."""

    results: list[GenerationResult]

    @property
    def metrics(self) -> GenerationMetrics:
        return dataclasses.replace(aggregate(r.metrics for r in self.results),
                                   time_total=self.results[0].metrics.time_total)


def _decode(run: Run, built: Built, target, max_new_tokens: int, sampling: SamplingConfig, eos) -> tuple[Built, Any]:
    """One generation (or a batch's). Chains and the target alone decode in the product loop, the one
    `specdraft generate` runs (`generate_batch`; a prompt is a batch of one, its seed the run's); methods
    that need the one-prompt loop (bandits, trees, SpecTr, model-free, oracle, cascades) in it."""
    if built.decode is not None:
        gen = torch.Generator().manual_seed(run.seed) if run.seed is not None else None
        return built, built.decode(target, run.prompt.ids, max_new_tokens, sampling, eos, gen)
    if built.speculator is None and built.verification is None:
        rows = [list(p.ids) for p in run.prompt.batch] if run.prompt.batch else [list(run.prompt.ids)]
        results = generate_batch(target, rows, max_new_tokens, drafter=built.draft_model, policy=built.policy,
                                 sampling=sampling, eos_token_id=eos, seed=run.seed if run.seed is not None else 0)
        return built, BatchResult(results) if run.prompt.batch else results[0]
    gen = torch.Generator().manual_seed(run.seed) if run.seed is not None else None
    return built, generate_speculative(target, built.speculator, run.prompt.ids, max_new_tokens, sampling, eos, gen,
                                       built.verification)
