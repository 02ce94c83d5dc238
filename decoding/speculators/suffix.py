"""Suffix decoding (Oliaro et al., 2024, "SuffixDecoding"), a model-free drafter with two structures:

  global       a suffix index over earlier outputs: the self-distilled responses shipped in the bundle
  per request  a suffix index over this request's prompt and output so far (rebuilt when it grew)

Each round (SuffixDecoding §3.2): in each structure, match the longest suffix of the context (at most
`max_match` tokens; its length is p), and grow a candidate greedily from the continuations, scoring a
node by its empirical probability (the product of next-token frequency shares along the path) and
stopping below `min_prob`. The speculation length adapts to the match: at most ceil(spec_factor * p)
tokens (the paper's MAX_SPEC = alpha * p), since a long match predicts a long agreement. The candidate
with the higher score (the sum of its nodes' probabilities, the expected number of accepted tokens under
the frequency model) is drafted; ties go to the per-request one (recent text). The paper grows a tree
(top nodes by probability); the loop verifies chains, so the candidate here is the tree's greedy path.

The structures are suffix arrays (`decoding.speculators.datastore.SuffixIndex`), not suffix trees: the same
longest-match and continuation queries, built in C by libdivsufsort; the per-request one is rebuilt
from scratch each round it grew (O(T log T) in C for a T-token context, microseconds at these sizes)
instead of being extended online as the paper's tree is.

q is a point mass, so speculative sampling stays lossless; no forward pass (n_forwards = 0).
"""
from __future__ import annotations

import math

import torch

from specdraft.decoding.speculators.datastore import SuffixIndex, most_frequent_chain
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.prompt_lookup import ModelFreeSpeculator
from specdraft.decoding.speculators.rest import check_positive
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculators.protocol import Draft


class SuffixSpeculator(ModelFreeSpeculator):
    """Implements `decoding.speculators.protocol.Speculator` (see the module docstring). index=None: the
    per-request structure only (a bundle without a datastore)."""

    who = "suffix decoding"

    def __init__(self, index: SuffixIndex | None = None, max_tokens: int = 8, max_match: int = 32,
                 spec_factor: float = 1.0, min_prob: float = 0.1, max_rows: int = 256):
        if index is not None and not isinstance(index, SuffixIndex):
            raise InputError("suffix decoding's global structure must be a decoding.speculators.datastore.SuffixIndex or None")
        check_positive("suffix decoding", max_tokens=max_tokens, max_match=max_match, max_rows=max_rows)
        if not (isinstance(spec_factor, (int, float)) and spec_factor > 0):
            raise InputError(f"suffix decoding spec_factor must be > 0 (the paper's alpha), got {spec_factor!r}")
        if not (isinstance(min_prob, (int, float)) and 0.0 <= min_prob < 1.0):
            raise InputError(f"suffix decoding min_prob must be in [0, 1), got {min_prob!r}")
        self.index = index
        self.max_tokens = max_tokens
        self.max_match = max_match
        self.spec_factor = float(spec_factor)
        self.min_prob = float(min_prob)
        self.max_rows = max_rows
        self.source = ""  # which structure the latest draft came from: "request", "global" or ""
        self._request: SuffixIndex | None = None
        self._indexed = 0  # context length the per-request index covers
        self.request_bytes_read = 0  # bytes the per-request queries touched (the global index counts its own)

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        super().start(target, eos)
        self._request, self._indexed = None, 0
        self.request_bytes_read = 0

    def _candidate(self, index: SuffixIndex, context: list[int], limit: int, end: int | None):
        cont = index.continuations(context, self.max_match, limit, self.max_rows, end=end)
        if cont.match_length == 0:
            return [], 0.0
        length = min(limit, math.ceil(self.spec_factor * cont.match_length))
        tokens, path = most_frequent_chain(cont, length, self.min_prob)
        return tokens, sum(path)

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        limit = min(self.max_tokens, max_tokens)
        self.source = ""
        if limit <= 0 or len(context) < 2 or self.vocab is None:
            return self.point_masses([])  # nothing to draft (or propose before start: point_masses raises)
        if self._request is None or self._indexed != len(context):
            if self._request is not None:
                self.request_bytes_read += self._request.bytes_read
            self._request, self._indexed = SuffixIndex.build([context]), len(context)
        # end=len(context): the context's own last suffix has no continuation yet and is no match
        best, score = self._candidate(self._request, context, limit, end=len(context)), "request"
        if self.index is not None:
            other = self._candidate(self.index, context, limit, end=None)
            if other[1] > best[1]:
                best, score = other, "global"
        tokens = best[0]
        self.source = score if tokens else ""
        return self.point_masses(tokens)

    def request_bytes(self) -> int:
        """Bytes the per-request queries of this generation touched (see SuffixIndex.bytes_read)."""
        return self.request_bytes_read + (self._request.bytes_read if self._request is not None else 0)

    def __repr__(self) -> str:
        size = len(self.index) if self.index is not None else 0
        return f"SuffixSpeculator(global={size} tokens, max_tokens={self.max_tokens}, alpha={self.spec_factor})"
