"""The decoding defaults: the one typed owner of K, K_max, the SpecDec++ threshold, the cost ratio c and
the sampling transform.

`DecodingDefaults` is the config's top-level `decoding` section (pipelines/schema.py), the `decoding`
object of bundle.json (decoding/bundle/schema.py, written by export with every number resolved: the
cost ratio is the c train-heads measured or pinned), and what a loaded bundle serves with
(`Bundle.defaults`). Everything else that needs one of these numbers reads it from here, or from the
bundle that carries them: `specdraft generate`, the bandits' throughput reward (decoding/speculators/multi_drafter.py),
the stopping policies' library defaults (decoding/policies/stopping.py), train-heads' simulation cap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

from specdraft.core.errors import InputError, require_int

COMPILE_MODES = ("none", "default", "reduce-overhead")
DRAFT_WEIGHTS = ("auto", "int8", "dtype")  # a drafter's weights for inference (decoding.bundle.loading.load_drafter)
# SpecDec++'s own default h (§5.2), for a SpecDecPP built by hand; a bundled head serves at the h
# train-heads chose for it by simulation, unless `DecodingDefaults.threshold` pins one
SPECDECPP_PAPER_THRESHOLD = 0.7


def is_threshold(h) -> bool:
    """Whether `h` can be SpecDec++'s stop threshold: a number in (0, 1) (0 would stop after every first
    draft, 1 never). The one definition every reader of a threshold checks with."""
    return isinstance(h, (int, float)) and not isinstance(h, bool) and 0.0 < h < 1.0


@dataclass(frozen=True)
class DecodingDefaults:
    """What the decoder does when a request names nothing else; export writes it into bundle.json."""

    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1.0 disables
    # fixed draft length of a drafter without heads (a drafter with heads serves fixed K at train-heads' best K)
    k: int = 4
    k_max: int = 20  # SpecDec++ cap on a round's drafts, and the longest round train-heads simulates
    threshold: Optional[float] = None  # SpecDec++ stop threshold h in (0, 1); null: each head's own h chosen by train-heads
    # c = t_draft / t_target, the bandits' throughput price of a drafted token; null: the c train-heads
    # measured (or pinned with train_heads.cost_ratio); a number: that c (e.g. timed on the serving machine)
    cost_ratio: Optional[float] = None
    selector: str = "ucb"  # multi-drafter bandit (decoding/bandits/selectors.py)
    max_new_tokens: int = 64  # tokens per generation
    drafts: int = 1  # i.i.d. drafts per round; > 1 decodes with SpecTr (decoding/speculators/spectr.py)
    cascade: Optional[dict[str, Any]] = None  # {rule, alpha[, beta]}: serve a speculative cascade (decoding/cascades.py)
    compile: Literal["none", "default", "reduce-overhead"] = "none"  # torch.compile mode of the decoder's steps
    # a drafter's linear weights when it runs: int8 (its one-row steps stream half the bytes; the target verifies
    # every draft, so the output is unchanged), the dtype's, or auto: int8 where bf16 runs on a CPU's bf16 units
    draft_weights: Literal["auto", "int8", "dtype"] = "auto"

    def check(self, where: str = "decoding") -> None:
        """Every value one that can work; InputError naming the key otherwise (the config loader calls it on
        the config's decoding section, the bundle reader on bundle.json's decoding object)."""
        from specdraft.decoding.rounds.sampling import SamplingConfig

        if not (math.isfinite(self.temperature) and math.isfinite(self.top_p)):  # inf passes SamplingConfig's >= 0
            raise InputError(f"{where}: temperature and top_p must be finite numbers, got {self.temperature} and "
                             f"{self.top_p}")
        try:
            SamplingConfig(self.temperature, self.top_k, self.top_p)
        except InputError as e:
            raise InputError(f"{where}: {e}") from None
        for name in ("k", "k_max", "max_new_tokens", "drafts"):
            require_int(getattr(self, name), f"{where}.{name}")
        # k_max is SpecDec++'s cap on a round and the longest round train-heads simulates: a default K above
        # it is a length no head was simulated at, and a section saying both contradicts itself
        if self.k > self.k_max:
            raise InputError(f"{where}.k ({self.k}) exceeds its k_max ({self.k_max}); lower k or raise k_max")
        if self.threshold is not None and not is_threshold(self.threshold):
            raise InputError(f"{where}.threshold must be in (0, 1) or null (each head's own h), got {self.threshold}")
        if self.cost_ratio is not None and not (math.isfinite(self.cost_ratio) and self.cost_ratio >= 0):
            raise InputError(f"{where}.cost_ratio (c = t_draft / t_target) must be a finite number >= 0 or null, "
                             f"got {self.cost_ratio}")
        if self.compile not in COMPILE_MODES:
            raise InputError(f"{where}.compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.draft_weights not in DRAFT_WEIGHTS:
            raise InputError(f"{where}.draft_weights must be one of {', '.join(DRAFT_WEIGHTS)}, got "
                             f"{self.draft_weights!r}")
        from specdraft.decoding.bandits.selectors import SELECTORS

        # the decoder builds a selector from this name: a bad one must stop here, not mid-evaluation (the
        # cascade spec is checked by its readers, bundle.json's and the config's: decoding.cascades imports this)
        if self.selector not in SELECTORS:
            raise InputError(f"{where}.selector {self.selector!r} is not a selector; use one of {', '.join(SELECTORS)}")

    def sampling(self):
        """The default sampling transform (decoding.rounds.sampling.SamplingConfig)."""
        from specdraft.decoding.rounds.sampling import SamplingConfig

        return SamplingConfig(self.temperature, self.top_k, self.top_p)


DEFAULTS = DecodingDefaults()  # the library's defaults, for callers with neither a config nor a bundle
