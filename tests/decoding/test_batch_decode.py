"""The batched decoder (`decoding.batched.generate_batch`) against the batch-1 reference.

Greedy: every row of a ragged batch (prompt lengths 1..14, EOS in some rows, B = 5) equals that prompt
decoded alone by `generate_autoregressive`, token for token, for autoregressive decoding, fixed K,
SpecDec++ and per-row UCBSpec over lengths; fixed K and SpecDec++ also take exactly the rounds the
batch-1 speculative decoder takes (drafted / accepted per round), and every row satisfies Lemma 3.1.
Fixed K synchronises with the host once per round and no more; finished rows leave an eager batch;
EAGLE chains (EAGLE-1, and both EAGLE-3 layouts) decode every row exactly too, EAGLE-3 in the rounds the
one-prompt EAGLE loop takes; bad requests raise one-line InputErrors.
"""
import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.policies.batch_length_ucb import LengthUCB
from specdraft.decoding.batched import generate_batch
from specdraft.decoding.rounds.lengths import lemma_3_1_gap
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_with_drafter
from specdraft.decoding.policies.stopping import FixedK, HindsightOracle, LockstepSpecDecPP, SpecDecPP
from specdraft.decoding.policies.batch_aware import (BatchAwareSpecDec, GlobalVerifyBudget, KPerBatchSize,
                                                     LockstepBatchAwareSpecDec)
from specdraft.decoding.costs.model import CostTable
from tests.decoding.test_greedy_equivalence import random_head


def cost_table(verify=lambda b, w: 1.0 + 0.15 * (w - 1), draft=lambda b: 0.1, k_max=8, batch_sizes=(1, 4096)):
    """A synthetic cost table (seconds per step) for the batch-aware policies: the decisions, not the clock."""
    widths = tuple(range(1, k_max + 2))
    return CostTable(batch_sizes=batch_sizes, widths=widths,
                     verify=tuple(tuple(float(verify(b, w)) for w in widths) for b in batch_sizes),
                     draft=tuple(float(draft(b)) for b in batch_sizes), catchup=tuple(float(draft(b)) for b in batch_sizes),
                     device="test", torch_version="test", compile="none", target_id="t", drafter_id="d")


# a verify whose cost per extra position rises with the batch: wide rounds at B = 1, plain target steps at B = 5
STEEP = dict(verify=lambda b, w: 1.0 + 0.02 * b * b * (w - 1))

GREEDY = SamplingConfig(temperature=0.0)
LENGTHS = (1, 4, 9, 14, 2)
MAX_NEW = 24


@pytest.fixture(scope="module")
def ragged(llama_pair):
    """Five prompts of different lengths; EOS = a token that the greedy target emits mid-way in some rows
    (chosen from row 0's reference), so some rows stop early and others run to the length limit."""
    target, _ = llama_pair
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, target.config.vocab_size, (n,), generator=gen).tolist() for n in LENGTHS]
    free = [generate_autoregressive(target, p, MAX_NEW, GREEDY).tokens for p in prompts]
    eos = free[0][MAX_NEW // 2]
    refs = [generate_autoregressive(target, p, MAX_NEW, GREEDY, eos_token_id=eos).tokens for p in prompts]
    return prompts, eos, refs


POLICIES = {
    "autoregressive": lambda h: None,
    "K1": lambda h: FixedK(1),
    "K4": lambda h: FixedK(4),
    "specdecpp-h0.5": lambda h: SpecDecPP(random_head(h, 0), threshold=0.5),
    "specdecpp-h0.9-kmax6": lambda h: SpecDecPP(random_head(h, 1), threshold=0.9, k_max=6),
    "ucb-lengths": lambda h: LengthUCB((0, 1, 2, 4)),
    "lockstep-specdecpp-h0.5": lambda h: LockstepSpecDecPP(random_head(h, 0), threshold=0.5),
    "batch-aware": lambda h: BatchAwareSpecDec(random_head(h, 0), cost_table(), prior=0.7, k_max=6),
    "batch-aware-lockstep": lambda h: LockstepBatchAwareSpecDec(random_head(h, 0), cost_table(), prior=0.7, k_max=6),
    "global-verify-budget": lambda h: GlobalVerifyBudget(random_head(h, 0), cost_table(), prior=0.7, k=4),
    "k-per-batch-size": lambda h: KPerBatchSize({1: 4, 4: 2, 8: 0}),
}


# rules whose decisions read the whole batch (its size, its other rows): no batch-1 rounds to compare with
BATCH_DEPENDENT = {"lockstep-specdecpp-h0.5", "batch-aware-lockstep", "global-verify-budget",
                   "k-per-batch-size"}


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_row_equals_its_prompt_decoded_alone(llama_pair, ragged, name):
    target, drafter = llama_pair
    prompts, eos, refs = ragged
    hidden = drafter.config.hidden_size
    policy = POLICIES[name](hidden)
    results = generate_batch(target, prompts, MAX_NEW, drafter=drafter if policy else None, policy=policy,
                             eos_token_id=eos)
    assert len(results) == len(prompts)
    stopped_early = 0
    for result, ref in zip(results, refs):
        assert result.tokens == ref
        m = result.metrics
        stopped_early += len(ref) < MAX_NEW
        assert m.n_generated == len(ref)
        assert lemma_3_1_gap(m.n_draft, m.n_target, m.n_generated, m.n_discarded) == 0
        assert m.n_rounds == m.n_target and sum(m.accepted) <= sum(m.drafted)
    assert 0 < stopped_early < len(prompts)  # EOS ended some rows, not all
    if policy is None:
        assert all(r.metrics.n_target == r.metrics.n_generated for r in results)
        return
    total_drafted = sum(sum(r.metrics.drafted) for r in results)
    total_accepted = sum(sum(r.metrics.accepted) for r in results)
    assert 0 < total_accepted < total_drafted  # acceptance and rejection both happened
    if isinstance(policy, LengthUCB):
        chosen = {k for r in results for k in r.metrics.drafted}
        assert 0 in chosen and len(chosen) >= 3  # round-robin over the arms, plain steps included
        return
    if name in BATCH_DEPENDENT:
        return  # its rounds depend on the batch (test_lockstep_specdecpp_rows_draft_together, test_batch_aware_*)
    # the same rounds as the batch-1 speculative decoder, row by row
    for prompt, result in zip(prompts, results):
        fresh = POLICIES[name](hidden)
        old = generate_with_drafter(target, drafter, prompt, MAX_NEW, GREEDY, stopping=fresh, eos_token_id=eos).metrics
        m = result.metrics
        assert (m.drafted, m.accepted, m.n_draft, m.n_discarded) == (old.drafted, old.accepted, old.n_draft, old.n_discarded)


def test_specdecpp_rounds_vary_per_row(llama_pair, ragged):
    """The head stops rows at different lengths inside one batch (ragged drafting, not one batch-wide K)."""
    target, drafter = llama_pair
    prompts, eos, _ = ragged
    policy = SpecDecPP(random_head(drafter.config.hidden_size, 0), threshold=0.5)
    results = generate_batch(target, prompts, MAX_NEW, drafter=drafter, policy=policy, eos_token_id=eos)
    first_rounds = {r.metrics.drafted[0] for r in results}
    assert len({k for r in results for k in r.metrics.drafted}) >= 3 and len(first_rounds) >= 2


def test_lockstep_specdecpp_rows_draft_together(llama_pair, ragged):
    """LockstepSpecDecPP: in every round the rows that are not near their length limit draft the same
    number of tokens (per-row SpecDec++ on the same batch does not), the batch's rounds are neither all K_max
    nor all 1, and alone (batch 1) it makes SpecDecPP's decisions exactly."""
    target, drafter = llama_pair
    prompts, _, _ = ragged
    hidden, k_max = drafter.config.hidden_size, 8

    def head():  # sharper than random_head: its risk varies enough between contexts to move a batch's mean
        h = random_head(hidden, 0)
        with torch.no_grad():
            h[2].weight.mul_(6.0)
        return h

    results = generate_batch(target, prompts, MAX_NEW, drafter=drafter,
                             policy=LockstepSpecDecPP(head(), threshold=0.5, k_max=k_max))
    per_round: dict[int, set] = {}
    for r in results:
        n_out = 0
        for i, (k, n) in enumerate(zip(r.metrics.drafted, r.metrics.accepted)):
            if MAX_NEW - n_out - 1 >= k_max:  # the length limit does not cap this row's round
                per_round.setdefault(i, set()).add(k)
            n_out += n + 1
    assert len(per_round) >= 3 and all(len(ks) == 1 for ks in per_round.values())
    assert len({k for ks in per_round.values() for k in ks}) >= 2
    rowwise = generate_batch(target, prompts, MAX_NEW, drafter=drafter, policy=SpecDecPP(head(), threshold=0.5, k_max=k_max))
    assert len({r.metrics.drafted[0] for r in rowwise}) > 1  # per-row stops differ in the first round
    for prompt in prompts[:2]:
        [lock] = generate_batch(target, [prompt], MAX_NEW, drafter=drafter,
                                policy=LockstepSpecDecPP(head(), threshold=0.5, k_max=k_max))
        [row] = generate_batch(target, [prompt], MAX_NEW, drafter=drafter, policy=SpecDecPP(head(), threshold=0.5, k_max=k_max))
        assert (lock.tokens, lock.metrics.drafted, lock.metrics.accepted) == (row.tokens, row.metrics.drafted, row.metrics.accepted)


def test_batch_of_one_and_repeated_prompts(llama_pair, ragged):
    target, drafter = llama_pair
    prompts, _, _ = ragged
    alone = generate_autoregressive(target, prompts[2], MAX_NEW, GREEDY).tokens
    [one] = generate_batch(target, [prompts[2]], MAX_NEW, drafter=drafter, policy=FixedK(3))
    assert one.tokens == alone
    same = generate_batch(target, [prompts[2]] * 3, MAX_NEW, drafter=drafter, policy=FixedK(3))
    assert all(r.tokens == alone for r in same)


def host_transfers(monkeypatch, decode) -> tuple[dict[str, int], object]:
    """(the device-to-host transfers `decode()` made, by kind, its result): counted by wrapping the tensor
    methods that transfer (`cpu`, and the implicit syncs `item` and `bool`)."""
    calls = {"cpu": 0, "item": 0, "bool": 0}

    def counting(name, real):
        def wrapper(self, *args, **kwargs):
            calls[name] += 1
            return real(self, *args, **kwargs)
        return wrapper

    for name, method in (("cpu", "cpu"), ("item", "item"), ("bool", "__bool__")):
        monkeypatch.setattr(torch.Tensor, method, counting(name, getattr(torch.Tensor, method)))
    try:
        return calls, decode()
    finally:
        monkeypatch.undo()


def test_fixed_k_synchronises_once_per_round(llama_pair, ragged, monkeypatch):
    """Per round exactly one device-to-host copy and no implicit sync (`bool`, `item`) anywhere in the
    round. One more copy fetches the outputs."""
    target, drafter = llama_pair
    prompts, eos, _ = ragged
    calls, results = host_transfers(monkeypatch, lambda: generate_batch(
        target, prompts, MAX_NEW, drafter=drafter, policy=FixedK(3), eos_token_id=eos))
    rounds = max(r.metrics.n_rounds for r in results)
    assert calls == {"cpu": rounds + 1, "item": 0, "bool": 0}


@pytest.mark.parametrize("name", ["specdecpp-h0.5", "lockstep-specdecpp-h0.5", "batch-aware", "batch-aware-lockstep",
                                  "global-verify-budget"])
def test_an_eager_head_rule_reads_the_host_once_per_decision(llama_pair, ragged, monkeypatch, name):
    """Eagerly, a rule that can stop the whole batch reads whether any row drafts on once after each decision
    (before the feed it decides), and the draft loop reuses that read: at most one read per drafted position,
    plus decision 0's for a rule that decides there (`costs.rules._rule_round` prices exactly these reads).
    Each read is a device sync; on a GPU it waits for the queue. Until this was fixed the loop read the same
    flag a second time per position (74 reads for SpecDec++'s 39 drafts on the first prompt here)."""
    target, drafter = llama_pair
    prompts, eos, refs = ragged
    policy = POLICIES[name](drafter.config.hidden_size)
    for i in (1, 3):  # batch 1: each round's drafts are the batch's
        calls, [result] = host_transfers(monkeypatch, lambda: generate_batch(
            target, [prompts[i]], MAX_NEW, drafter=drafter, policy=policy, eos_token_id=eos))
        assert result.tokens == refs[i]
        m = result.metrics
        zero_reads = m.n_rounds if getattr(policy, "decides_at_zero", False) else 0
        assert 0 < calls["bool"] <= m.n_draft + zero_reads
        assert calls["cpu"] == m.n_rounds + 1 and calls["item"] == 0


def test_finished_rows_leave_the_batch(llama_pair, monkeypatch):
    """Once half the rows are done, an eager decode drops them (the caches shrink) and the rows left
    still decode exactly as alone."""
    from specdraft.decoding.rounds.static_cache import RowStaticCache

    target, drafter = llama_pair
    shrinks = []
    real = RowStaticCache.select_rows

    def spy(self, keep):
        shrinks.append((self.lengths.numel(), keep.numel()))
        return real(self, keep)

    monkeypatch.setattr(RowStaticCache, "select_rows", spy)
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 96, (3 + i,), generator=gen).tolist() for i in range(8)]
    lengths = [6, 30, 8, 30, 5, 7, 30, 9]  # rows end at very different rounds: EOS stands in via max_new below
    eos_per_row = []
    for p, n in zip(prompts, lengths):
        eos_per_row.append(generate_autoregressive(target, p, n, GREEDY).tokens[-1])
    results = generate_batch(target, prompts, 30, drafter=drafter, policy=FixedK(3), eos_token_id=eos_per_row)
    for p, r in zip(prompts, results):
        assert r.tokens == generate_autoregressive(target, p, 30, GREEDY, eos_token_id=eos_per_row).tokens
    assert shrinks and all(after <= before // 2 for before, after in shrinks)


def test_seeded_sampling_repeats(llama_pair, ragged):
    target, drafter = llama_pair
    prompts, _, _ = ragged
    hot = SamplingConfig(temperature=1.0)
    a = generate_batch(target, prompts, 12, drafter=drafter, policy=FixedK(3), sampling=hot, seed=3)
    b = generate_batch(target, prompts, 12, drafter=drafter, policy=FixedK(3), sampling=hot, seed=3)
    c = generate_batch(target, prompts, 12, drafter=drafter, policy=FixedK(3), sampling=hot, seed=4)
    assert [r.tokens for r in a] == [r.tokens for r in b] != [r.tokens for r in c]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"policy": FixedK(2)}, "needs a drafter"),
        ({"drafter": "D"}, "without a policy"),
        ({"drafter": "D", "policy": HindsightOracle([1, 2, 3])}, "supports FixedK"),
        ({"compile": "max"}, "compile must be one of"),
        ({"prompts": [[1, 2], []]}, "prompt is empty"),
        ({"prompts": []}, "non-empty list"),
        ({"max_new": 0}, "max_new_tokens"),
    ],
)
def test_bad_requests_raise_one_line(llama_pair, kwargs, message):
    target, drafter = llama_pair
    kwargs = dict(kwargs)
    if kwargs.get("drafter") == "D":
        kwargs["drafter"] = drafter
    prompts = kwargs.pop("prompts", [[1, 2, 3]])
    max_new = kwargs.pop("max_new", 4)
    with pytest.raises(InputError, match=message):
        generate_batch(target, prompts, max_new, **kwargs)


@pytest.mark.parametrize("make_policy", [
    pytest.param(lambda h: FixedK(3), id="K3"),
    pytest.param(lambda h: SpecDecPP(random_head(h, 0), threshold=0.5, k_max=6), id="specdecpp"),
    pytest.param(lambda h: LengthUCB((0, 2, 4)), id="ucb-lengths"),
])
def test_eagle_chain_rows_equal_their_prompt_decoded_alone(make_policy):
    """An EAGLE-1 drafter (reading the target's features of each verify) drafts ragged chains; every row
    equals its prompt decoded alone, Lemma 3.1 holds per row, and a one-token prompt (no features before
    its first round) still decodes."""
    from tests.decoding.eagle_fixtures import mimic_drafter, tiny_target

    target = tiny_target("llama", 0)
    drafter = mimic_drafter(target, 0.3, seed=1)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (1, 6, 11, 3)]
    policy = make_policy(drafter.config.hidden_size)
    results = generate_batch(target, prompts, MAX_NEW, drafter=drafter, policy=policy)
    for prompt, result in zip(prompts, results):
        assert result.tokens == generate_autoregressive(target, prompt, MAX_NEW, GREEDY).tokens
        m = result.metrics
        assert lemma_3_1_gap(m.n_draft, m.n_target, m.n_generated, m.n_discarded) == 0
    accepted = sum(sum(r.metrics.accepted) for r in results)
    assert 0 < accepted < sum(sum(r.metrics.drafted) for r in results)
    assert results[0].metrics.drafted[0] == 0  # the one-token prompt: no EAGLE entry yet in round 1


@pytest.mark.parametrize("variant", ["eagle3", "eagle3-proj"])
def test_eagle3_chain_rows_take_the_rounds_of_the_one_prompt_eagle_loop(variant):
    """Both EAGLE-3 layouts read the target's low, middle and high layers, fused. The one-prompt EAGLE loop
    spends its first round on a plain target step (no features yet) and then holds the features of the prompt,
    the state the batched decoder starts from for the prompt extended by that round's token: from there every
    row of a ragged batch takes the same rounds (drafted / accepted) and tokens, and equals the prompt decoded
    alone by the target."""
    from specdraft.decoding.speculative import generate_speculative
    from specdraft.decoding.speculators.eagle import EagleSpeculator
    from tests.decoding.eagle_fixtures import mimic_drafter, tiny_target, trained_eagle3

    gen = torch.Generator().manual_seed(5)
    if variant == "eagle3":
        target = tiny_target("llama", 0, layers=3)
        served = [torch.randint(0, 96, (6,), generator=gen).tolist() for _ in range(3)]
        drafter = trained_eagle3(target, steps=150, greedy=True, prompts=served)
        prompts = served + [served[0][:1], served[1][:3]]
    else:
        target = tiny_target("llama", 0)
        drafter = mimic_drafter(target, 0.3, seed=1, variant="eagle3-proj", feature_layers=(0, 0, 1))
        prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (6, 1, 11, 3)]
    alone = [generate_speculative(target, EagleSpeculator(drafter, FixedK(3)), p, MAX_NEW, GREEDY) for p in prompts]
    assert all(a.metrics.drafted[0] == 0 for a in alone)
    results = generate_batch(target, [p + a.tokens[:1] for p, a in zip(prompts, alone)], MAX_NEW - 1,
                             drafter=drafter, policy=FixedK(3))
    for prompt, a, result in zip(prompts, alone, results):
        assert a.tokens == generate_autoregressive(target, prompt, MAX_NEW, GREEDY).tokens
        assert result.tokens == a.tokens[1:]
        assert (result.metrics.drafted, result.metrics.accepted) == (a.metrics.drafted[1:], a.metrics.accepted[1:])
        m = result.metrics
        assert lemma_3_1_gap(m.n_draft, m.n_target, m.n_generated, m.n_discarded) == 0
    accepted = sum(sum(r.metrics.accepted) for r in results)
    assert 0 < accepted < sum(sum(r.metrics.drafted) for r in results)


def test_another_family_qwen2(ragged):
    """The static cache serves other full-attention families through the same cache.update seam."""
    from tests.decoding.conftest import noisy_copy
    from tests.decoding.eagle_fixtures import tiny_target

    target = tiny_target("qwen2", 0, layers=2)
    drafter = noisy_copy(target, 0.05, seed=1)
    prompts, _, _ = ragged
    results = generate_batch(target, prompts, 16, drafter=drafter, policy=FixedK(3))
    for prompt, result in zip(prompts, results):
        assert result.tokens == generate_autoregressive(target, prompt, 16, GREEDY).tokens
    assert sum(r.metrics.n_target for r in results) < 16 * len(prompts)


def test_a_lockstep_spec_decodes_a_batch_in_lockstep_and_batch_one_as_per_row(llama_pair, ragged):
    """A SpecDec++ spec with lockstep (what `specdraft generate --batch-size B > 1` asks for) decodes through
    `decode_batch` as LockstepSpecDecPP; at batch 1 it takes the per-row rule's decisions."""
    from specdraft.decoding.generate import Plan, decode_batch
    from specdraft.decoding.policies.spec import PolicySpec, build_policy

    target, drafter = llama_pair
    prompts, eos, _ = ragged
    head = random_head(drafter.config.hidden_size, 0)
    spec = PolicySpec("specdecpp", threshold=0.5, k_max=8, lockstep=True)
    plan = Plan("d", drafter, lambda: build_policy(spec, head=head))
    got = decode_batch(target, prompts, MAX_NEW, plan, GREEDY, eos, seed=0)
    want = generate_batch(target, prompts, MAX_NEW, drafter=drafter, policy=LockstepSpecDecPP(head, 0.5, 8), eos_token_id=eos)
    assert [(r.tokens, r.metrics.drafted) for r in got] == [(r.tokens, r.metrics.drafted) for r in want]
    [one] = decode_batch(target, prompts[:1], MAX_NEW, plan, GREEDY, eos, seed=0)
    [alone] = generate_batch(target, prompts[:1], MAX_NEW, drafter=drafter, policy=SpecDecPP(head, 0.5, 8), eos_token_id=eos)
    assert one.metrics.drafted == alone.metrics.drafted


def test_batch_aware_rounds_shorten_as_the_batch_grows_down_to_plain_target_steps(llama_pair, ragged):
    """Where a verified position costs more at B = 5 than it earns, the lockstep batch-aware rule stops at
    decision 0: rounds with no draft (a plain target step), and the rows still equal each prompt alone; at
    B = 1 the same table lets it draft."""
    target, drafter = llama_pair
    prompts, eos, refs = ragged
    policy = LockstepBatchAwareSpecDec(random_head(drafter.config.hidden_size, 0), cost_table(**STEEP), prior=0.7, k_max=6)
    batch = generate_batch(target, prompts, MAX_NEW, drafter=drafter, policy=policy, eos_token_id=eos)
    assert [r.tokens for r in batch] == refs
    zero = sum(d == 0 for r in batch for d in r.metrics.drafted)
    assert zero > 0 and all(r.metrics.n_draft == sum(r.metrics.drafted) for r in batch)
    [alone] = generate_batch(target, prompts[3:4], MAX_NEW, drafter=drafter, policy=policy, eos_token_id=eos)
    assert alone.tokens == refs[3] and max(alone.metrics.drafted) >= 2


class DraftEveryThirdRound(FixedK):
    """A rule that stops every row before any draft (decision 0) in two rounds of three: the drafter sits out
    those rounds and catches up, on every token it missed, when the next round drafts."""

    decides_at_zero = True

    def round_state(self, rows, device):
        self.rounds = getattr(self, "rounds", -1) + 1
        return ()

    def stop_rows(self, state, k, sigma, drafting):
        return state, drafting & (k == 0) & (self.rounds % 3 != 0)


def test_rounds_with_no_draft_defer_the_drafters_catch_up_and_stay_exact(llama_pair, ragged, monkeypatch):
    import specdraft.decoding.batched as batched

    target, drafter = llama_pair
    prompts, eos, refs = ragged
    widths = []
    real = batched.catch_up_behind
    monkeypatch.setattr(batched, "catch_up_behind", lambda d, s, w: widths.append(w) or real(d, s, w))
    results = generate_batch(target, prompts, MAX_NEW, drafter=drafter, policy=DraftEveryThirdRound(3), eos_token_id=eos)
    assert [r.tokens for r in results] == refs
    assert widths and set(widths) == {4}  # two rounds sat out: the last 4 committed tokens re-fed
    drafted = [k for r in results for k in r.metrics.drafted]
    assert 0 in drafted and max(drafted) == 3
    for r in results:
        m = r.metrics
        assert m.n_draft == sum(m.drafted)  # a round of no draft costs no drafter forward
        assert lemma_3_1_gap(m.n_draft, m.n_target, m.n_generated, m.n_discarded) == 0


@pytest.mark.parametrize("name", ["specdecpp-h0.5", "batch-aware-lockstep"])
def test_a_head_stopped_round_feeds_no_token_after_its_last_decision(llama_pair, ragged, name):
    """Lemma 3.1's cost, eagerly: a round of k drafts runs k - 1 width-1 drafter feeds (its first forward is the
    catch-up, or the prefill). A feed after the decision that stopped every row is a drafter forward nothing
    reads; the eager loop reads the flag before feeding and skips it."""
    target, drafter = llama_pair
    prompts, eos, refs = ragged
    feeds = []
    hook = drafter.get_decoder().register_forward_hook(
        lambda module, args, kwargs, out: feeds.append(1) if kwargs["input_ids"].shape[1] == 1 else None,
        with_kwargs=True)
    try:
        for i in (1, 3):  # prompts of 4 and 14 tokens: no width-1 prefill
            feeds.clear()
            result = generate_batch(target, [prompts[i]], MAX_NEW, drafter=drafter, policy=POLICIES[name](
                drafter.config.hidden_size), eos_token_id=eos)[0]
            assert result.tokens == refs[i]
            drafted = result.metrics.drafted
            assert any(0 < k < 6 for k in drafted)  # the head stopped rounds before the cap
            assert len(feeds) == sum(k - 1 for k in drafted if k > 0)
    finally:
        hook.remove()
