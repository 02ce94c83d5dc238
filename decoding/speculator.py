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
from typing import Protocol

import torch

from decoding import kv
from decoding.compat import check_head, check_pair
from decoding.sampling import SamplingConfig, probs_on_cpu, sample
from decoding.stopping import StoppingPolicy
from decoding.verify import Verification


@dataclass
class Draft:
    tokens: list[int]  # y_1..y_k, k >= 0
    q: torch.Tensor  # (k, V) float32 on CPU: the distributions y_i were sampled from
    n_forwards: int  # draft forward passes spent on this proposal (catch-up included)
    # (j, H) e_1..e_j, the hidden states the stopping policy read (j = k, or k - 1 when the round was
    # capped or hit EOS and y_k was never fed); None when the policy reads none
    hidden: torch.Tensor | None = None
    # (k, V) the drafter's raw logits behind q, on its device (None for model-free drafters): under greedy
    # decoding q is one-hot, and MetaSD's block-divergence reward reads the model's own distribution
    logits: torch.Tensor | None = None


@dataclass
class RoundOutcome:
    """What the loop tells the speculator after verifying one draft."""

    draft: Draft
    p: torch.Tensor  # (k+1, V) the verification distribution used
    verification: Verification
    context: list[int]  # the committed context after this round (the loop's own list: read it, do not mutate)
    logits: torch.Tensor | None = None  # (k+1, V) the target's raw logits behind p, on its device


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


class DrafterSpeculator:
    """One HF causal LM drafter and a stopping policy.

    The drafter cache holds `self.fed`, the tokens it has seen. At each proposal it keeps the longest
    prefix of `fed` that is still in the committed context (rollback to the accepted prefix), then feeds
    the rest of the context (the correction/bonus token, or the whole prompt, or everything a bandit
    skipped while this drafter was inactive) in one forward, which gives q_1.
    """

    def __init__(self, drafter: torch.nn.Module, stopping: StoppingPolicy):
        self.drafter = drafter
        self.stopping = stopping
        self.eos: set[int] = set()
        head = getattr(stopping, "head", None)
        if isinstance(head, torch.nn.Module):
            check_head(head, drafter)
        self.device = kv.input_device(drafter)
        self.keep_logits = False  # attach the raw logits to each Draft (read by the greedy BD reward)
        self.cache = kv.new_cache()
        self.fed: list[int] = []
        self._committed = 0  # a prefix length of `fed` known to be committed

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        check_pair(target, self.drafter)
        self.eos = eos  # drafting past EOS is wasted work
        self.device = kv.input_device(self.drafter)
        self.cache = kv.new_cache()
        self.fed = []
        self._committed = 0

    def _catch_up(self, context: list[int], hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Keep at least one token unfed so the forward below yields fresh logits for the next position.
        keep = min(common_prefix(self.fed, context, self._committed), len(context) - 1)
        kv.crop(self.cache, keep)
        logits, states = kv.forward(self.drafter, self.cache, context[keep:], hidden=hidden, device=self.device)
        self.fed = list(context)
        self._committed = len(context)
        return logits[-1], (states[-1] if states is not None else None)

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        policy = self.stopping
        limit = min(policy.max_tokens, max_tokens)
        if limit == 0:  # the target alone emits the last token; no draft forward needed
            return Draft(tokens=[], q=torch.empty(0, 0), n_forwards=0)
        need_hidden = policy.needs_hidden
        logits, _ = self._catch_up(context, hidden=False)  # e_0 is never read
        n_forwards = 1
        q_next = probs_on_cpu(logits, sampling)  # (V,)
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        raw: list[torch.Tensor] = []  # the logits behind each q row
        hiddens: list[torch.Tensor] = []
        hidden = None
        policy.start_round(context)
        while len(tokens) < limit and not policy.stop(len(tokens), q_next, hidden):
            y = int(q_next.argmax()) if sampling.greedy else int(sample(q_next, generator))
            tokens.append(y)
            qs.append(q_next)
            if self.keep_logits:
                raw.append(logits[-1] if logits.ndim == 2 else logits)
            if len(tokens) == limit or y in self.eos:
                break  # the round ends anyway: no need to feed y
            logits, states = kv.forward(self.drafter, self.cache, [y], hidden=need_hidden, device=self.device)
            self.fed.append(y)
            n_forwards += 1
            q_next = probs_on_cpu(logits[-1], sampling)
            if need_hidden:
                hidden = states[-1]  # e_k: final hidden state at y_k
                hiddens.append(hidden)
        q = torch.stack(qs) if qs else torch.empty(0, q_next.shape[-1])
        return Draft(tokens=tokens, q=q, n_forwards=n_forwards, hidden=torch.stack(hiddens) if hiddens else None,
                     logits=torch.stack(raw) if raw else None)

    def observe(self, outcome: RoundOutcome) -> None:
        pass  # rollback happens lazily in the next `_catch_up`, against the committed context

