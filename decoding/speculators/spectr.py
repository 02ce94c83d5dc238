"""SpecTr's speculator: K i.i.d. drafts from one drafter, sampled as a batch, proposed as a draft tree.

Per round (SpecTr Sec. 7, draft set construction eq. (7)):
    catch up on the committed context in one batch-1 drafter forward      -> q at the context end
    K first tokens drawn from it; the cache is repeated into K rows
    then one batched drafter forward per position (K rows, one token each) -> K next-token q rows
    the K sequences are merged into a trie (`decoding.rounds.tree`): the target scores each distinct prefix once
The loop in `decoding.speculative` verifies the tree with k-Seq (SpecTr Alg. 2 + 3) in one target forward.

Stopping: each row keeps its own copy of the stopping policy (fixed L, SpecDec++, ...). A policy's
decision depends only on the row's own prefix, so the drafts through a trie node all continue or all stop
there and the continuations stay i.i.d. given the node (what k-Seq needs). The SpecDec++ head is applied
per row (a small module, not the drafter).

K = 1 proposes a plain chain draft: the batched code path then draws exactly what `DrafterSpeculator`
draws under the same generator, and the loop runs today's speculative sampling on it. Greedy decoding
drafts one chain whatever K is (K greedy drafts are K copies of it).

Drafter cache: after a round it holds K rows; the next `propose` keeps the row that agrees longest with
the committed context (the accepted draft), crops it and catches up, as `DrafterSpeculator` does.
"""
from __future__ import annotations

import copy

import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.compat import check_head, check_pair
from specdraft.core.errors import require_int
from specdraft.decoding.rounds.sampling import SamplingConfig, probs_on_cpu, sample
from specdraft.decoding.speculators.protocol import Draft, RoundOutcome, common_prefix
from specdraft.decoding.policies.stopping import StoppingPolicy
from specdraft.decoding.rounds.tree import trie_from_sequences


def check_drafts(n_drafts: int) -> None:
    require_int(n_drafts, "the number of drafts", hint="use 1 for a single draft")


class SpecTrSpeculator:
    """K i.i.d. drafts per round from one HF causal LM drafter, each stopped by `stopping`."""

    def __init__(self, drafter: torch.nn.Module, stopping: StoppingPolicy, n_drafts: int):
        check_drafts(n_drafts)
        self.drafter = drafter
        self.stopping = stopping
        self.n_drafts = n_drafts
        head = getattr(stopping, "head", None)
        if isinstance(head, torch.nn.Module):
            check_head(head, drafter)
        self.eos: set[int] = set()
        self.device = kv.input_device(drafter)
        self.cache = kv.new_cache()
        self.rows: list[list[int]] = [[]]  # the tokens each cache row holds (all rows the same length)

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        check_pair(target, self.drafter)
        self.eos = eos
        self.device = kv.input_device(self.drafter)
        self.cache = kv.new_cache()
        self.rows = [[]]
        self.stopping.start(self.drafter)

    def _catch_up(self, context: list[int], hidden: bool) -> torch.Tensor:
        """Back to one row (the one agreeing longest with `context`), rolled back and fed the unseen rest;
        returns the drafter's logits (V,) for the token after `context`."""
        agree = [common_prefix(row, context) for row in self.rows]
        best = max(range(len(self.rows)), key=agree.__getitem__)
        if len(self.rows) > 1:
            kv.select_row(self.cache, best)
        keep = min(agree[best], len(context) - 1)  # feed >= 1 token: its logits start the round
        kv.crop(self.cache, keep)
        logits, _ = kv.forward(self.drafter, self.cache, context[keep:], hidden=hidden, device=self.device)
        self.rows = [list(context)]
        return logits[-1]

    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        limit = min(self.stopping.max_tokens, max_tokens)
        # greedy drafts are deterministic: K of them would be K copies of one chain
        K = 1 if sampling.greedy else self.n_drafts
        policies = [copy.copy(self.stopping) for _ in range(K)]  # per-row round state (shallow: shared head)
        for policy in policies:
            policy.start_round(context)
        if limit <= 0 or policies[0].stop(0, None):  # the target alone emits the next token
            return Draft(tokens=[], q=torch.empty(0, 0), n_forwards=0)
        need_hidden = self.stopping.needs_hidden
        logits = self._catch_up(context, hidden=False)  # e_0 is never read (SpecDec++ Alg. 1)
        n_forwards = 1
        q_next = probs_on_cpu(logits, sampling).expand(K, -1)  # (K, V): every row starts from the same q
        hidden = None  # (K, H): e_{k-1} of each row once y_{k-1} has been fed
        tokens: list[list[int]] = [[] for _ in range(K)]
        qs: list[list[torch.Tensor]] = [[] for _ in range(K)]
        active = [True] * K
        while True:
            # SpecDec++ Alg. 1 order, per row: sample y_k ~ q_k, then decision k (reading e_{k-1});
            # a stopped row submits y_k without feeding it, so k candidates cost k forwards
            y = q_next.argmax(-1) if sampling.greedy else sample(q_next, generator)  # (K,) one draw per row
            for r in range(K):
                if not active[r]:
                    continue
                tokens[r].append(int(y[r]))
                qs[r].append(q_next[r])
                if (len(tokens[r]) == limit or int(y[r]) in self.eos
                        or policies[r].stop(len(tokens[r]), None if hidden is None else hidden[r])):
                    active[r] = False
            if not any(active):
                break
            if len(self.rows) == 1 and K > 1:
                kv.repeat_rows(self.cache, K)
                self.rows = [list(self.rows[0]) for _ in range(K)]
            logits, states = kv.forward_batch(self.drafter, self.cache, y, hidden=need_hidden, device=self.device)
            for r in range(K):
                self.rows[r].append(int(y[r]))  # finished rows are fed too (one batch); never read back
            n_forwards += 1
            q_next = probs_on_cpu(logits, sampling)
            hidden = states
        vocab = q_next.shape[-1]
        if K == 1:  # a chain draft: exactly `DrafterSpeculator`'s proposal
            q = torch.stack(qs[0]) if qs[0] else torch.empty(0, vocab)
            return Draft(tokens=tokens[0], q=q, n_forwards=n_forwards)
        drafted = [r for r in range(K) if tokens[r]]
        if not drafted:
            return Draft(tokens=[], q=torch.empty(0, vocab), n_forwards=n_forwards)
        tree = trie_from_sequences([tokens[r] for r in drafted], [torch.stack(qs[r]) for r in drafted])
        return Draft(tokens=tree.tokens, q=tree.q, n_forwards=n_forwards, tree=tree)

    def observe(self, outcome: RoundOutcome) -> None:
        pass  # rollback happens lazily in the next `_catch_up`, against the committed context


def drafter_speculator(drafter: torch.nn.Module, stopping: StoppingPolicy, n_drafts: int = 1):
    """The speculator for one drafter: `DrafterSpeculator` for a single draft (today's speculative
    sampling), `SpecTrSpeculator` for K > 1 i.i.d. drafts per round (SpecTr). Use it wherever a drafter
    and a stopping policy become a speculator (the CLI, evaluation plans, benchmarks)."""
    check_drafts(n_drafts)
    if n_drafts == 1:
        from specdraft.decoding.speculators.drafter import DrafterSpeculator

        return DrafterSpeculator(drafter, stopping)
    return SpecTrSpeculator(drafter, stopping, n_drafts)
