"""One definition of round lengths and forward counts (decoding/rounds/lengths.py, SpecDec++ Alg. 1 and
Lemma 3.1), held by the decoder and by the offline simulator that picks a head's threshold:
- the one-prompt loop's SpecDecPP decisions (`stop`) are its tensor rule `stop_rows`, run over whole rounds by
  `decisions` (what the simulator runs);
- Lemma 3.1, N_draft + N_target = N + N_discarded, holds exactly on real decodes (greedy and sampled)
  for fixed K, SpecDec++, the hindsight oracle and the bandits, and N_draft is the number of drafter
  calls actually made, also when a generation ends on an accepted drafted EOS (the bonus token after
  it is dropped and counted as discarded);
- on teacher-forced greedy sequences, heads/simulate.py's counts equal the decoded counts."""
from types import SimpleNamespace

import pytest
import torch

from specdraft.decoding.speculators.multi_drafter import Arm, MultiDrafterSpeculator, gamma_arms
from specdraft.decoding.policies.decide import decisions
from specdraft.decoding.rounds.lengths import lemma_3_1_gap, round_length
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.bandits.selectors import make_selector
from specdraft.decoding.speculative import generate_speculative, hindsight_oracle, generate_with_drafter
from specdraft.decoding.speculators.drafter import DrafterSpeculator
from specdraft.decoding.policies.stopping import FixedK, HindsightOracle, SpecDecPP
from specdraft.heads.simulate import greedy_oracle, simulate_fixed_k, simulate_specdecpp

GREEDY, SAMPLED = SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0)


def logit(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p) - torch.log1p(-p)


def test_specdecpp_stop_is_the_shared_decision_rule():
    def specdecpp_fires(sigma, h):
        return decisions(SpecDecPP(None, h, k_max=sigma.shape[-1]), sigma)

    gen = torch.Generator().manual_seed(0)
    identity = torch.nn.Linear(1, 1).requires_grad_(False)
    with torch.no_grad():
        identity.weight.fill_(1.0)
        identity.bias.zero_()
    for h in (0.1, 0.5, 0.7, 0.9):
        for _ in range(20):
            sigma = torch.rand(8, generator=gen) * 0.98 + 0.01  # sigmoid(f(e_1)) .. sigmoid(f(e_8))
            fires = specdecpp_fires(sigma, h)
            policy = SpecDecPP(identity, h, k_max=8)
            policy.start_round([0])
            got = [policy.stop(0, None), policy.stop(1, None)]
            for k in range(2, 9):  # decision k reads e_{k-1}
                got.append(policy.stop(k, logit(sigma[k - 2 : k - 1]).float()))
                if got[-1]:
                    break
            k = len(got) - 1 if got[-1] else 8
            assert got == fires[: len(got)].tolist()
            assert k == int(round_length(fires, 8))
    # y_1 always goes out: no decision before e_1 exists, whatever h
    assert not specdecpp_fires(torch.zeros(5), 0.01)[:2].any()
    # the rule by hand: decision k fires when 1 - prod_{i < k} sigma_i > h
    sigma = torch.tensor([0.9, 0.8, 0.5, 0.9])
    assert specdecpp_fires(sigma, 0.3).tolist() == [False, False, False, False, True]  # 1 - 0.72 = 0.28, then 0.64


def test_lockstep_rule_stops_the_batch_on_its_drafting_rows_mean_risk():
    from specdraft.decoding.policies.stopping import LockstepSpecDecPP
    rule = LockstepSpecDecPP(None, 0.5, k_max=4)
    state = rule.round_state(3, torch.device("cpu"))
    drafting = torch.tensor([True, True, False])
    state, stop = rule.stop_rows(state, 1, None, drafting)
    assert not stop.any()
    # risks 0.1, 0.8 (and 0.95 on a row that no longer drafts): the drafting rows' mean 0.45 <= h
    state, stop = rule.stop_rows(state, 2, torch.tensor([0.9, 0.2, 0.05], dtype=torch.float64), drafting)
    assert not stop.any()
    # next: 1 - 0.81 = 0.19, 1 - 0.02 = 0.98: mean 0.585 > h stops every drafting row, and only those
    state, stop = rule.stop_rows(state, 3, torch.tensor([0.9, 0.1, 1.0], dtype=torch.float64), drafting)
    assert stop.tolist() == [True, True, False]
    # per row, the same sigmas stop only the second row
    per_row = SpecDecPP(None, 0.5, k_max=4)
    state = per_row.round_state(3, torch.device("cpu"))
    for k, sigma in ((1, None), (2, torch.tensor([0.9, 0.2, 0.05], dtype=torch.float64))):
        state, stop = per_row.stop_rows(state, k, sigma, drafting)
    assert stop.tolist() == [False, True, False]


def random_head(hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    head = torch.nn.Sequential(torch.nn.Linear(hidden, 16), torch.nn.SiLU(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        head[2].bias.fill_(1.5)  # sigmoid around 0.8: rounds of a few tokens
    return head


class CallCounter:
    def __init__(self, *models):
        self.calls = 0
        self.handles = [m.register_forward_hook(self._hook) for m in models]

    def _hook(self, *_):
        self.calls += 1

    def remove(self):
        for h in self.handles:
            h.remove()


def speculators(target, drafter, other, greedy):
    """(name, speculator factory, extra drafter calls outside the decode) for every family."""
    H = drafter.config.hidden_size
    out = [
        ("K1", lambda p, ref: DrafterSpeculator(drafter, FixedK(1)), 0),
        ("K4", lambda p, ref: DrafterSpeculator(drafter, FixedK(4)), 0),
        ("specdec++ h0.5", lambda p, ref: DrafterSpeculator(drafter, SpecDecPP(random_head(H, 0), 0.5)), 0),
        ("specdec++ h0.9", lambda p, ref: DrafterSpeculator(drafter, SpecDecPP(random_head(H, 1), 0.9, 6)), 0),
        ("drafter bandit, SpecDec++ arm", lambda p, ref: MultiDrafterSpeculator(
            [Arm("good", DrafterSpeculator(drafter, SpecDecPP(random_head(H, 0), 0.5))),
             Arm("bad", DrafterSpeculator(other, FixedK(3)))],
            make_selector("random", 2, seed=1), reward="be", n_max=4), 0),
        ("ucbspec gamma arms", lambda p, ref: MultiDrafterSpeculator(
            gamma_arms(drafter, [0, 1, 2, 4]), make_selector("ucbspec", 4, max_len=4, seed=2), n_max=4,
            cost_ratio=0.2), 0),
        ("exp3spec gamma arms", lambda p, ref: MultiDrafterSpeculator(
            gamma_arms(drafter, [0, 1, 3]), make_selector("exp3spec", 3, max_len=3, seed=2), n_max=3,
            cost_ratio=0.2), 0),
    ]
    if greedy:  # the oracle's hindsight is one teacher-forced drafter call per generation
        out.append(("oracle", lambda p, ref: DrafterSpeculator(drafter, HindsightOracle(p + ref)), 1))
    return out


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_lemma_3_1_holds_exactly_on_real_decodes(llama_pair, make_llama, sampling):
    from specdraft.decoding.autoregressive import generate_autoregressive

    target, drafter = llama_pair
    other = make_llama(7)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (3, 9)]
    refs = [generate_autoregressive(target, prompt, 30, GREEDY).tokens for prompt in prompts]
    ended_on_drafted_eos = 0
    for name, make, extra in speculators(target, drafter, other, sampling.greedy):
        for prompt, ref in zip(prompts, refs):
            for eos in (None, ref[len(ref) // 2]):
                counter = CallCounter(drafter, other)
                try:
                    out = generate_speculative(target, make(prompt, ref), prompt, 30, sampling, eos_token_id=eos,
                                               generator=torch.Generator().manual_seed(3))
                finally:
                    counter.remove()
                m = out.metrics
                # a round of k candidates costs k drafter calls, and N_draft counts exactly the calls made
                assert m.n_draft == sum(m.drafted) == counter.calls - extra, name
                # exact, also when the generation ends on an accepted drafted EOS: the bonus token the
                # target computed after it is dropped and counted as discarded
                assert lemma_3_1_gap(m.n_draft, m.n_target, m.n_generated, m.n_discarded) == 0, name
                if eos is not None and out.tokens[-1] == eos and m.accepted[-1] == m.drafted[-1] > 0:
                    ended_on_drafted_eos += 1
                if sampling.greedy:
                    assert out.tokens == (ref if eos is None else ref[: ref.index(eos) + 1]), name
    if sampling.greedy:
        assert ended_on_drafted_eos > 0  # the dropped-bonus case was exercised


class PositionLM(torch.nn.Module):
    """A stub causal LM whose logits and final hidden state depend on the absolute position only:
    logits[p] at input position p (the distribution of the token at p + 1), hidden[p]. A drafter built
    so has the same hidden states on and off the target's path, so a teacher-forced pass sees exactly
    the head inputs the decoder sees, and the simulator's counts must equal the decoder's."""

    def __init__(self, logits: torch.Tensor, hidden: torch.Tensor):
        super().__init__()
        self.logits = torch.nn.Parameter(logits, requires_grad=False)
        self.hidden = torch.nn.Parameter(hidden, requires_grad=False)
        self.config = SimpleNamespace(vocab_size=logits.shape[-1], hidden_size=hidden.shape[-1],
                                      max_position_embeddings=logits.shape[0])

    def forward(self, input_ids, past_key_values, use_cache=True, logits_to_keep=1, output_hidden_states=False, **_):
        start = past_key_values.get_seq_length()
        T = input_ids.shape[1]
        as_kv = input_ids.float().view(1, 1, -1, 1)
        past_key_values.update(as_kv, as_kv, 0)
        pos = torch.arange(start, start + T)[-logits_to_keep:]
        hidden = (self.hidden[pos][None],) if output_hidden_states else None
        return SimpleNamespace(logits=self.logits[pos][None], hidden_states=hidden)


def position_world(seed: int, n: int = 60, prompt_len: int = 2, vocab: int = 8, agree: float = 0.7):
    """Target and drafter whose greedy tokens are fixed per position; the response X_1..X_n ends in EOS,
    on which the drafter agrees (so drafting never runs past the response, as the simulator assumes)."""
    gen = torch.Generator().manual_seed(seed)
    eos = vocab - 1
    L = prompt_len + n + 8
    X = torch.randint(0, eos, (L,), generator=gen)
    X[prompt_len + n - 1] = eos  # X[p] is the token at absolute position p
    agrees = torch.rand(L, generator=gen) < agree
    D = torch.where(agrees, X, (X + 1 + torch.randint(0, eos - 1, (L,), generator=gen)) % eos)
    D[prompt_len + n - 1] = eos
    t_logits = torch.zeros(L, vocab)
    d_logits = torch.zeros(L, vocab)
    t_logits[torch.arange(L - 1), X[1:]] = 5.0  # row p predicts the token at p + 1
    d_logits[torch.arange(L - 1), D[1:]] = 5.0
    hidden = torch.randn(L, 4, generator=gen)
    prompt = X[:prompt_len].tolist()
    response = X[prompt_len : prompt_len + n].tolist()
    accept = (D[prompt_len : prompt_len + n] == X[prompt_len : prompt_len + n]).double()  # position t = 1..n
    return PositionLM(t_logits, hidden), PositionLM(d_logits, hidden), prompt, response, accept, eos


def test_simulated_counts_equal_decoded_counts_on_teacher_forced_greedy_sequences():
    counts = lambda m: (m.n_target, m.n_draft, m.n_discarded)  # noqa: E731
    sim = lambda r: (r.n_target, r.n_draft, r.n_discarded)  # noqa: E731
    checked = 0
    for seed in range(4):
        target, drafter, prompt, response, accept, eos = position_world(seed)
        n = len(response)
        torch.manual_seed(seed)
        head = torch.nn.Linear(4, 1)
        with torch.no_grad():
            head.bias.fill_(1.5)
        # e_i is the drafter's hidden state at y_i, i.e. at the absolute position of response token i
        sigma = torch.sigmoid(head(drafter.hidden[len(prompt) : len(prompt) + n]).squeeze(-1)).double()
        for h in (0.3, 0.5, 0.7, 0.9):
            for k_max in (3, 20):
                out = generate_with_drafter(target, drafter, prompt, n + 5, GREEDY, SpecDecPP(head, h, k_max),
                                           eos_token_id=eos)
                assert out.tokens == response
                (r,) = simulate_specdecpp([accept], [sigma], cost_ratio=0.2, thresholds=[h], k_max=k_max)
                assert counts(out.metrics) == sim(r), (seed, h, k_max)
                checked += len(set(out.metrics.drafted))
        for k in (1, 3, 5):
            out = generate_with_drafter(target, drafter, prompt, n + 5, GREEDY, k=k, eos_token_id=eos)
            (r,) = simulate_fixed_k([accept], cost_ratio=0.2, ks=[k])
            assert counts(out.metrics) == sim(r), (seed, k)
        out = hindsight_oracle(target, drafter, prompt, n + 5, eos_token_id=eos)
        assert counts(out.metrics) == sim(greedy_oracle([accept.bool()], cost_ratio=0.2))
        # the oracle never drafts a rejected token; only the bonus after an accepted final EOS is dropped
        assert out.metrics.n_discarded == int(bool(accept[-1]))
    assert checked > 20  # round lengths really varied


def iid_acceptance_pair(table_lm, a: float, vocab: int = 4, seed: int = 0):
    """Target p on tokens {0, 1} (varying with the context), drafter q = a p + (1 - a) uniform{2, 3}:
    sum_x min(p, q) = a, so every draft token is accepted with probability exactly a, i.i.d."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.zeros(vocab, vocab, vocab)
    p[..., :2] = torch.rand(vocab, vocab, 2, generator=gen) + 0.2
    p = p / p.sum(-1, keepdim=True)
    u = torch.zeros(vocab)
    u[2:] = 0.5
    q = a * p + (1 - a) * u
    hidden = torch.zeros(vocab, vocab, 2)
    return table_lm(p.log(), hidden, context=4096), table_lm(q.log(), hidden, context=4096)


def alternating_pair(table_lm, vocab: int = 4):
    """Greedy stubs: the target continues 0 1 0 1 ...; after a 0 the drafter proposes 1 (right), after
    a 1 it proposes 2 (wrong; the target's token there is 0). A round after a committed 0 with gamma >= 1
    emits 2 tokens (y_1 accepted, then the bonus or the correction 0), so gamma = 1 is the fastest arm:
    2 / (1 + c) against 2 / (1 + c gamma); gamma = 0 emits 1 token and lands after a 1, where the next
    draft is rejected at once."""
    t = torch.zeros(vocab, vocab, vocab)
    d = torch.zeros(vocab, vocab, vocab)
    t[:, :, 0] = 1.0  # after anything but a 0: 0
    t[:, 0, :] = 0.0
    t[:, 0, 1] = 1.0  # after a 0: 1
    d[:, :, 0] = 1.0
    d[:, 0, :] = 0.0
    d[:, 0, 1] = 1.0
    d[:, 1, :] = 0.0
    d[:, 1, 2] = 1.0  # after a 1 the drafter says 2
    hidden = torch.zeros(vocab, vocab, 2)
    return table_lm(t * 5, hidden, context=4096), table_lm(d * 5, hidden, context=4096)


@pytest.mark.parametrize("selector", ["ucbspec", "exp3spec"])
def test_throughput_reward_picks_the_fastest_length(table_lm, selector):
    target, drafter = alternating_pair(table_lm)
    for seed in range(3):
        spec = MultiDrafterSpeculator(gamma_arms(drafter, [0, 1, 2, 3, 4]),
                                      make_selector(selector, 5, max_len=4, seed=seed), n_max=4, cost_ratio=0.3)
        assert spec.reward == "throughput"  # the default for length arms
        out = generate_speculative(target, spec, [1, 0], 1000, GREEDY)
        assert out.tokens == [1, 0] * 500
        pulls = spec.counts()
        assert max(range(5), key=pulls.__getitem__) == 1, (seed, pulls)


def test_throughput_reward_beats_accepted_length_under_iid_acceptance(table_lm):
    # a = 0.6, c = 0.45: expected throughput E[N_acc + 1] / (1 + c gamma) is 1.0, 1.103, 1.032, 0.926,
    # 0.823 for gamma = 0..4: gamma = 1 is fastest, while the accepted length grows with gamma
    target, drafter = iid_acceptance_pair(table_lm, a=0.6)
    arms = gamma_arms(drafter, [0, 1, 2, 3, 4])
    by_reward = {}
    for reward in ("throughput", "accepted"):
        spec = MultiDrafterSpeculator(arms, make_selector("ucbspec", 5, max_len=4, seed=0), reward, n_max=4,
                                      cost_ratio=0.45)
        generate_speculative(target, spec, [0, 1], 1400, SAMPLED, generator=torch.Generator().manual_seed(0))
        assert len(spec.history) >= 500
        by_reward[reward] = spec.counts()
    assert max(range(5), key=by_reward["throughput"].__getitem__) == 1, by_reward
    assert max(range(5), key=by_reward["accepted"].__getitem__) >= 3, by_reward
