"""Draft trees and their verification: one target forward over every node, one walk from the root.

A `DraftTree` is what a multi-draft speculator proposes instead of a chain: node i has a token, a parent
(-1: the last committed token, the root), a depth (1 for the root's children), the drafter distribution
its token was drawn from (the drafter's q at the parent), and how many i.i.d. drafts pass through it.
Parents precede children, so the nodes can be fed to the target in index order.

SpecTr (Alg. 3) builds it by merging K i.i.d. draft sequences into a trie; `verify_tree` is SpecTr's
sequence-level draft selection: at the current node, the drafts that pass through it offer their next
tokens to a token-level `NodeRule` (k-Seq for i.i.d. drafts); the accepted token's node becomes the
current node (only the drafts through it survive); a rejection emits the rule's residual token; a leaf
reached emits a bonus token from the target's p at the leaf. The same walk with the multi-candidate
residual rule (SpecInfer / EAGLE) verifies general trees, and greedy decoding takes the child equal to
the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.decoding.rounds.sampling import sample
from specdraft.decoding.rounds.draft_selection import NodeRule, greedy_select, kseq_select


@dataclass
class DraftTree:
    tokens: list[int]  # (N,) node tokens
    parents: list[int]  # (N,) parent node index, -1 for a child of the root; parents[i] < i
    depths: list[int]  # (N,) 1 for a child of the root
    q: torch.Tensor  # (N, V) float32 on CPU: the drafter distribution node i's token was drawn from
    n_drafts: list[int]  # (N,) drafts whose path passes through node i
    # whether the drafts are i.i.d. sequences (SpecTr): then the candidates at a node are offered to the
    # rule in a uniformly random order, which has the law of the draws' own order (exchangeability)
    iid: bool = True
    # the token-level rule applied at each node: k-Seq for i.i.d. drafts (SpecTr Alg. 2), or
    # `decoding.rounds.draft_selection.recursive_rejection_select` for general trees
    rule: NodeRule = kseq_select

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def children(self) -> list[list[int]]:
        """children()[0] lists the root's children; children()[1 + i] those of node i (index order)."""
        out: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, parent in enumerate(self.parents):
            out[parent + 1].append(i)
        return out

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for the root, -1)."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]


def trie_from_sequences(sequences: list[list[int]], qs: list[torch.Tensor], iid: bool = True,
                        rule: NodeRule = kseq_select) -> DraftTree:
    """Merge draft sequences (each with its (len, V) q rows) into a trie: drafts sharing a prefix share its
    nodes (the target then scores each distinct prefix once). The q row of a shared node is taken from
    the first draft through it (the drafts computed it from the same prefix)."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    q_rows: list[torch.Tensor] = []
    counts: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for seq, q in zip(sequences, qs):
        parent = -1
        for d, token in enumerate(seq):
            node = index.get((parent, token))
            if node is None:
                node = len(tokens)
                index[(parent, token)] = node
                tokens.append(int(token))
                parents.append(parent)
                depths.append(d + 1)
                q_rows.append(q[d])
                counts.append(0)
            counts[node] += 1
            parent = node
    vocab = qs[0].shape[-1] if qs else 0
    q_all = torch.stack(q_rows) if q_rows else torch.empty(0, vocab)
    return DraftTree(tokens=tokens, parents=parents, depths=depths, q=q_all, n_drafts=counts, iid=iid, rule=rule)


@dataclass(frozen=True)
class TreeVerification:
    path: list[int]  # accepted node indices, root's child first
    token: int  # the extra token: a correction after a rejection, else the bonus at the leaf reached
    n_drafted: int  # the tree's depth (the longest draft)
    bonus: bool  # the walk reached a leaf (every offered draft token on the path was accepted)

    @property
    def n_accepted(self) -> int:
        return len(self.path)

    @property
    def n_emitted(self) -> int:
        return len(self.path) + 1


def verify_tree(
    p: torch.Tensor,
    tree: DraftTree,
    generator: torch.Generator | None = None,
    greedy: bool = False,
    rule: NodeRule = kseq_select,
) -> TreeVerification:
    """Select an accepted path and the extra token (SpecTr Alg. 3 with a token-level `rule`).

    p: (1 + N, V) verification distribution at the root (row 0) and after each node (row 1 + i).
    """
    assert p.shape[0] == len(tree) + 1, (p.shape, len(tree))
    children = tree.children()
    rule = greedy_select if greedy else rule
    path: list[int] = []
    node = -1
    while True:
        kids = children[node + 1]
        if not kids:  # a leaf: every draft token on the path was accepted
            token = int(p[node + 1].argmax()) if greedy else int(sample(p[node + 1], generator))
            return TreeVerification(path=path, token=token, n_drafted=tree.max_depth, bonus=True)
        # the multiset of next tokens of the drafts through this node, each child once per draft
        offered = [kid for kid in kids for _ in range(tree.n_drafts[kid])]
        if tree.iid and len(offered) > 1 and not greedy:
            offered = [offered[i] for i in torch.randperm(len(offered), generator=generator).tolist()]
        q = tree.q[kids[0]]  # every child was drawn from the drafter's distribution at this node
        chosen, token = rule(p[node + 1], q, [tree.tokens[kid] for kid in offered], generator)
        if chosen < 0:
            return TreeVerification(path=path, token=token, n_drafted=tree.max_depth, bonus=False)
        node = offered[chosen]
        path.append(node)
