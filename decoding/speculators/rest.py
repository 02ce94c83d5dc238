"""REST: retrieval-based speculative decoding (He et al., 2024), a model-free drafter over a datastore.

The datastore (`decoding.speculators.datastore.SuffixIndex`) holds the self-distilled training responses, i.e. text
the target itself wrote. Each round (REST §3.2-3.3):

  1. retrieval: the longest suffix of the context, at most `max_match` tokens (REST: 16), that occurs in
     the datastore (exact match, longest first);
  2. the continuations of its occurrences (at most `max_rows` of them, an even sample of the range);
  3. draft construction: REST builds a trie of the continuations and keeps its most frequent branches
     as a draft tree. Here the loop verifies chains, so the draft is the trie's most frequent path
     (`most_frequent_chain`); tree verification can take `Continuations.windows` directly.

The draft is deterministic given the context: q is a point mass, so speculative sampling stays lossless
(see `decoding.speculators.prompt_lookup`). No forward pass: n_forwards = 0.
"""
from __future__ import annotations

import torch

from specdraft.decoding.speculators.datastore import Continuations, SuffixIndex, most_frequent_chain
from specdraft.core.errors import InputError, require_int
from specdraft.decoding.speculators.prompt_lookup import ModelFreeSpeculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculators.protocol import Draft


def check_positive(who: str, **values) -> None:
    for name, value in values.items():
        require_int(value, f"{who} {name}")


class RestSpeculator(ModelFreeSpeculator):
    """Implements `decoding.speculators.protocol.Speculator`: the most frequent continuation of the longest context
    suffix found in the datastore, at most max_tokens tokens, cut after an EOS token."""

    who = "REST"

    def __init__(self, index: SuffixIndex, max_tokens: int = 8, max_match: int = 16, max_rows: int = 256):
        if not isinstance(index, SuffixIndex):
            raise InputError("REST needs a datastore (decoding.speculators.datastore.SuffixIndex; bundle.load_datastore())")
        check_positive("REST", max_tokens=max_tokens, max_match=max_match, max_rows=max_rows)
        self.index = index
        self.max_tokens = max_tokens
        self.max_match = max_match
        self.max_rows = max_rows
        self.last: Continuations | None = None  # the latest retrieval (for tree drafts and diagnostics)

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        limit = min(self.max_tokens, max_tokens)
        if limit <= 0 or self.vocab is None:
            return self.point_masses([])  # nothing to draft (or propose before start: point_masses raises)
        self.last = self.index.continuations(context, self.max_match, limit, self.max_rows)
        tokens, _ = most_frequent_chain(self.last, limit)
        return self.point_masses(tokens)

    def __repr__(self) -> str:
        return f"RestSpeculator(datastore={len(self.index)} tokens, max_tokens={self.max_tokens})"
