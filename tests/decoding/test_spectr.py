"""SpecTr (k-Seq token selection, i.i.d. draft sets verified as a tree) is lossless and reduces to
speculative sampling:
(a) token level, on SpecTr App. B's Bernoulli and uniform cases: the acceptance rate equals the closed
    form 1 - (1 - beta(rho*))^k and the emitted token follows p (chi-square with its own power check);
(b) end to end on table stubs with known distributions: the first three tokens follow the target's
    autoregressive distribution, for fixed L and SpecDec++ stopping;
(c) greedy: token-for-token equal to greedy autoregressive decoding (SpecTr's K greedy drafts are one
    chain, so trees with real branching are checked too);
(d) K = 1 equals `DrafterSpeculator` exactly under the same seed.
Plus the pieces: rho* by bisection, the residual, the trie, and the tree-masked forward against plain
forwards of each path (logits and the cache cut back to the accepted path)."""
from types import SimpleNamespace

import pytest
import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.spectr import SpecTrSpeculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.rounds.draft_selection import (
    RHO_TOL,
    acceptance_probability,
    beta,
    greedy_select,
    kseq_residual,
    kseq_select,
    optimal_rho,
    recursive_rejection_select,
)
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.speculators.protocol import Draft
from specdraft.decoding.policies.stopping import FixedK, SpecDecPP
from specdraft.decoding.rounds.tree import trie_from_sequences, verify_tree
from specdraft.decoding.rounds.verify import residual
from tests.decoding.conftest import chi2_pvalue, exact_distribution, sample_sequences
from tests.decoding.test_losslessness import linear_head

N_SAMPLES = 5_000


def assert_fits_with_power(counts: torch.Tensor, exact: torch.Tensor, shift: float = 0.02) -> None:
    """Fits `exact`, and the same counts reject `exact` with `shift` mass moved between two cells."""
    exact = exact.double()
    assert counts[exact == 0].sum() == 0
    assert chi2_pvalue(counts, exact) > 1e-3
    wrong = exact.clone()
    kept = (exact > shift * 1.5).nonzero().flatten()
    hi, lo = kept[exact[kept].argmax()], kept[exact[kept].argmin()]
    wrong[hi] -= shift
    wrong[lo] += shift
    assert chi2_pvalue(counts, wrong) < 1e-3


def bernoulli(b: float) -> torch.Tensor:
    return torch.tensor([1.0 - b, b], dtype=torch.float64)


# ---------------------------------------------------------------- (a) token level


@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize("b", [0.1, 0.5, 0.75, 1.0])
def test_rho_star_solves_the_validity_equation(k, b):
    p, q = bernoulli(b), bernoulli(0.25)  # target p, draft q (SpecTr Fig. 4's cases, letters swapped)
    rho = optimal_rho(p, q, k)
    assert 1.0 <= rho <= k
    gap = float(acceptance_probability(p, q, k, rho) - rho * beta(p, q, rho))
    assert gap <= 1e-12  # valid: p_acc <= rho beta, so p_res >= 0
    if rho > 1.0:  # and not more than the tolerance above the root
        lower = rho - 2 * RHO_TOL
        assert float(acceptance_probability(p, q, k, lower) - lower * beta(p, q, lower)) > 0
    res = kseq_residual(p, q, k, rho)
    assert float(res.min()) >= 0.0 and abs(float(res.sum()) - 1.0) < 1e-9


def test_k_equal_one_is_speculative_sampling():
    gen = torch.Generator().manual_seed(0)
    p, q = torch.rand(7, generator=gen).softmax(0), torch.rand(7, generator=gen).softmax(0)
    assert optimal_rho(p, q, 1) == 1.0
    assert torch.allclose(kseq_residual(p, q, 1, 1.0), residual(p, q), atol=1e-6)
    assert torch.isclose(acceptance_probability(p, q, 1, 1.0), torch.minimum(p, q).sum())


def test_uniform_case_reaches_the_closed_form():
    """SpecTr App. B.2: draft U(d), target U(d/r): beta(rho*) = 1/r, acceptance 1 - (1 - 1/r)^k."""
    d, r, k = 8, 4, 3
    q = torch.full((d,), 1.0 / d, dtype=torch.float64)
    p = torch.zeros(d, dtype=torch.float64)
    p[: d // r] = r / d
    rho = optimal_rho(p, q, k)
    assert abs(float(acceptance_probability(p, q, k, rho)) - (1 - (1 - 1 / r) ** k)) < 1e-5


@pytest.mark.parametrize(
    "p,q,k",
    [
        pytest.param(bernoulli(0.75), bernoulli(0.25), 2, id="Ber0.75-vs-Ber0.25-k2"),
        pytest.param(bernoulli(0.1), bernoulli(0.25), 4, id="Ber0.1-vs-Ber0.25-k4"),
        pytest.param(torch.tensor([0.5, 0.3, 0.15, 0.05]), torch.tensor([0.1, 0.2, 0.3, 0.4]), 3, id="V4-k3"),
    ],
)
def test_kseq_accepts_at_the_closed_form_rate_and_emits_p(p, q, k):
    p, q = p.float(), q.float()
    gen = torch.Generator().manual_seed(1)
    rho = optimal_rho(p, q, k)
    p_acc = float(acceptance_probability(p.double(), q.double(), k, rho))
    counts = torch.zeros(len(p))
    accepted = 0
    for _ in range(N_SAMPLES):
        drafts = torch.multinomial(q, k, replacement=True, generator=gen).tolist()
        i, token = kseq_select(p, q, drafts, gen)
        accepted += i >= 0
        if i >= 0:
            assert token == drafts[i]
        counts[token] += 1
    sd = (p_acc * (1 - p_acc) / N_SAMPLES) ** 0.5
    assert abs(accepted / N_SAMPLES - p_acc) < 4 * sd + 1e-9
    assert_fits_with_power(counts, p, shift=0.03)


def test_multi_candidate_rule_emits_p():
    p, q = torch.tensor([0.5, 0.3, 0.15, 0.05]), torch.tensor([0.1, 0.2, 0.3, 0.4])
    gen = torch.Generator().manual_seed(2)
    counts = torch.zeros(4)
    for _ in range(N_SAMPLES):
        _, token = recursive_rejection_select(p, q, torch.multinomial(q, 3, True, generator=gen).tolist(), gen)
        counts[token] += 1
    assert_fits_with_power(counts, p, shift=0.03)


def test_greedy_rule_takes_the_target_argmax():
    p = torch.tensor([0.1, 0.7, 0.2])
    assert greedy_select(p, p, [2, 1, 1]) == (1, 1)
    assert greedy_select(p, p, [2, 0]) == (-1, 1)


# ---------------------------------------------------------------- trees and the tree-masked forward


def test_trie_merges_shared_prefixes_and_counts_drafts():
    q = torch.eye(5)
    seqs = [[1, 2, 3], [1, 2, 4], [1, 0], [3]]
    tree = trie_from_sequences(seqs, [q[: len(s)] for s in seqs])
    assert tree.tokens == [1, 2, 3, 4, 0, 3]
    assert tree.parents == [-1, 0, 1, 1, 0, -1]
    assert tree.depths == [1, 2, 3, 3, 2, 1]
    assert tree.n_drafts == [3, 2, 1, 1, 1, 1]
    assert tree.path(3) == [0, 1, 3] and tree.max_depth == 3


def test_verify_tree_greedy_follows_the_target_argmax():
    seqs = [[1, 2, 3], [1, 4], [0]]
    tree = trie_from_sequences(seqs, [torch.full((len(s), 5), 0.2) for s in seqs])
    p = torch.zeros(len(tree) + 1, 5)
    p[0, 1] = 1  # root -> 1 (node 0)
    p[1, 4] = 1  # after 1 -> 4 (node 3)
    p[4, 2] = 1  # after 1, 4 -> a leaf: bonus 2
    walk = verify_tree(p, tree, greedy=True)
    assert walk.path == [0, 3] and walk.token == 2 and walk.bonus
    p[1] = 0
    p[1, 0] = 1  # after 1 -> 0, no such child: correction
    walk = verify_tree(p, tree, greedy=True)
    assert walk.path == [0] and walk.token == 0 and not walk.bonus


def test_tree_forward_matches_plain_forwards_of_each_path(make_llama):
    model = make_llama(3)
    prompt = [5, 6, 7, 8]
    # paths [1, 2, 3], [1, 4], [9, 10]
    tokens, parents, depths = [1, 2, 3, 4, 9, 10], [-1, 0, 1, 0, -1, 4], [1, 2, 3, 2, 1, 2]
    cache = kv.new_cache()
    kv.forward(model, cache, prompt[:2])
    tree_logits = kv.forward_tree(model, cache, prompt[2:], tokens, parents, depths)
    assert tree_logits.shape == (len(tokens) + 1, model.config.vocab_size)
    for path in ([0, 1, 2], [0, 3], [4, 5]):
        plain, _ = kv.forward(model, kv.new_cache(), prompt + [tokens[i] for i in path], last=len(path) + 1)
        assert torch.allclose(plain, tree_logits[[0] + [1 + i for i in path]], atol=1e-4)
    # cut back to prompt + path [0, 3]: the next step equals a plain forward over prompt + [1, 4, 11]
    kv.keep_positions(cache, len(prompt), [len(prompt) + 0, len(prompt) + 3])
    assert kv.cache_length(cache) == len(prompt) + 2
    after, _ = kv.forward(model, cache, [11])
    plain, _ = kv.forward(model, kv.new_cache(), prompt + [1, 4, 11])
    assert torch.allclose(after, plain, atol=1e-4)


def test_batched_rows_match_single_rows(make_llama):
    model = make_llama(4)
    cache = kv.new_cache()
    kv.forward(model, cache, [3, 4, 5])
    kv.repeat_rows(cache, 3)
    logits, _ = kv.forward_batch(model, cache, torch.tensor([7, 8, 9]))
    for r, y in enumerate([7, 8, 9]):
        plain, _ = kv.forward(model, kv.new_cache(), [3, 4, 5, y])
        assert torch.allclose(logits[r], plain[-1], atol=1e-4)
    kv.select_row(cache, 1)
    after, _ = kv.forward(model, cache, [2])
    plain, _ = kv.forward(model, kv.new_cache(), [3, 4, 5, 8, 2])
    assert torch.allclose(after, plain, atol=1e-4)


# ---------------------------------------------------------------- (b) end to end on table stubs

V, N_TOKENS = 3, 3
PROMPT = [1, 2]


class TreeTableLM(torch.nn.Module):
    """Next-token logits table[prev, cur] (V, V, V) like the conftest TableLM, also for batches of rows
    and for tree-masked forwards: `prev` is the token at the latest position a query attends to before
    itself (its parent in a tree). Token ids are stored in the cache, so crop / gather / row selection work
    unchanged. Hidden state at a position: hidden_table[prev, cur]."""

    def __init__(self, table: torch.Tensor, hidden_table: torch.Tensor, context: int = 1024):
        super().__init__()
        self.table = torch.nn.Parameter(table, requires_grad=False)
        self.hidden_table = torch.nn.Parameter(hidden_table, requires_grad=False)
        self.config = SimpleNamespace(vocab_size=table.shape[-1], hidden_size=hidden_table.shape[-1],
                                      max_position_embeddings=context)

    def forward(self, input_ids, past_key_values, use_cache=True, logits_to_keep=1, output_hidden_states=False,
                attention_mask=None, position_ids=None, **_):
        B, T = input_ids.shape
        if past_key_values.get_seq_length() > 0:
            past = past_key_values.layers[0].keys[:, 0, :, 0].long()  # (B, P)
        else:
            past = input_ids[:, :0]
        as_kv = input_ids.float().view(B, 1, T, 1)
        past_key_values.update(as_kv, as_kv, 0)
        full = torch.cat([past, input_ids], dim=1)  # (B, P + T)
        P = past.shape[1]
        prev_idx = []
        for j in range(P + T - logits_to_keep, P + T):
            if attention_mask is not None and j >= P:
                seen = (attention_mask[0, 0, j - P] == 0).nonzero().flatten().tolist()
                seen = [s for s in seen if s < j]
                prev_idx.append(seen[-1] if seen else -1)
            else:
                prev_idx.append(j - 1)
        prev_idx = torch.tensor(prev_idx)
        cur = full[:, -logits_to_keep:]
        prev = torch.where(prev_idx >= 0, full[:, prev_idx.clamp_min(0)], torch.zeros_like(cur))
        logits = self.table[prev, cur]  # (B, n, V)
        hidden = (self.hidden_table[prev, cur],) if output_hidden_states else None
        return SimpleNamespace(logits=logits, hidden_states=hidden)


@pytest.fixture(scope="module")
def tree_stub_pair():
    gen = torch.Generator().manual_seed(0)
    p_table = torch.randn(V, V, V, generator=gen) * 1.5
    q_table = p_table + torch.randn(V, V, V, generator=gen) * 1.0
    hidden = torch.randn(V, V, 8, generator=gen)
    return TreeTableLM(p_table, hidden), TreeTableLM(q_table, hidden), p_table


def test_tree_stub_agrees_with_plain_forwards(tree_stub_pair):
    target, _, _ = tree_stub_pair
    cache = kv.new_cache()
    logits = kv.forward_tree(target, cache, PROMPT, [0, 1, 2], [-1, 0, -1], [1, 2, 1])
    for path in ([0, 1], [2]):
        tokens = [[0, 1, 2][i] for i in path]
        plain, _ = kv.forward(target, kv.new_cache(), PROMPT + tokens, last=len(path) + 1)
        assert torch.equal(plain, logits[[0] + [1 + i for i in path]])


E2E_CASES = [
    # (sampling, stopping, K, samples, error the samples must detect)
    pytest.param(SamplingConfig(temperature=1.0), lambda: FixedK(2), 3, 3_000, 0.04, id="K3-L2-T1"),
    pytest.param(SamplingConfig(temperature=1.0), lambda: FixedK(2), 3, 5_000, 0.02, id="K3-L2-T1-n5000",
                 marks=pytest.mark.slow),
    pytest.param(SamplingConfig(temperature=0.8, top_k=2), lambda: SpecDecPP(linear_head(0), 0.3), 2, 5_000, 0.02,
                 id="K2-specdecpp-T0.8-topk2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("sampling,make_stopping,n_drafts,n_samples,shift", E2E_CASES)
def test_first_tokens_follow_the_target_distribution(tree_stub_pair, sampling, make_stopping, n_drafts, n_samples,
                                                    shift):
    target, drafter, p_table = tree_stub_pair
    exact = exact_distribution(p_table, sampling, PROMPT, N_TOKENS)
    gen = torch.Generator().manual_seed(42)
    speculator = SpecTrSpeculator(drafter, make_stopping(), n_drafts)
    counts, paths = sample_sequences(
        lambda: generate_speculative(target, speculator, PROMPT, N_TOKENS, sampling, generator=gen), n_samples, V,
        N_TOKENS)
    # bonus, residual and multi-branch paths all taken many times
    assert min(paths.values()) > n_samples // 20
    assert (counts / n_samples - exact).abs().max() < shift
    assert_fits_with_power(counts, exact, shift)


# ---------------------------------------------------------------- (c) greedy, (d) K = 1


def random_head(hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    head = torch.nn.Sequential(torch.nn.Linear(hidden, 16), torch.nn.SiLU(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        head[2].bias.fill_(1.5)
    return head


CASES = [(1, 9), (3, 24), (6, 40), (11, 17), (2, 33)]


@pytest.mark.parametrize("n_drafts", [2, 4])
@pytest.mark.parametrize("make_stopping", [lambda h: FixedK(3), lambda h: SpecDecPP(random_head(h, 0), 0.5, 6)],
                         ids=["L3", "specdecpp"])
def test_greedy_equals_autoregressive(llama_pair, n_drafts, make_stopping):
    target, drafter = llama_pair
    gen = torch.Generator().manual_seed(7)
    greedy = SamplingConfig(temperature=0.0)
    speculator = SpecTrSpeculator(drafter, make_stopping(drafter.config.hidden_size), n_drafts)
    for n_prompt, n in CASES:
        prompt = torch.randint(0, target.config.vocab_size, (n_prompt,), generator=gen).tolist()
        ref = generate_autoregressive(target, prompt, n, greedy).tokens
        out = generate_speculative(target, speculator, prompt, n, greedy)
        assert out.tokens == ref
        assert out.metrics.n_target < n  # drafts were accepted


class BranchingTreeSpeculator:
    """Greedy trees with real branching (i.i.d. greedy drafts would all be one chain): the drafter's greedy
    chain, listed last, merged with random sequences that follow a random prefix of it and then diverge,
    so accepted nodes are scattered through the tree's index order and the target cache must be gathered."""

    def __init__(self, drafter, length: int, branches: int, seed: int):
        self.chain = DrafterSpeculator(drafter, FixedK(length))
        self.branches = branches
        self.gen = torch.Generator().manual_seed(seed)

    def start(self, target, eos):
        self.chain.start(target, eos)

    def propose(self, context, max_tokens, sampling, generator):
        draft = self.chain.propose(context, max_tokens, sampling, generator)
        k = len(draft.tokens)
        if k == 0:
            return draft
        seqs, qs = [], []
        for _ in range(self.branches):
            keep = int(torch.randint(0, k, (1,), generator=self.gen))
            tail = torch.randint(0, draft.q.shape[-1], (k - keep,), generator=self.gen).tolist()
            seqs.append(draft.tokens[:keep] + tail)
            qs.append(draft.q)
        tree = trie_from_sequences(seqs + [draft.tokens], qs + [draft.q], iid=False)
        return Draft(tokens=tree.tokens, q=tree.q, n_forwards=draft.n_forwards, tree=tree)

    def observe(self, outcome):
        pass


def test_greedy_branching_trees_equal_autoregressive(llama_pair):
    target, drafter = llama_pair
    gen = torch.Generator().manual_seed(8)
    greedy = SamplingConfig(temperature=0.0)
    speculator = BranchingTreeSpeculator(drafter, 4, 3, seed=0)
    scattered = 0
    for n_prompt, n in CASES:
        prompt = torch.randint(0, target.config.vocab_size, (n_prompt,), generator=gen).tolist()
        out = generate_speculative(target, speculator, prompt, n, greedy)
        assert out.tokens == generate_autoregressive(target, prompt, n, greedy).tokens
        assert out.metrics.n_target < n
        scattered += out.metrics.n_discarded
    assert scattered > 20  # many nodes were verified and dropped beside the accepted path


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.0)],
                         ids=["T1", "greedy"])
@pytest.mark.parametrize("make_stopping", [lambda h: FixedK(4), lambda h: SpecDecPP(random_head(h, 1), 0.5, 6)],
                         ids=["L4", "specdecpp"])
def test_one_draft_equals_the_single_draft_path(llama_pair, sampling, make_stopping):
    target, drafter = llama_pair
    prompt = [3, 4, 5, 6, 7]
    hidden = drafter.config.hidden_size
    ours = generate_speculative(target, SpecTrSpeculator(drafter, make_stopping(hidden), 1), prompt, 40, sampling,
                                generator=torch.Generator().manual_seed(5))
    ref = generate_speculative(target, DrafterSpeculator(drafter, make_stopping(hidden)), prompt, 40, sampling,
                               generator=torch.Generator().manual_seed(5))
    assert ours.tokens == ref.tokens
    for key in ("n_target", "n_draft", "n_discarded", "drafted", "accepted"):
        assert getattr(ours.metrics, key) == getattr(ref.metrics, key)


def test_more_drafts_accept_more_under_sampling(llama_pair):
    """Not a proof of anything the paper claims, a smoke check that K > 1 is actually used: at T = 1 with
    the same seeds, K = 4 drafts accept at least as many tokens per round as K = 1 in total."""
    target, drafter = llama_pair
    sampling = SamplingConfig(temperature=1.0)
    accepted = {}
    for K in (1, 4):
        total = rounds = 0
        for seed in range(4):
            m = generate_speculative(target, SpecTrSpeculator(drafter, FixedK(4), K), [3, 4, 5], 30, sampling,
                                     generator=torch.Generator().manual_seed(seed)).metrics
            total += sum(m.accepted)
            rounds += m.n_rounds
        accepted[K] = total / rounds
    assert accepted[4] > accepted[1]


def test_bad_draft_count_is_an_input_error(llama_pair):
    _, drafter = llama_pair
    with pytest.raises(InputError, match="drafts"):
        SpecTrSpeculator(drafter, FixedK(2), 0)


def test_factory_picks_the_speculator_by_draft_count(llama_pair):
    from specdraft.decoding.speculators.spectr import drafter_speculator

    _, drafter = llama_pair
    assert type(drafter_speculator(drafter, FixedK(3))) is DrafterSpeculator
    spectr = drafter_speculator(drafter, FixedK(3), 4)
    assert type(spectr) is SpecTrSpeculator and spectr.n_drafts == 4
    with pytest.raises(InputError, match="drafts"):
        drafter_speculator(drafter, FixedK(3), -1)
