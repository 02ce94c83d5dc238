"""The drafter chain: a causal-LM drafter behind the `Speculator` seam (`decoding.speculators.protocol`), and the
chain drafting loop it shares with EAGLE's chain drafter.
"""
from __future__ import annotations

import time

import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.compat import check_head, check_pair
from specdraft.decoding.rounds.sampling import SamplingConfig, probs_on_cpu, sample
from specdraft.decoding.speculators.protocol import Draft, RoundOutcome, common_prefix
from specdraft.decoding.policies.stopping import StoppingPolicy


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
        costs exactly k forwards (`decoding.rounds.lengths`): y_k is never fed in its own round."""
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
    candidates costs exactly k forwards (`decoding.rounds.lengths`): y_k is never fed in its own round."""
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
