"""Bandit arms of any kind from config entries: drafters, speculation lengths, model-free speculators.

BanditSpec Table 1 mixes arms of different kinds (PLD, REST, Suffix Tree beside Eagle-2); MetaSD mixes
drafters. An arm entry is a string or a mapping (YAML lists read as either):

    "lookup"                      prompt lookup (decoding.speculators.prompt_lookup)
    "rest"                        REST over the bundle's datastore (decoding.speculators.rest)
    "suffix"                      suffix decoding, global datastore + per request (decoding.speculators.suffix)
    "none"                        propose nothing: a plain target step (BanditSpec's gamma = 0)
    "math"  or "drafter:math"     the drafter named math, drafting up to n_max tokens (FixedK)
    {kind: drafter, drafter: math, k: 2, name: "math-k2", cost_ratio: 0.1}
    {kind: suffix, spec_factor: 2.0, min_prob: 0.05}  other keys go to the speculator

`cost_ratio` is the arm's cost per drafted token in target forwards, read by the throughput reward
(`decoding.speculators.multi_drafter.MultiDrafterSpeculator`, BanditSpec §6.2); left out, a drafter arm takes
the bandit's and a model-free arm 0. Arms over one drafter share its KV cache (drafter_key).

`ArmResources` holds what arms are built from: drafter models by name and the datastore (None when the
bundle has none: "rest" is then unavailable and "suffix" runs on the per-request structure alone).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specdraft.decoding.speculators.datastore import SuffixIndex
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.multi_drafter import Arm, NoDraftSpeculator
from specdraft.decoding.speculators.prompt_lookup import PromptLookupSpeculator
from specdraft.decoding.speculators.rest import RestSpeculator
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.speculators.suffix import SuffixSpeculator

MODEL_FREE = ("lookup", "rest", "suffix")
KINDS = ("drafter", "none") + MODEL_FREE


@dataclass
class ArmResources:
    drafters: dict[str, torch.nn.Module] = field(default_factory=dict)
    datastore: SuffixIndex | None = None

    @staticmethod
    def from_bundle(bundle, drafters: dict[str, torch.nn.Module]) -> "ArmResources":
        """The loaded drafters plus the bundle's datastore (None when it ships none; see
        `Bundle.unavailable_arms`). E.g. an evaluate plan entry:
            arms = build_arms(["lookup", "rest", "suffix", "ofa"], ArmResources.from_bundle(b, drafters), n_max=4)
            bandit = MultiDrafterSpeculator(arms, make_selector("ucbspec", 4, max_len=4), reward="throughput", n_max=4,
                                            cost_ratio=b.defaults.cost_ratio)
        """
        return ArmResources(dict(drafters), bundle.load_datastore())

    def unavailable(self) -> dict[str, str]:
        """Arm kinds that cannot be built from these resources -> why (empty when all can)."""
        out = {}
        if self.datastore is None:
            out["rest"] = "no datastore in the bundle (re-export with export.datastore: true)"
        if not self.drafters:
            out["drafter"] = "no drafters loaded"
        return out


def model_free_speculator(kind: str, datastore: SuffixIndex | None, max_tokens: int, **params):
    """A model-free speculator by kind ("lookup", "rest", "suffix"), drafting at most max_tokens."""
    if kind == "lookup":
        return PromptLookupSpeculator(max_tokens=max_tokens, **params)
    if kind == "rest":
        if datastore is None:
            raise InputError("arm 'rest' needs a datastore and the bundle has none; re-export with "
                             "export.datastore: true, or drop the arm")
        return RestSpeculator(datastore, max_tokens=max_tokens, **params)
    if kind == "suffix":
        return SuffixSpeculator(datastore, max_tokens=max_tokens, **params)
    raise InputError(f"unknown model-free speculator {kind!r}; use one of {', '.join(MODEL_FREE)}")


def _normalise(entry: Any, resources: ArmResources) -> dict[str, Any]:
    if isinstance(entry, str):
        if entry in KINDS:
            return {"kind": entry}
        if entry.startswith("drafter:"):
            return {"kind": "drafter", "drafter": entry.split(":", 1)[1]}
        if entry in resources.drafters:
            return {"kind": "drafter", "drafter": entry}
        raise InputError(f"arm {entry!r} is neither a kind ({', '.join(KINDS)}) nor a drafter "
                         f"({', '.join(resources.drafters) or 'none loaded'})")
    if isinstance(entry, dict):
        d = dict(entry)
        if d.get("kind") not in KINDS:
            raise InputError(f"arm {entry!r} needs kind: one of {', '.join(KINDS)}")
        return d
    raise InputError(f"an arm entry is a string or a mapping, got {type(entry).__name__}: {entry!r}")


def build_arm(entry: Any, resources: ArmResources, n_max: int) -> Arm:
    """One `decoding.speculators.multi_drafter.Arm` from a config entry (see the module docstring)."""
    d = _normalise(entry, resources)
    kind = d.pop("kind")
    name = d.pop("name", None)
    cost = d.pop("cost_ratio", None)
    if kind == "drafter":
        drafter = d.pop("drafter", None)
        k = d.pop("k", n_max)
        if d:
            raise InputError(f"drafter arm {drafter!r} does not take {', '.join(sorted(d))}; it takes drafter, k, "
                             "name, cost_ratio")
        if drafter not in resources.drafters:
            raise InputError(f"arm names drafter {drafter!r}; loaded: {', '.join(resources.drafters) or 'none'}")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_max:
            raise InputError(f"drafter arm {drafter!r}: k must be an integer in 1..n_max={n_max}, got {k!r}")
        name = name or (drafter if k == n_max else f"{drafter}:k={k}")
        model = resources.drafters[drafter]
        if getattr(model.config, "model_type", None) == "eagle":  # BanditSpec's parametric arm: an EAGLE drafter
            from specdraft.decoding.speculators.eagle import EagleSpeculator

            # its own feature store and layer cache (no hand-over between arms: each catches up alone)
            return Arm(name, EagleSpeculator(model, build_policy(PolicySpec("fixed", k=k))), cost_ratio=cost)
        return Arm(name, DrafterSpeculator(model, build_policy(PolicySpec("fixed", k=k))), drafter_key=f"drafter:{drafter}", cost_ratio=cost)
    if kind == "none":
        if d:
            raise InputError(f"arm 'none' takes no parameters, got {', '.join(sorted(d))}")
        return Arm(name or "none", NoDraftSpeculator(), cost_ratio=cost)
    max_tokens = d.pop("max_tokens", n_max)
    try:
        spec = model_free_speculator(kind, resources.datastore, max_tokens, **d)
    except TypeError as e:  # an unknown parameter name
        raise InputError(f"arm {kind!r}: {e}") from None
    return Arm(name or kind, spec, cost_ratio=cost)


def build_arms(entries: list[Any], resources: ArmResources, n_max: int) -> list[Arm]:
    """The arms of a bandit, in config order; names must be unique (MultiDrafterSpeculator checks)."""
    if not isinstance(entries, (list, tuple)) or not entries:
        raise InputError("the bandit's arm list is empty; give e.g. [lookup, rest, suffix, <drafter name>]")
    return [build_arm(e, resources, n_max) for e in entries]
