"""What a method is (`MethodKey`, data) and what it is called (`label`, the one place a display name is
made): the plan keys its runs with it, the rows of metrics.json carry its fields, the report names it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from specdraft.decoding.cascades import DISPLAY_NAMES as CASCADE_NAMES
from specdraft.pipelines.schema import BANDITS

def params(**kw) -> tuple[tuple[str, Any], ...]:
    """A MethodKey's open settings as sorted (name, value) pairs: hashable, and order-independent."""
    return tuple(sorted(kw.items()))


@dataclass(frozen=True)
class MethodKey:
    """What a method is, as data. Two runs with equal keys are the same method (on different prompts)."""

    family: str  # ar | fixed | specdecpp | oracle | router | bandit | ceiling | domain | hindsight | batched | ...
    mode: str = "greedy"  # greedy | sampling
    drafter: str | None = None  # the one drafter it decodes with, when fixed in advance
    k: int | None = None  # fixed K, or a bandit's N_max
    # a stopping policy named beside K (derived rows: "specdecpp"; batched runs: ar | fixed | specdecpp |
    # specdecpp-lockstep | batch-aware-lockstep | global-budget | ucbspec)
    policy: str | None = None
    router: str | None = None  # router kind
    bandit: str | None = None  # a key of pipelines.schema.BANDITS
    reward: str | None = None  # the bandit's reward (bd | bd-argmax | be | accepted)
    stream: bool = False  # bandit state kept across the (set, domain) stream of prompts
    params: tuple[tuple[str, Any], ...] = ()  # anything else a family needs (see `params`)

    def fields(self) -> dict[str, Any]:
        """The key as JSON fields (params as a dict): what rows and runs of metrics.json carry."""
        d = dataclasses.asdict(self)
        d["params"] = dict(self.params)
        return d

    @classmethod
    def from_fields(cls, row: Mapping[str, Any]) -> "MethodKey":
        names = [f.name for f in dataclasses.fields(cls)]
        d = {n: row.get(n) for n in names if n in row}
        d["params"] = params(**(row.get("params") or {}))
        d["stream"] = bool(row.get("stream", False))
        return cls(**d)


KEY_FIELDS = tuple(f.name for f in dataclasses.fields(MethodKey))

# one round-robin pass over the drafters, then the prompt's hindsight-best one: what any bandit that starts
# with that pass (MetaSD-UCB, UCBSpec) can reach at best on a generation this long
CEILING = "one pass + hindsight drafter"


def key_of(row: dict) -> dict:
    """The method key fields of a row, a run or a key dict: pass it back as `one(metrics, **key)`."""
    return {f: row.get(f) for f in KEY_FIELDS}


def label(key: dict) -> str:
    """The display name of a method: made here, when the report renders, and nowhere else."""
    fam, d, k = key.get("family"), key.get("drafter"), key.get("k")
    if fam == "ar":
        return "AR"
    if fam == "fixed":
        return f"{d} K={k}"
    if fam == "specdecpp":
        return f"{d} SpecDec++"
    if fam == "oracle":
        return f"{d} oracle"
    if fam == "router":
        return f"router:{key.get('router')}"
    if fam == "bandit":
        name = BANDITS[key["bandit"]][0] if key.get("bandit") in BANDITS else str(key.get("bandit"))
        return name + (" (stream)" if key.get("stream") else "")
    if fam == "ceiling":
        return CEILING
    if fam == "domain":
        return "domain drafter SpecDec++" if key.get("policy") == "specdecpp" else f"domain drafter K={k}"
    if fam == "hindsight":
        return f"hindsight-best drafter K={k}"
    if fam == "spectr":
        return f"SpecTr {d} K={dict(key.get('params') or {}).get('drafts')} L={k}"
    if fam == "cascade":
        ps = dict(key.get("params") or {})
        return f"{CASCADE_NAMES.get(ps.get('rule'), ps.get('rule'))} {d} alpha={ps.get('alpha')}"
    if fam == "model_free":
        return str(dict(key.get("params") or {}).get("arm"))
    if fam == "eagle":
        draft = dict(key.get("params") or {}).get("draft")
        if key.get("bandit"):
            return "MetaEagle-UCB (" + {"be": "BE", "bd": "BD"}.get(key.get("reward"), str(key.get("reward"))) + ")"
        return f"EAGLE {d} K={k}" if draft == "chain" else f"EAGLE {d} {draft}"
    if fam == "batched":  # the batched decoder's throughput rows (the batch size is their table's column)
        pol = key.get("policy")
        if pol == "ucbspec":
            return f"{d} UCBSpec lengths 0..{k}"
        if pol == "specdecpp-lockstep":
            return f"{d} SpecDec++ lockstep"
        if pol == "batch-aware-lockstep":
            return f"{d} batch-aware SpecDec++ (lockstep)"
        if pol == "global-budget":
            return f"{d} global verify budget K={k}"
        # fixed K and SpecDec++ are named as their batch-1 families are
        return "batched AR" if pol == "ar" else label({**key, "family": pol, "policy": None, "params": {}})
    # a family this module has no name for (a new decoder): its key fields, so it still renders
    parts = [str(fam)] + ([d] if d else []) + ([f"K={k}"] if k is not None else [])
    parts += [f"{n}={v}" for n, v in sorted((key.get("params") or {}).items())]
    return " ".join(parts)


