"""Which drafter serves which domain: the one definition train-router and evaluate share.

A specialised drafter was trained on some but not all of the training domains; a generalist (the
one-for-all drafter, OFA) on all of them. A domain's own drafter is the specialised drafter with the
fewest domains that covers it (ties by name).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class DrafterRoles:
    special: list[str]  # specialised drafters, sorted by name
    general: list[str]  # generalists, sorted by name
    own: dict[str, str]  # domain -> its specialised drafter
    ofa: str | None  # the generalist with the most domains (ties: the last name), if any


def drafter_roles(domains: Mapping[str, Iterable[str]], everything: Iterable[str] | None = None) -> DrafterRoles:
    """Roles from each drafter's training domains; `everything` is the set of training domains (default:
    every domain some drafter was trained on)."""
    doms = {name: set(d) for name, d in domains.items()}
    every = set(everything) if everything is not None else set().union(*doms.values())
    special = sorted(n for n, d in doms.items() if d and d < every)
    general = sorted(n for n, d in doms.items() if d >= every)
    own: dict[str, str] = {}
    for name in sorted(special, key=lambda n: (len(doms[n]), n)):
        for d in sorted(doms[name]):
            own.setdefault(d, name)
    ofa = max(general, key=lambda n: (len(doms[n]), n)) if general else None
    return DrafterRoles(special, general, own, ofa)
