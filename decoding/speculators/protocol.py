"""The speculator seam: whatever proposes draft tokens for the verification loop.

The loop in `decoding.speculative` only ever calls

    speculator.start(target, eos)                              # a new generation begins
    draft = speculator.propose(context, max_tokens, sampling, generator)
    speculator.observe(outcome)                                # what verification did with it

so a bandit over several drafters, a multi-draft selector or a drafter with a cascade target plugs in
by implementing these three methods. A speculator owns its drafters' KV caches: it compares what each
cache holds with the committed `context` and catches up on unseen tokens itself (the catch-up forward
is part of `propose`, so its time and forward count land in the draft column).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.rounds.verify import Verification

if TYPE_CHECKING:
    from specdraft.decoding.rounds.tree import DraftTree


@dataclass
class Draft:
    tokens: list[int]  # y_1..y_k, k >= 0
    q: torch.Tensor  # (k, V) float32 on CPU: the distributions y_i were sampled from
    n_forwards: int  # draft forward passes spent on this proposal (catch-up included)
    # (k - 1, H) e_1..e_{k-1}, the hidden states of the fed draft tokens (the stopping policy read them,
    # up to the decision that stopped the round); None when the policy reads none
    hidden: torch.Tensor | None = None
    # (k, V) the drafter's raw logits behind q, on its device (None for model-free drafters): under greedy
    # decoding q is one-hot, and MetaSD's block-divergence reward reads the model's own distribution
    logits: torch.Tensor | None = None
    # a draft tree (SpecTr's K i.i.d. drafts merged into a trie, or any tree) instead of a chain; then
    # tokens / q are the tree's nodes in index order (tree.tokens / tree.q) and the loop verifies the tree
    # in one tree-masked target forward. None for a chain: a chain draft is exactly what it always was.
    tree: "DraftTree | None" = None


@dataclass
class RoundOutcome:
    """What the loop tells the speculator after verifying one draft."""

    draft: Draft
    p: torch.Tensor  # (k+1, V) the verification distribution used
    verification: Verification
    context: list[int]  # the committed context after this round (the loop's own list: read it, do not mutate)
    logits: torch.Tensor | None = None  # (k+1, V) the target's raw logits behind p, on its device
    # for a tree draft: the accepted node indices (p and logits then have 1 + N rows: root, then nodes)
    path: list[int] | None = None
    # the target's final hidden states at every position the round's forward fed (the unseen context, then
    # the draft tokens or tree nodes), on its device; only when the speculator sets needs_target_features
    # (an EAGLE drafter reads them as features), else None
    target_hidden: torch.Tensor | None = None
    # which `hidden_states` target_hidden concatenates, H columns each ((-1,): the final one; the speculator's
    # `target_feature_layers`, a bandit's union over its arms); each EAGLE drafter takes its own columns
    feature_layers: tuple[int, ...] = (-1,)


class Speculator(Protocol):
    def start(self, target: torch.nn.Module, eos: set[int]) -> None: ...

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft: ...

    def observe(self, outcome: RoundOutcome) -> None: ...


def common_prefix(a: list[int], b: list[int], start: int = 0) -> int:
    """Length of the longest common prefix of a and b, given that the first `start` tokens agree."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i
