"""REST: retrieval-based speculative decoding (He et al., 2024), a model-free drafter over a datastore.

The datastore (`decoding.datastore.SuffixIndex`) holds the self-distilled training responses, i.e. text
the target itself wrote. Each round (REST §3.2-3.3):

  1. retrieval: the longest suffix of the context, at most `max_match` tokens (REST: 16), that occurs in
     the datastore (exact match, longest first);
  2. the continuations of its occurrences (at most `max_rows` of them, an even sample of the range);
  3. draft construction: REST builds a trie of the continuations and keeps its most frequent branches
     as a draft tree. Here the loop verifies chains, so the draft is the trie's most frequent path
     (`most_frequent_chain`); tree verification can take `Continuations.windows` directly.

The draft is deterministic given the context: q is a point mass, so speculative sampling stays lossless
(see `decoding.prompt_lookup`). No forward pass: n_forwards = 0.
"""
from __future__ import annotations

import torch

from decoding.datastore import Continuations, SuffixIndex, most_frequent_chain
from core.errors import InputError
from decoding.prompt_lookup import point_mass_draft, target_vocab
from decoding.sampling import SamplingConfig
from decoding.speculator import Draft, RoundOutcome


def check_positive(who: str, **values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{who} {name} must be an integer >= 1, got {value!r}")


class RestSpeculator:
    """Implements `decoding.speculator.Speculator`: the most frequent continuation of the longest context
    suffix found in the datastore, at most max_tokens tokens, cut after an EOS token."""

    def __init__(self, index: SuffixIndex, max_tokens: int = 8, max_match: int = 16, max_rows: int = 256):
        if not isinstance(index, SuffixIndex):
            raise InputError("REST needs a datastore (decoding.datastore.SuffixIndex; bundle.load_datastore())")
        check_positive("REST", max_tokens=max_tokens, max_match=max_match, max_rows=max_rows)
        self.index = index
        self.max_tokens = max_tokens
        self.max_match = max_match
        self.max_rows = max_rows
        self.eos: set[int] = set()
        self.vocab: int | None = None
        self.last: Continuations | None = None  # the latest retrieval (for tree drafts and diagnostics)

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        self.vocab = target_vocab(target, "REST")
        self.eos = eos

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        if self.vocab is None:
            raise RuntimeError("RestSpeculator.propose() before start(target, eos)")
        limit = min(self.max_tokens, max_tokens)
        if limit <= 0:
            return point_mass_draft([], self.vocab, self.eos)
        self.last = self.index.continuations(context, self.max_match, limit, self.max_rows)
        tokens, _ = most_frequent_chain(self.last, limit)
        return point_mass_draft(tokens, self.vocab, self.eos)

    def observe(self, outcome: RoundOutcome) -> None:
        pass

    def __repr__(self) -> str:
        return f"RestSpeculator(datastore={len(self.index)} tokens, max_tokens={self.max_tokens})"
