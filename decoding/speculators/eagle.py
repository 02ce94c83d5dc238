"""EAGLE drafting as a `Speculator`: chain drafts (EAGLE-1 order, any stopping policy) and EAGLE-2's
dynamic draft tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
Trees", Sec. 4), over an `EagleDrafter` (`decoding.speculators.eagle_model`).

Features. The drafter reads the target's feature f_j (final hidden state; for EAGLE-3 its low / middle /
high hidden states concatenated, `target_feature_layers`, which the loop asks the target for) at every
committed position.
The loop hands the target's hidden states of each round's verification forward to `observe`
(`RoundOutcome.target_hidden`, asked for through `needs_target_features`); the speculator keeps the rows of
the committed positions: f_0..f_{m-1} with m = len(context) - 1 (the last committed token has not been
through the target yet). The very first round has no features for the prompt, so it drafts nothing and the
target's prefill produces them (EAGLE's own order: the target prefills and emits the first token).

Cache. The EAGLE layer's KV cache holds entry j for input (f_j, x_{j+1}) at position j. Entries written
from real features are kept; those written while drafting (from predicted features f^) are cut off at the
next proposal, which feeds the newly committed positions with their real features in one forward: the one
that yields q_1 (so a chain of k candidates costs k drafter forwards, as for an independent drafter).
Inside a bandit, an EAGLE arm that sat out keeps recording features (`record_target`), so on a switch only
its own layer's cache catches up (MetaSD App. F.11), never the target.

Trees. Depth 1 is the top-k tokens of q_1; at each further depth the k frontier nodes with the highest
cumulative draft confidence (sum of log q along the path) are expanded in ONE drafter forward with a tree
attention mask (each node sees the committed entries and its expanded ancestors), each offering its top-k
children; after the last depth the top-m nodes of the whole tree (by cumulative confidence; a child never
outscores its parent, so the set is closed under ancestors) go to the target in one tree-masked forward
(`kv.forward_tree`) and `decoding.rounds.tree.verify_tree` walks them. The children of a node are the drafter's
top-k tokens, a deterministic function of the context, i.e. candidates drawn from point masses; the
multi-candidate rule of SpecInfer and EAGLE (recursive rejection over siblings) with q = delta_x accepts x with probability
p(x) and otherwise removes x from p and renormalises (`topk_candidates_select`), so the emitted token is
exactly distributed as p. EAGLE-1's static tree (`StaticTree`) is the same walk over a fixed set of child
ranks: every listed node is drafted and verified.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.compat import check_head, check_pair
from specdraft.core.errors import InputError
from specdraft.decoding.rounds.sampling import SamplingConfig, probs_on_cpu, sample
from specdraft.decoding.speculators.drafter import draft_chain
from specdraft.decoding.speculators.protocol import Draft, RoundOutcome
from specdraft.decoding.policies.stopping import StoppingPolicy
from specdraft.decoding.rounds.tree import DraftTree


def topk_candidates_select(
    p: torch.Tensor, q: torch.Tensor, candidates: Sequence[int], generator: torch.Generator | None = None
) -> tuple[int, int]:
    """The multi-candidate rule for deterministic candidates (distinct tokens chosen without sampling, e.g.
    the drafter's top-k): candidate x stands for a draw from the point mass delta_x, so it is accepted with
    probability min(1, p(x) / 1) = p(x), and on rejection p <- norm((p - delta_x)_+), i.e. p with x
    removed. Lossless for any fixed candidate list; q is not read. Same signature as `NodeRule`."""
    cur = p.clone()
    eta = torch.rand(len(candidates), generator=generator)
    for i, x in enumerate(candidates):
        if float(eta[i]) < float(cur[x]):
            return i, int(x)
        cur[x] = 0.0
        total = cur.sum()
        if total <= 0:  # every token with mass was offered (then one was accepted with probability 1)
            break
        cur = cur / total
    return -1, int(sample(cur, generator))


@dataclass(frozen=True)
class TreeShape:
    """EAGLE-2's dynamic tree: `depth` levels, `top_k` children per expanded node and nodes expanded per
    level, `nodes` (m) kept for verification. EAGLE-2's defaults are depth 6, top-k 10, 60 nodes."""

    depth: int = 4
    top_k: int = 4
    nodes: int = 16

    def __post_init__(self):
        for name in ("depth", "top_k", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"eagle tree {name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class StaticTree:
    """EAGLE-1's static draft tree: `choices` lists the tree's nodes as paths of child ranks from the root
    (rank 0 = the drafter's most likely token after the parent), closed under prefixes; e.g. ((0,), (1,),
    (0, 0), (0, 1), (1, 0), (0, 0, 0)). Every listed node is drafted and verified; the shape never changes."""

    choices: tuple[tuple[int, ...], ...] = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0),
                                             (0, 0, 0, 0))

    def __post_init__(self):
        paths = {tuple(c) for c in self.choices}
        if not paths or any(not c or min(c) < 0 for c in paths):
            raise InputError("a static EAGLE tree needs non-empty paths of child ranks >= 0, e.g. ((0,), (1,), (0, 0))")
        missing = sorted(c[:-1] for c in paths if len(c) > 1 and c[:-1] not in paths)
        if missing:
            raise InputError(f"static EAGLE tree: path {missing[0]} is missing, yet its children are listed; "
                             "list every prefix of every path")
        object.__setattr__(self, "choices", tuple(sorted(paths, key=lambda c: (len(c), c))))

    @property
    def depth(self) -> int:
        return max(len(c) for c in self.choices)

    def ranks(self, path: tuple[int, ...]) -> list[int]:
        """The child ranks listed under the node at `path` (() is the root)."""
        return [c[-1] for c in self.choices if len(c) == len(path) + 1 and c[:-1] == path]


@dataclass
class _Node:
    token: int
    parent: int  # pool index, -1 for a child of the root
    depth: int
    score: float  # cumulative log draft confidence along the path
    q_row: int  # which expanded row's q this token was drawn from (0 = the root)
    path: tuple[int, ...] = ()  # child ranks from the root (a static tree's address)
    kv_index: int = -1  # the node's entry in the EAGLE cache once expanded
    feature: torch.Tensor | None = None  # its predicted feature once expanded


class EagleSpeculator:
    """One EAGLE drafter: chain drafts under `stopping` (fixed K, SpecDec++ head on the EAGLE layer's
    hidden state), an EAGLE-2 dynamic tree (`tree` a TreeShape) or EAGLE-1's static tree (a StaticTree).
    A tree's depth is capped by the stopping policy's max_tokens; its per-token decisions are not consulted."""

    needs_target_features = True

    def __init__(self, drafter: torch.nn.Module, stopping: StoppingPolicy, tree: TreeShape | StaticTree | None = None):
        if isinstance(getattr(stopping, "head", None), torch.nn.Module):
            check_head(stopping.head, drafter)  # the head reads the EAGLE layer's output: the target's width
        self.drafter, self.stopping, self.tree = drafter, stopping, tree
        self.keep_logits = False  # attach the raw logits to each Draft (read by the greedy BD reward)
        self.eos: set[int] = set()
        self._reset()

    def _reset(self) -> None:
        self.features: list[torch.Tensor] = []  # chunks of the target's features f_0..f_{m-1}
        self.n_features = 0
        self._feature_cat: torch.Tensor | None = None
        self.cache = kv.new_cache()
        self.fed = 0  # EAGLE cache entries written from real features (positions 0..fed-1)
        self._own_round_end: int | None = None  # context length after this drafter's last observed round
        self.catch_up_seconds = 0.0

    @property
    def target_feature_layers(self) -> tuple[int, ...]:
        """The target's hidden states this drafter reads: (-1,) for EAGLE-1, low / middle / high for EAGLE-3."""
        return tuple(getattr(self.drafter, "feature_layers", (-1,)))

    def start(self, target: torch.nn.Module, eos: set[int]) -> None:
        check_pair(target, self.drafter)
        self.drafter.attach_target(target)
        self.eos = eos
        self.device = kv.input_device(self.drafter)
        self._reset()
        self.stopping.start(self.drafter)

    # ---- features ----------------------------------------------------------------------------------
    def record_target(self, outcome: RoundOutcome) -> None:
        """Keep the target's features of the positions this round committed (also called, by a bandit,
        on rounds another arm drafted)."""
        hidden = outcome.target_hidden
        if hidden is None:
            raise InputError("the EAGLE drafter needs the target's hidden states of every round; decode with "
                             "decoding.speculative.generate_speculative (it passes them when "
                             "needs_target_features is set)")
        need = len(outcome.context) - 1 - self.n_features
        hidden = self._own_columns(hidden, tuple(outcome.feature_layers))
        if outcome.path is not None:  # a tree round: the fed prefix, then the accepted nodes
            n_prefix = hidden.shape[0] - len(outcome.draft.tree)
            index = list(range(n_prefix)) + [n_prefix + i for i in outcome.path]
            hidden = hidden[torch.tensor(index, device=hidden.device)]
        if hidden.shape[0] < need:
            raise InputError(f"the EAGLE drafter missed the target's features of {need - hidden.shape[0]} "
                             "committed positions; every round must reach observe / record_target")
        if need > 0:
            self.features.append(hidden[:need])
            self.n_features += need
            self._feature_cat = None

    def _own_columns(self, hidden: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:
        """This drafter's layers out of the round's concatenated hidden states (a bandit asks the target
        for the union of its arms' layers)."""
        mine = self.target_feature_layers
        if layers == mine:
            return hidden
        if any(i not in layers for i in mine):
            raise InputError(f"the round carries the target's hidden states {list(layers)}, this EAGLE drafter reads "
                             f"{list(mine)}; decode with generate_speculative, which asks for target_feature_layers")
        width = hidden.shape[-1] // len(layers)
        return torch.cat([hidden[:, layers.index(i) * width : (layers.index(i) + 1) * width] for i in mine], dim=-1)

    def observe(self, outcome: RoundOutcome) -> None:
        self.record_target(outcome)
        self._own_round_end = len(outcome.context)

    def lags(self, context: list[int]) -> bool:
        """Whether rounds drafted by other arms were committed since this drafter's last round (its
        layer then catches up on more than its own round's positions)."""
        return self._own_round_end != len(context)

    def _feature_rows(self, start: int, stop: int) -> torch.Tensor:
        if self._feature_cat is None:
            self._feature_cat = torch.cat(self.features) if len(self.features) > 1 else self.features[0]
            self.features = [self._feature_cat]
        return self._feature_cat[start:stop]

    def _catch_up(self, context: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cut the EAGLE cache back to the entries written from real features and feed the committed
        positions since then; -> (f^ at the last committed token (H,), its draft logits (V,))."""
        m = len(context) - 1
        keep = min(self.fed, m - 1)  # feed >= 1 position: its output starts the round
        kv.crop(self.cache, keep)
        pred, logits = kv.forward_eagle(self.drafter, self.cache, self._feature_rows(keep, m), context[keep + 1 : m + 1],
                                        list(range(keep, m)), device=self.device)
        self.fed = m
        return pred[-1], logits[-1]

    # ---- drafting ----------------------------------------------------------------------------------
    def propose(
        self, context: list[int], max_tokens: int, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> Draft:
        policy = self.stopping
        limit = min(policy.max_tokens, max_tokens)
        policy.start_round(context)
        m = len(context) - 1
        if limit <= 0 or m < 1 or self.n_features < m or policy.stop(0, None):
            # no features for the prompt yet (the first round): the target prefills and emits alone
            return Draft(tokens=[], q=torch.empty(0, 0), n_forwards=0)
        t0 = time.perf_counter()
        feature, logits = self._catch_up(context)
        self.catch_up_seconds = time.perf_counter() - t0
        if self.tree is not None:
            return self._propose_tree(m, feature, logits, limit, sampling)
        return self._propose_chain(m, feature, logits, limit, sampling, generator)

    def _propose_chain(self, m, feature, logits, limit, sampling, generator) -> Draft:
        """`draft_chain` with the EAGLE step: input (f^ of the previous position, y_k) at position m + k - 1;
        its output f^ gives q_{k+1} and is the EAGLE layer's hidden state e_k a SpecDec++ head reads."""
        state = {"feature": feature, "position": m}

        def step(y: int, hidden: bool):
            pred, out = kv.forward_eagle(self.drafter, self.cache, state["feature"][None], [y], [state["position"]],
                                         device=self.device)
            state["feature"], state["position"] = pred[-1], state["position"] + 1
            return out[-1], pred[-1]

        return draft_chain(logits, probs_on_cpu(logits, sampling), step, self.stopping, limit, sampling, generator,
                           self.eos, self.keep_logits)

    def _propose_tree(self, m, feature, logits, limit, sampling) -> Draft:
        shape = self.tree
        depth = min(shape.depth, limit)
        q_rows = [probs_on_cpu(logits, sampling)]  # q at the root, then at each expanded node
        static = isinstance(shape, StaticTree)
        pool: list[_Node] = []
        frontier = self._children(logits, -1, 1, 0, pool)
        n_forwards = 1
        for d in range(1, depth):
            if static:  # the listed nodes of this depth that have listed children
                frontier = [i for i in frontier if shape.ranks(pool[i].path)]
            frontier = [i for i in frontier if pool[i].token not in self.eos]  # drafting past EOS is waste
            if not frontier:
                break
            # a node's input is its parent's predicted feature (the root's: f^ at the last committed token)
            parents_feat = torch.stack([feature if pool[i].parent < 0 else pool[pool[i].parent].feature
                                        for i in frontier])
            start = kv.cache_length(self.cache)
            allowed = torch.zeros(len(frontier), start + len(frontier), dtype=torch.bool)
            allowed[:, :m] = True  # the committed entries
            for r, i in enumerate(frontier):
                allowed[r, start + r] = True
                a = pool[i].parent
                while a >= 0:
                    allowed[r, pool[a].kv_index] = True
                    a = pool[a].parent
            pred, out = kv.forward_eagle(self.drafter, self.cache, parents_feat, [pool[i].token for i in frontier],
                                         [m + d - 1] * len(frontier), allowed=allowed, device=self.device)
            n_forwards += 1
            children: list[int] = []
            for r, i in enumerate(frontier):
                pool[i].kv_index, pool[i].feature = start + r, pred[r]
                q_rows.append(probs_on_cpu(out[r], sampling))
                children += self._children(out[r], i, d + 1, len(q_rows) - 1, pool)
            frontier = children if static else sorted(children, key=lambda i: -pool[i].score)[: shape.top_k]
        # EAGLE-2: the top-m nodes of the whole tree; (-score, depth) keeps a parent ahead of a tied child
        kept = sorted(range(len(pool)), key=lambda i: (-pool[i].score, pool[i].depth, i))
        kept = kept if static else kept[: shape.nodes]
        kept.sort(key=lambda i: (pool[i].depth, i))  # parents precede children
        new_index = {old: new for new, old in enumerate(kept)}
        nodes = [pool[i] for i in kept]
        tree = DraftTree(tokens=[n.token for n in nodes], parents=[new_index.get(n.parent, -1) for n in nodes],
                         depths=[n.depth for n in nodes], q=torch.stack([q_rows[n.q_row] for n in nodes]),
                         n_drafts=[1] * len(nodes), iid=False, rule=topk_candidates_select)
        return Draft(tokens=tree.tokens, q=tree.q, n_forwards=n_forwards, tree=tree)

    def _children(self, logits, parent, depth, q_row, pool) -> list[int]:
        """Add the draft tokens after `parent` to the pool: its top-k (EAGLE-2), or the ranks a static tree
        lists under it (EAGLE-1); scored by cumulative log confidence (the drafter's own softmax, whatever
        the sampling transform). -> their pool indices."""
        path = pool[parent].path if parent >= 0 else ()
        score = pool[parent].score if parent >= 0 else 0.0
        logp = torch.log_softmax(logits.float(), -1)
        ranks = self.tree.ranks(path) if isinstance(self.tree, StaticTree) else list(range(self.tree.top_k))
        ranks = [r for r in ranks if r < logp.shape[-1]]
        top = torch.topk(logp, max(ranks) + 1) if ranks else None
        out = []
        for r in ranks:
            pool.append(_Node(token=int(top.indices[r]), parent=parent, depth=depth, score=score + float(top.values[r]),
                              q_row=q_row, path=path + (r,)))
            out.append(len(pool) - 1)
        return out


