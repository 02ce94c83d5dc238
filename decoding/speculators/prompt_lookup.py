"""Prompt lookup decoding: a model-free drafter (Saxena 2023; transformers' `prompt_lookup_num_tokens`).

Find the last n-gram of the context (prompt and text so far) earlier in the context and propose the
tokens that followed it there. It costs no forward pass, and it pays off whenever the output copies from
the prompt (summaries, code edits, quoting) or repeats itself.

The proposal is a point mass: q_i = one-hot(y_i). Under greedy decoding q is never read. Under sampling
speculative sampling stays lossless with it: y is accepted with probability min(1, p(y) / 1) = p(y), and
on rejection the residual norm((p - q)_+) is p with y removed and renormalised, so every token x != y is
emitted with probability (1 - p(y)) p(x) / (1 - p(y)) = p(x).
"""
from __future__ import annotations

import torch

from specdraft.decoding.compat import vocab_size
from specdraft.core.errors import InputError, require_int
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculators.protocol import Draft, RoundOutcome


def lookup(context: list[int], ngram: int, max_tokens: int, min_ngram: int = 1) -> list[int]:
    """The tokens that followed the most recent earlier occurrence of the context's last n-gram.

    Tries n = ngram, ngram - 1, ..., min_ngram and stops at the first n with a match (longer matches
    predict better). The continuation may run into the final n-gram itself: it is all committed text.
    Returns at most max_tokens tokens; [] when nothing matches.
    """
    T = len(context)
    for n in range(min(ngram, T - 1), min_ngram - 1, -1):
        suffix = context[T - n :]
        # most recent match first: start positions T-n-1 down to 0 (T-n is the suffix itself)
        for start in range(T - n - 1, -1, -1):
            if context[start : start + n] == suffix:
                follow = start + n
                return context[follow : follow + max_tokens]
    return []


def point_mass_draft(tokens: list[int], vocab: int, eos: set[int]) -> Draft:
    """A model-free draft: the tokens cut after the first EOS (drafting past it is wasted work), q the
    (k, V) point masses on them, no forward pass. Every model-free speculator returns this."""
    for i, t in enumerate(tokens):
        if t in eos:
            tokens = tokens[: i + 1]
            break
    q = torch.zeros(len(tokens), vocab)
    q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return Draft(tokens=list(tokens), q=q, n_forwards=0)


def target_vocab(target: torch.nn.Module, who: str) -> int:
    vocab = vocab_size(target)
    if vocab is None:
        raise InputError(f"{who} needs the target's vocabulary size (target.config.vocab_size)")
    return vocab


class ModelFreeSpeculator:
    """What the model-free speculators (prompt lookup, REST, suffix decoding) share: `start` reads the
    target's vocabulary (their drafts are point masses over it) and the EOS set to cut drafts at;
    `observe` learns nothing. Subclasses name themselves in `who` and return `self.point_masses(tokens)`."""

    who = "a model-free speculator"
    vocab: int | None = None
    eos: frozenset[int] | set[int] = frozenset()

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        self.vocab = target_vocab(target, self.who)
        self.eos = eos

    def point_masses(self, tokens: list[int]) -> Draft:
        if self.vocab is None:
            raise RuntimeError(f"{type(self).__name__}.propose() before start(target, eos)")
        return point_mass_draft(tokens, self.vocab, self.eos)

    def observe(self, outcome: RoundOutcome) -> None:
        pass


class PromptLookupSpeculator(ModelFreeSpeculator):
    """Implements `decoding.speculators.protocol.Speculator` without a model: propose the continuation of the last
    n-gram's previous occurrence (see `lookup`), at most `max_tokens` tokens, cut after an EOS token."""

    who = "prompt lookup"

    def __init__(self, ngram: int = 3, max_tokens: int = 10, min_ngram: int = 1):
        for name, value in (("ngram", ngram), ("max_tokens", max_tokens), ("min_ngram", min_ngram)):
            require_int(value, f"prompt lookup {name}")
        if min_ngram > ngram:
            raise InputError(f"prompt lookup min_ngram ({min_ngram}) must be <= ngram ({ngram})")
        self.ngram = ngram
        self.max_tokens = max_tokens
        self.min_ngram = min_ngram

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        return self.point_masses(lookup(context, self.ngram, min(self.max_tokens, max_tokens), self.min_ngram))

    def __repr__(self) -> str:
        return f"PromptLookupSpeculator(ngram={self.ngram}, max_tokens={self.max_tokens})"
