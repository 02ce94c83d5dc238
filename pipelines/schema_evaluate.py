"""The `evaluate` section of the run config (pipelines/schema.py's RunConfig holds it): which prompt sets, methods,
bandits, batch sizes and timing an evaluation runs, and the prices of its counted speedup. Apart from schema.py
because it is the largest section, and the one a user tunes most."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from specdraft.core.errors import InputError, require_int
from specdraft.decoding.compat import check_k


SETS = ("test", "perturbed", "ood")
# name -> (label, selector in decoding.bandits.selectors, reward name in decoding.speculators.multi_drafter)
BANDITS: dict[str, tuple[str, str, str]] = {
    "ucb-bd": ("MetaSD-UCB (BD)", "ucb", "bd"),
    "ucb-bd-argmax": ("MetaSD-UCB (BD argmax)", "ucb", "bd-argmax"),
    "ucb-be": ("MetaSD-UCB (BE)", "ucb", "be"),
    "ucbspec": ("UCBSpec", "ucbspec", "accepted"),
    "exp3spec": ("EXP3Spec", "exp3spec", "accepted"),
}


@dataclass
class CountedCosts:
    """Fixed prices of a run's counts, in the target's 1-token forwards (its milliseconds still timed)."""
    cost_ratio: float = 0.1  # c = t_draft / t_target: a drafted token (every drafter alike)
    verify_slope: float = 0.0  # the (K+1)-token verification forward costs v(K) = 1 + verify_slope * K


@dataclass
class EvaluateSection:
    # the directory under run.root it writes (report.md, metrics.json, plots): a second, bigger evaluation
    # (configs/reproduce.yaml) reuses the run's trained stages and keeps the demo's report/ intact
    out: str = "report"
    sets: list[str] = field(default_factory=lambda: list(SETS))  # prompt sets of prompts/sets to decode
    prompts_per_domain: int = 4  # first N prompts per domain and set (4 x 11 domain-sets: ~3 min on 2 CPU cores)
    max_new_tokens: int = 48  # per generation
    max_prompt_tokens: int = 384  # longer prompts keep BOS and their last tokens
    k: Optional[int] = None  # K of the per-drafter table, the routers and the bandits' N_max; null: bundle's k
    ks: list[int] = field(default_factory=lambda: [2, 4, 6, 8])  # fixed-K sweep (SpecDec++ vs fixed K)
    sweep_drafters: Literal["in_domain", "all"] = "in_domain"  # K sweep, SpecDec++, oracle: domain drafter + OFA, or all
    per_drafter_sets: list[str] = field(default_factory=lambda: ["test"])  # sets where every drafter runs at K
    sampling_prompts: int = 1  # per domain (test set) also decoded in sampling mode; 0: greedy only
    bandits: list[str] = field(default_factory=lambda: list(BANDITS))  # of ucb-bd, ucb-bd-argmax, ucb-be, ucbspec, exp3spec
    # bandits that also run once more with their state kept across each (set, domain) stream of prompts
    # (MetaSD resets per query; a deployment serving one task can keep what it learnt)
    stream_bandits: list[str] = field(default_factory=list)
    # the bandits' (and the one-pass ceiling's) arms: the single-domain drafters, as in MetaSD Table 3 where
    # the OFA drafter is a baseline beside the bandit, or every drafter of the bundle
    bandit_arms: Literal["specialists", "all"] = "specialists"
    # further families, on the first `sampling_prompts` test prompts per domain (0: none of them):
    spectr_drafts: list[int] = field(default_factory=lambda: [2, 4])  # SpecTr: K drafts per round (sampling mode)
    # cascade rules (sampling mode): speculative (chow, diff, opt, token, lossy, ...) or the sequential baselines
    # token_chow / seq_chow (decoding/cascades.py)
    cascades: list[str] = field(default_factory=lambda: ["token", "opt"])
    cascade_alpha: float = 0.3  # the cascades' lenience
    # several lenience values (Faster Cascades Figure 2 / Table 2: the quality-latency trade-off); null: [cascade_alpha]
    cascade_alphas: Optional[list[float]] = None
    # test prompts per domain for the families above (SpecTr, cascades, model-free); null: sampling_prompts
    further_prompts: Optional[int] = None
    # model-free speculators alone (greedy), and `model_free_bandit` (ucbspec | exp3spec | null) over them plus
    # the domain drafter with the throughput reward (BanditSpec Table 1)
    model_free_arms: list[str] = field(default_factory=lambda: ["lookup", "rest", "suffix"])
    model_free_bandit: Optional[str] = "ucbspec"  # ucbspec | exp3spec | null
    model_free_bandits: Optional[list[str]] = None  # several of ucbspec, exp3spec; null: [model_free_bandit]
    # EAGLE drafters of the bundle (train_drafters.eagle): chain at K, EAGLE-2 tree, MetaEagle-UCB (BE, BD) on
    # these prompt sets (MetaSD Tables 4 / 7: test, perturbed, ood)
    eagle_sets: list[str] = field(default_factory=lambda: list(SETS))
    # throughput rows (docs/algorithms.md): batch sizes B at which the batched decoder decodes the pooled test
    # prompts in consecutive batches of B (the same prompts at every B), greedy: batched autoregressive, fixed K
    # for each of `ks`, SpecDec++ (per row and lockstep) and UCBSpec over lengths 0..k, tokens/s and speedup
    # over batched AR at the same B; [] (default): no throughput rows
    batch_sizes: list[int] = field(default_factory=list)
    # test prompts (all domains pooled, taken round-robin over domains) that feed the batches, cut down to a
    # multiple of every batch size; null: every test prompt the run loads (prompts_per_domain per domain)
    throughput_prompts: Optional[int] = None
    # every drafter also decodes alone (greedy, untimed) on the test prompts of the scored domains, and the report
    # sets its quality beside the target's with the paired gap's 90% interval (claims.quality_gap)
    drafter_quality: bool = False
    beta: float = 0.01  # MetaSD-UCB exploration strength (paper)
    delta: float = 0.5  # UCBSpec confidence (BanditSpec Thm 4.3)
    device: str = "auto"  # auto: cuda if available, else cpu
    # timing (decoding/timing.py): passes over each prompt's methods, interleaved; every pass is one whole
    # generation, timed (CUDA events on a GPU, synchronized; this process's CPU time on CPU), with its
    # speculator built before the call. `repeats` passes each, then further passes for a run whose 90%
    # interval of its mean time is wider than +-repeat_ci of it, up to `repeats_max` (null: repeats)
    repeats: int = 2  # timed passes per run, at least
    repeats_max: Optional[int] = None  # configs/gpu.yaml and reproduce.yaml: 6
    repeat_ci: float = 0.05  # the half-width of the 90% interval, as a share of the mean, that ends the passes
    warmup: bool = True  # one untimed decode per method and prompt-length class (power of two) before its timed ones
    calibration_reps: int = 50  # interleaved passes over the target's / drafters' forward sizes (counted speedup)
    # the counted speedup's prices: null (default) the calibration's v(K) and c, timed on this machine; pinned,
    # counts alone decide every counted verdict, the same on every run (the calibration is reported beside)
    counted_costs: Optional[CountedCosts] = None
    # torch CPU threads while evaluating (0: torch's default). 1 makes a run's process CPU time its own
    # compute: with more, idle OpenMP workers spin and bill CPU time that depends on the machine's load
    threads: int = 1
    # processes on this machine that share the plan's units (`specdraft evaluate --shard` started here, one core
    # each at threads 1; this one merges): 2 on a 2-core box finished the demo's plan 1.61x sooner
    # (benchmarks/pipeline/RESULTS.md, bench_evaluate_shards); 1: this process alone. Unused where the stage already runs as
    # one of several shards (--shard, a Slurm array, torchrun ranks)
    processes: int = 1

    def check(self) -> None:
        reserved = {"prompts", "target", "distill_data", "drafters", "acceptance_data", "heads", "router", "bundle"}
        if not self.out or "/" in self.out or "\\" in self.out or self.out.startswith(".") or self.out in reserved:
            raise InputError(f"evaluate.out must be a plain directory name under run.root other than a stage's "
                             f"(e.g. report or reproduce), got {self.out!r}")
        if self.further_prompts is not None and self.further_prompts < 0:
            raise InputError(f"evaluate.further_prompts must be >= 0 or null, got {self.further_prompts}")
        for a in self.cascade_alphas or []:
            if isinstance(a, bool) or not isinstance(a, (int, float)) or a < 0:
                raise InputError(f"evaluate.cascade_alphas: lenience must be a number >= 0, got {a!r}")
        for name in ("repeats", "calibration_reps", "processes"):
            if getattr(self, name) < 1:
                raise InputError(f"evaluate.{name} must be >= 1, got {getattr(self, name)}")
        if self.repeats_max is not None and self.repeats_max < self.repeats:
            raise InputError(f"evaluate.repeats_max ({self.repeats_max}) must be >= evaluate.repeats ({self.repeats}) "
                             "or null (= repeats)")
        if isinstance(self.repeat_ci, bool) or not (isinstance(self.repeat_ci, (int, float)) and self.repeat_ci >= 0):
            raise InputError(f"evaluate.repeat_ci must be a number >= 0 (e.g. 0.05: +-5%), got {self.repeat_ci!r}")
        for d in self.spectr_drafts:
            require_int(d, "evaluate.spectr_drafts: drafts per round")
        for b in [self.model_free_bandit] + (self.model_free_bandits or []):
            if b not in (None, "ucbspec", "exp3spec"):
                raise InputError(f"evaluate.model_free_bandit(s) must be ucbspec, exp3spec or null, got {b!r}")
        for a in self.model_free_arms:
            if a not in ("lookup", "rest", "suffix"):
                raise InputError(f"evaluate.model_free_arms: unknown arm '{a}'; use lookup, rest, suffix")
        c = self.counted_costs
        if c is not None and not (c.cost_ratio > 0 and c.verify_slope >= 0):
            raise InputError(f"evaluate.counted_costs needs cost_ratio > 0 and verify_slope >= 0, got {c.cost_ratio} "
                             f"and {c.verify_slope}; or null: calibrate them on this machine")
        if self.threads < 0:
            raise InputError(f"evaluate.threads must be >= 0 (0: torch's default), got {self.threads}")
        for s in self.sets + self.per_drafter_sets + self.eagle_sets:
            if s not in SETS:
                raise InputError(f"evaluate: unknown prompt set '{s}'; use {', '.join(SETS)}")
        if not self.sets:
            raise InputError("evaluate.sets is empty; name at least one of " + ", ".join(SETS))
        for name in ("prompts_per_domain", "max_new_tokens", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"evaluate.{name} must be >= 1, got {getattr(self, name)}")
        if self.sampling_prompts < 0:
            raise InputError(f"evaluate.sampling_prompts must be >= 0, got {self.sampling_prompts}")
        if self.k is not None:
            check_k(self.k, "evaluate.k")
        if not self.ks:
            raise InputError("evaluate.ks is empty; give at least one K, e.g. [2, 4, 6, 8]")
        for k in self.ks:
            check_k(k, "evaluate.ks")
        for b in self.bandits:
            if b not in BANDITS:
                raise InputError(f"evaluate.bandits: unknown bandit '{b}'; use {', '.join(BANDITS)}")
        for b in self.stream_bandits:
            if b not in BANDITS:
                raise InputError(f"evaluate.stream_bandits: unknown bandit '{b}'; use {', '.join(BANDITS)}")
        for b in self.batch_sizes:
            require_int(b, "evaluate.batch_sizes: a batch size", hint="e.g. [1, 2, 4, 8, 16]")
        if len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise InputError(f"evaluate.batch_sizes lists a batch size twice ({self.batch_sizes}); name each once")
        if self.batch_sizes and "test" not in self.sets:
            raise InputError("evaluate.batch_sizes batches the test prompts; add test to evaluate.sets "
                             "or set batch_sizes: []")
        if self.throughput_prompts is not None:
            require_int(self.throughput_prompts, "evaluate.throughput_prompts", hint="or null: every test prompt")
