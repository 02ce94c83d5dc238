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

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from specdraft.decoding import kv
from specdraft.decoding.compat import check_head, check_pair
from specdraft.decoding.sampling import SamplingConfig, probs_on_cpu, sample
from specdraft.decoding.stopping import StoppingPolicy
from specdraft.decoding.verify import Verification

if TYPE_CHECKING:
    from specdraft.decoding.tree import DraftTree


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
        self.catch_up_seconds = 0.0  # time of the last proposal's first forward (catch-up + q_1)

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        check_pair(target, self.drafter)
        self.eos = eos  # drafting past EOS is wasted work
        self.device = kv.input_device(self.drafter)
        self.cache = kv.new_cache()
        self.fed = []
        self._committed = 0
        self.catch_up_seconds = 0.0
        self.stopping.start(self.drafter)

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
        """SpecDec++ Alg. 1 order: the forward on y_{i-1} gives q_i (and e_{i-1}); sample y_i ~ q_i; then
        ask the policy (decision i, reading e_{i-1}); on stop submit y_1..y_i. A round of k candidates
        costs exactly k forwards (`decoding.rounds`): y_k is never fed in its own round."""
        policy = self.stopping
        limit = min(policy.max_tokens, max_tokens)
        policy.start_round(context)
        if limit <= 0 or policy.stop(0, None):  # the target alone emits the next token: no draft forward
            return Draft(tokens=[], q=torch.empty(0, 0), n_forwards=0)
        t0 = time.perf_counter()
        logits, _ = self._catch_up(context, hidden=False)  # e_0 is never read (Alg. 1: "if i > 1")
        q_first = probs_on_cpu(logits, sampling)  # (V,) q_1; the copy to CPU waits for the forward
        self.catch_up_seconds = time.perf_counter() - t0

        def step(y: int, hidden: bool):
            out, states = kv.forward(self.drafter, self.cache, [y], hidden=hidden, device=self.device)
            self.fed.append(y)
            return out[-1], (states[-1] if hidden else None)  # e_k: final hidden state at y_k

        return draft_chain(logits, q_first, step, policy, limit, sampling, generator, self.eos, self.keep_logits)

    def observe(self, outcome: RoundOutcome) -> None:
        pass  # rollback happens lazily in the next `_catch_up`, against the committed context



def draft_chain(logits: torch.Tensor, q_first: torch.Tensor, step, policy: StoppingPolicy, limit: int,
                sampling: SamplingConfig, generator: torch.Generator | None, eos: set[int], keep_logits: bool) -> Draft:
    """The chain drafting loop every chain drafter shares, in SpecDec++ Alg. 1 order: the forward on y_{i-1}
    gave q_i (and e_{i-1}); sample y_i ~ q_i; ask the policy (decision i, reading e_{i-1}); on stop submit
    y_1..y_i. `logits` / `q_first`: the catch-up forward's raw logits and q_1 (one forward already spent);
    `step(y, hidden)` feeds y_k and returns (the logits behind q_{k+1}, e_k or None). A round of k
    candidates costs exactly k forwards (`decoding.rounds`): y_k is never fed in its own round."""
    need_hidden = policy.needs_hidden
    q_next = q_first
    n_forwards = 1
    tokens: list[int] = []
    qs: list[torch.Tensor] = []
    raw: list[torch.Tensor] = []  # the logits behind each q row
    hiddens: list[torch.Tensor] = []
    hidden = None  # e_{k-1} once y_{k-1} has been fed
    while True:
        y = int(q_next.argmax()) if sampling.greedy else int(sample(q_next, generator))
        tokens.append(y)
        qs.append(q_next)
        if keep_logits:
            raw.append(logits)
        if len(tokens) == limit or y in eos:
            break  # the round ends anyway: y_k is submitted without being fed
        if policy.stop(len(tokens), hidden):
            break  # Alg. 1: stop after sampling y_k; it is verified with the others
        logits, state = step(y, need_hidden)
        n_forwards += 1
        q_next = probs_on_cpu(logits, sampling)
        if need_hidden:
            hidden = state  # e_k, read at decision k + 1
            hiddens.append(hidden)
    return Draft(tokens=tokens, q=torch.stack(qs), n_forwards=n_forwards,
                 hidden=torch.stack(hiddens) if hiddens else None, logits=torch.stack(raw) if raw else None)
