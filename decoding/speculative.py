"""Speculative sampling (SpecDec++ App. C, Alg. 2) as a thin loop over small pieces.

Per round:
    draft = speculator.propose(context)                     y_1..y_k with q_1..q_k   (k >= 0)
    p     = one target forward over [unseen context, y_1..y_k] -> p_1..p_{k+1}
    pi    = verification_distribution(p, q)                 p itself, or a cascade target
    n, y' = verify(pi, q, y)                                accepted prefix + correction/bonus
    roll the target cache back to context + y_1..y_n; commit y_1..y_n, y'
The target cache never holds the last committed token: it is fed, together with the next drafts, in
the next round's single forward. The speculator rolls its own cache back (see `decoding.speculators.protocol`).

A draft may instead be a tree (`Draft.tree`, e.g. SpecTr's K i.i.d. drafts merged into a trie): then the
one target forward is tree-masked over all nodes, `verify_tree` selects the accepted path with the tree's
node rule (SpecTr Alg. 3), and the target cache keeps the context + the accepted nodes' KV.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from specdraft.decoding.defaults import DEFAULTS
from specdraft.decoding.rounds import kv
from specdraft.decoding.autoregressive import as_token_list, eos_set, generate_autoregressive
from specdraft.decoding.compat import check_prompt
from specdraft.core.errors import InputError
from specdraft.decoding.metrics import GenerationMetrics, GenerationResult
from specdraft.decoding.rounds.sampling import SamplingConfig, probs_on_cpu
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.speculators.protocol import RoundOutcome, Speculator
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.policies.stopping import StoppingPolicy
from specdraft.decoding.rounds.tree import verify_tree
from specdraft.decoding.rounds.verify import Verification, verify

# (p (k+1, V), q (k, V)) -> the distribution verification makes the output follow, (k+1, V)
VerificationDistribution = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@torch.inference_mode()
def generate_speculative(
    target: torch.nn.Module,
    speculator: Speculator,
    prompt_ids,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(temperature=0.0),
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
    verification_distribution: VerificationDistribution | None = None,
) -> GenerationResult:
    """Generate up to max_new_tokens tokens; output distributed exactly as sampling from the target
    under `sampling` (token-for-token equal to greedy decoding when sampling.temperature == 0).
    `generator` must be a CPU generator (drafting and verification sample on CPU)."""
    prompt = as_token_list(prompt_ids)
    check_prompt(prompt, max_new_tokens, target)
    eos = eos_set(eos_token_id)
    m = GenerationMetrics()
    start = time.perf_counter()
    speculator.start(target, eos)
    cache = kv.new_cache()
    device = kv.input_device(target)
    context = list(prompt)
    features = bool(getattr(speculator, "needs_target_features", False))  # an EAGLE drafter reads them
    layers = tuple(getattr(speculator, "target_feature_layers", (-1,)))  # which hidden states (EAGLE-3: three)
    while True:
        remaining = max_new_tokens - (len(context) - len(prompt))
        t0 = time.perf_counter()
        # leave room for the extra token every round emits
        draft = speculator.propose(context, remaining - 1, sampling, generator)
        t1 = time.perf_counter()
        if draft.tree is not None:
            emitted, outcome, time_target = _tree_round(target, cache, context, draft, sampling, generator, device,
                                                        verification_distribution, features, layers)
            m.time_target += time_target
            n, k = outcome.verification.n_accepted, len(draft.tree)
        else:
            k = len(draft.tokens)
            unseen = context[kv.cache_length(cache) :]  # the last committed token (the whole prompt at first)
            logits, states = kv.forward(target, cache, unseen + draft.tokens, last=k + 1, device=device,
                                        hidden=features, hidden_last=len(unseen) + k, layers=layers)
            p = probs_on_cpu(logits, sampling)  # (k+1, V)
            m.time_target += time.perf_counter() - t1
            q = draft.q if k else p.new_zeros(0, p.shape[-1])  # (k, V)
            pi = p if verification_distribution is None else verification_distribution(p, q)
            result = verify(pi, q, torch.tensor(draft.tokens, dtype=torch.long), generator, sampling.greedy)
            n = result.n_accepted
            kv.crop(cache, len(context) + n)  # keep context + y_1..y_n; y' is fed next round
            emitted = draft.tokens[:n] + [result.token]
            outcome = RoundOutcome(draft=draft, p=pi, verification=result, context=context, logits=logits,
                                   target_hidden=states, feature_layers=layers)
        m.time_draft += t1 - t0
        context += emitted
        m.n_target += 1
        m.n_draft += draft.n_forwards
        m.n_discarded += k - n
        m.drafted.append(draft.tree.max_depth if draft.tree is not None else k)
        m.accepted.append(n)
        speculator.observe(outcome)
        hit = [i for i, t in enumerate(emitted) if t in eos]
        if hit:  # only the last draft token or y' can be EOS (drafting stops at EOS)
            dropped = len(emitted) - hit[0] - 1  # y' after an accepted drafted EOS: computed, never emitted
            del context[len(context) - dropped :]
            # counted as discarded so that Lemma 3.1 (N_draft + N_target = N + N_discarded) holds exactly
            m.n_discarded += dropped
            break
        if len(context) - len(prompt) >= max_new_tokens:
            break
    m.time_total = time.perf_counter() - start
    m.n_generated = len(context) - len(prompt)
    return GenerationResult(tokens=context[len(prompt) :], metrics=m)


def _tree_round(target, cache, context, draft, sampling, generator, device, verification_distribution,
                features: bool = False, layers: tuple[int, ...] = (-1,)):
    """One round over a draft tree: one tree-masked target forward scoring the root and every node,
    SpecTr's sequence-level selection (`verify_tree`, the tree's node rule), then the target cache cut
    back to the committed context + the accepted path (its KV gathered, see `kv.keep_positions`).
    -> (emitted tokens, outcome, seconds in the target forward)."""
    if verification_distribution is not None:
        raise InputError("a verification distribution (cascade target) is defined for chain drafts only; "
                         "decode with a single draft (--drafts 1) to use one")
    tree = draft.tree
    t1 = time.perf_counter()
    unseen = context[kv.cache_length(cache) :]
    out = kv.forward_tree(target, cache, unseen, tree.tokens, tree.parents, tree.depths, device=device,
                          hidden=features, layers=layers)
    logits, states = out if features else (out, None)
    p = probs_on_cpu(logits, sampling)  # (1 + N, V)
    time_target = time.perf_counter() - t1
    walk = verify_tree(p, tree, generator, sampling.greedy, rule=tree.rule)
    kv.keep_positions(cache, len(context), [len(context) + i for i in walk.path])
    emitted = [tree.tokens[i] for i in walk.path] + [walk.token]
    result = Verification(n_accepted=walk.n_accepted, token=walk.token, n_drafted=walk.n_drafted)
    outcome = RoundOutcome(draft=draft, p=p, verification=result, context=context, logits=logits, path=walk.path,
                           target_hidden=states, feature_layers=layers)
    return emitted, outcome, time_target


def generate_with_drafter(
    target: torch.nn.Module,
    drafter: torch.nn.Module,
    prompt_ids,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(temperature=0.0),
    stopping: StoppingPolicy | None = None,
    k: int = DEFAULTS.k,
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """`generate_speculative` with one causal-LM drafter drafting under `stopping` (default FixedK(k))."""
    speculator = DrafterSpeculator(drafter, stopping if stopping is not None else build_policy(PolicySpec("fixed", k=k)))
    return generate_speculative(target, speculator, prompt_ids, max_new_tokens, sampling, eos_token_id, generator)


def hindsight_oracle(
    target: torch.nn.Module,
    drafter: torch.nn.Module,
    prompt_ids,
    max_new_tokens: int,
    eos_token_id: int | list[int] | None = None,
) -> GenerationResult:
    """Greedy analysis mode (SpecDec++ Theorem 4.1): decode the target greedily, then replay with a
    stopping policy that knows that continuation. Its N_target and N_discarded (= 0) bound every policy."""
    greedy = SamplingConfig(temperature=0.0)
    prompt = as_token_list(prompt_ids)
    reference = generate_autoregressive(target, prompt, max_new_tokens, greedy, eos_token_id).tokens
    speculator = DrafterSpeculator(drafter, build_policy(PolicySpec("oracle"), reference=prompt + reference))
    return generate_speculative(target, speculator, prompt, max_new_tokens, greedy, eos_token_id)
