"""A token datastore with a suffix array: the retrieval structure behind REST and suffix decoding.

REST (He et al., 2024, §3) and SuffixDecoding (Oliaro et al., 2024, §3) both answer one question per
round: "where did the last m tokens of the context occur before, and what followed them?". A suffix
array answers it for any m in O(m log N) without a model:

    tokens        every sequence's token ids, concatenated, each followed by SEPARATOR (-1, never a token)
    suffix_array  start positions of all suffixes of `tokens` in lexicographic order

The positions whose suffix starts with a pattern form one contiguous range of the suffix array
(`match_range`); the longest context suffix that occurs is found by bisection over its length (if the
last m tokens occur, so do the last m - 1). What follows the occurrences is gathered into a
`Continuations` matrix (one row per occurrence, SEPARATOR-padded after a sequence ends).

Drafts are read off that matrix: `most_frequent_chain` follows the most frequent next token one level at
a time (REST's trie, its top branch only; SuffixDecoding's greedy expansion scored by empirical
probability). A draft TREE is the same matrix grouped by prefix (REST keeps its top branches): the
tree-verification piece can take `Continuations.windows` as is.

The suffix array is built by libdivsufsort (pydivsufsort, which sorts integer arrays in C, O(N log N));
only the pattern search is written here, because pydivsufsort's `sa_search` takes bytes only.

On disk (`save` / `load`): one safetensors file (tokens int32, suffix_array int64) and a JSON file with
the counts and where the sequences came from; nothing is pickled.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from specdraft.core.errors import InputError

SEPARATOR = -1  # ends every sequence: sorts before every token id and never matches a pattern
TENSORS = "datastore.safetensors"
META = "datastore.json"
FORMAT = "specdraft-datastore/1"
# Below this many tokens a Python sort of the suffixes beats libdivsufsort's per-call overhead (about
# 1 ms through ctypes, more on a busy machine): the per-request index is rebuilt every round.
SMALL = 512


@dataclass
class Continuations:
    """What followed the occurrences of the matched context suffix.

    match_length: m, the number of context tokens matched (0: no match at all)
    occurrences: how many times the matched suffix occurs (before sampling down to the rows below)
    windows: (rows, depth) int64: the tokens after each occurrence sampled, SEPARATOR where a sequence
        ended (and everything after it). A draft tree groups these rows by prefix.
    """

    match_length: int
    occurrences: int
    windows: np.ndarray

    @staticmethod
    def none(depth: int = 0) -> "Continuations":
        return Continuations(0, 0, np.full((0, depth), SEPARATOR, dtype=np.int64))


def most_frequent_chain(cont: Continuations, max_tokens: int, min_prob: float = 0.0) -> tuple[list[int], list[float]]:
    """Follow the most frequent next token level by level (ties: the smaller token id).

    At level i the rows that agree with the chain so far vote; the winner's empirical probability is
    its share of the votes, and the chain's path probability is the product of those shares
    (SuffixDecoding §3.2's score of a node). The chain stops at max_tokens, when no row continues, or
    when the path probability would fall below min_prob. Returns (tokens, path probabilities).
    """
    rows = cont.windows
    tokens: list[int] = []
    path: list[float] = []
    prob = 1.0
    for i in range(min(max_tokens, rows.shape[1])):
        col = rows[:, i]
        col = col[col != SEPARATOR]
        if col.size == 0:
            break
        values, counts = np.unique(col, return_counts=True)
        best = int(counts.argmax())  # np.unique sorts, so a tie goes to the smaller id
        share = counts[best] / rows.shape[0]  # rows that ended count against continuing
        if prob * share < min_prob:
            break
        prob *= float(share)
        y = int(values[best])
        tokens.append(y)
        path.append(prob)
        rows = rows[rows[:, i] == y]
    return tokens, path


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """Start positions of the suffixes of tokens (int32, SEPARATOR = -1 allowed) in lexicographic order
    (a suffix that is a prefix of another sorts first): libdivsufsort, or a plain sort when short."""
    if len(tokens) <= SMALL:
        seq = tokens.tolist()
        return np.asarray(sorted(range(len(seq)), key=lambda i: seq[i:]), dtype=np.int64)
    from pydivsufsort import divsufsort

    return np.asarray(divsufsort(tokens), dtype=np.int64)


class SuffixIndex:
    """A suffix array over token sequences (see the module docstring)."""

    def __init__(self, tokens: np.ndarray, suffix_array: np.ndarray, n_sequences: int):
        self.tokens = tokens  # (N,) int32
        self.suffix_array = suffix_array  # (N,) int64
        self.n_sequences = n_sequences
        self.bytes_read = 0  # token and suffix-array bytes the queries touched (Table 2's bandwidth column)

    @staticmethod
    def build(sequences: Iterable[Iterable[int]]) -> "SuffixIndex":
        parts, n = [], 0
        for seq in sequences:
            arr = np.asarray(list(seq), dtype=np.int64)
            if arr.size and int(arr.min()) < 0:
                raise InputError("datastore sequences must hold token ids >= 0 (negative ids are reserved)")
            parts.append(arr)
            parts.append(np.array([SEPARATOR], dtype=np.int64))
            n += 1
        if not n:
            raise InputError("the datastore needs at least one sequence (the distill-data stage's responses)")
        tokens = np.concatenate(parts).astype(np.int32)
        return SuffixIndex(tokens, suffix_array(tokens), n)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.suffix_array.nbytes)

    def _bound(self, pattern: list[int], upper: bool) -> int:
        """First suffix-array rank whose suffix, cut to len(pattern), is > pattern (upper) or >= (lower)."""
        m = len(pattern)
        lo, hi = 0, len(self)
        toks, sa = self.tokens, self.suffix_array
        while lo < hi:
            mid = (lo + hi) // 2
            s = int(sa[mid])
            head = toks[s : s + m].tolist()  # list comparison is lexicographic, a shorter prefix sorts first
            self.bytes_read += 8 + 4 * len(head)
            if head < pattern or (upper and head == pattern):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def match_range(self, pattern: list[int]) -> tuple[int, int]:
        """Suffix-array ranks [lo, hi) of the suffixes that start with pattern (lo == hi: no occurrence)."""
        lo = self._bound(pattern, upper=False)
        return lo, self._bound(pattern, upper=True)

    def longest_match(self, context: list[int], max_match: int, end: int | None = None) -> tuple[int, int, int]:
        """(m, lo, hi): the longest suffix of context, m <= max_match, that occurs, and its rank range.

        end: only occurrences that leave at least one token after them inside [0, end) count (the
        per-request index passes its own length, so the context's own suffix, which has no continuation
        yet, is not a match). Bisection over m: occurrence is monotone in m."""
        best = (0, 0, 0)
        lo_m, hi_m = 1, min(max_match, len(context))
        while lo_m <= hi_m:
            m = (lo_m + hi_m) // 2
            pattern = context[len(context) - m :]
            if end is None:  # existence needs the lower bound only; the upper one once, for the best m
                lo = self._bound(pattern, upper=False)
                s = int(self.suffix_array[lo]) if lo < len(self) else 0
                found, hi = lo < len(self) and self.tokens[s : s + m].tolist() == pattern, None
            else:
                lo, hi = self.match_range(pattern)
                found = bool(np.count_nonzero(self.suffix_array[lo:hi] + m < end))
            if found:
                best = (m, lo, hi)
                lo_m = m + 1
            else:
                hi_m = m - 1
        m, lo, hi = best
        if m and hi is None:
            hi = self._bound(context[len(context) - m :], upper=True)
        return m, lo, hi

    def continuations(self, context: list[int], max_match: int, depth: int, max_rows: int = 256,
                      end: int | None = None) -> Continuations:
        """The `depth` tokens after each occurrence of the longest matching context suffix.

        More than max_rows occurrences are thinned to max_rows evenly spaced ranks: the range is sorted
        by what follows, so even spacing keeps the continuations' frequencies (a stratified sample)."""
        m, lo, hi = self.longest_match(context, max_match, end)
        if m == 0 or depth < 1:
            return Continuations.none(max(depth, 0))
        starts = self.suffix_array[lo:hi] + m
        if end is not None:
            starts = starts[starts < end]
        count = int(starts.shape[0])
        if count > max_rows:
            starts = starts[(np.arange(max_rows) * count) // max_rows]
        idx = starts[:, None] + np.arange(depth)[None, :]  # (rows, depth)
        limit = len(self) if end is None else end
        self.bytes_read += 8 * count + 4 * idx.size
        windows = np.where(idx < limit, self.tokens[np.minimum(idx, len(self) - 1)], SEPARATOR).astype(np.int64)
        # a sequence's end cuts its row: everything from the first SEPARATOR on is SEPARATOR
        ended = np.cumsum(windows == SEPARATOR, axis=1) > 0
        windows[ended] = SEPARATOR
        return Continuations(m, count, windows)

    # ---- on disk ---------------------------------------------------------------------------------

    def save(self, directory: str | Path, meta: dict | None = None) -> dict:
        """Write datastore.safetensors + datastore.json into directory; returns the JSON written."""
        from safetensors.numpy import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({"tokens": self.tokens, "suffix_array": self.suffix_array}, str(directory / TENSORS))
        info = {"format": FORMAT, "tokens": len(self) - self.n_sequences, "sequences": self.n_sequences,
                "bytes": self.nbytes, **(meta or {})}
        (directory / META).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        return info

    @staticmethod
    def load(directory: str | Path) -> "SuffixIndex":
        from safetensors.numpy import load_file

        directory = Path(directory)
        if not (directory / TENSORS).is_file() or not (directory / META).is_file():
            raise InputError(f"'{directory}' holds no datastore ({TENSORS} + {META}); re-export the bundle")
        info = json.loads((directory / META).read_text())
        if info.get("format") != FORMAT:
            raise InputError(f"datastore format {info.get('format')!r} is not {FORMAT!r}; re-export the bundle")
        arrays = load_file(str(directory / TENSORS))
        tokens, sa = arrays.get("tokens"), arrays.get("suffix_array")
        if tokens is None or sa is None or tokens.shape != sa.shape or tokens.ndim != 1:
            raise InputError(f"'{directory / TENSORS}' lacks matching 1-D 'tokens' and 'suffix_array'; re-export")
        return SuffixIndex(tokens.astype(np.int32, copy=False), sa.astype(np.int64, copy=False), int(info["sequences"]))


@dataclass
class DatastoreBuild:
    index: SuffixIndex
    seconds: float
    meta: dict = field(default_factory=dict)


def build_datastore(sequences: Iterable[Iterable[int]], source: str = "") -> DatastoreBuild:
    """Build the suffix index and time it (the export manifest records both)."""
    t0 = time.perf_counter()
    index = SuffixIndex.build(sequences)
    seconds = time.perf_counter() - t0
    # the build time goes to the export manifest's metrics, not into the bundle: bundle.json and
    # datastore.json must be the same bytes on every rebuild of the same inputs
    return DatastoreBuild(index, seconds, {"source": source})
