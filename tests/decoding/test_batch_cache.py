"""The per-row static KV cache (`decoding.rounds.static_cache`) against transformers' DynamicCache, and the
compiled forward against the eager one.

Rows of different lengths are prefilled right-padded, rolled back to different lengths (rollback is
only new lengths: stale slots stay in the buffers), fed more tokens, rolled back again: every row's
logits equal a DynamicCache fed that row's surviving tokens alone.
"""
import copy

import pytest
import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.batched import forward_step, generate_batch
from specdraft.decoding.compilation import StepCompiler, row_cache
from specdraft.decoding.rounds.static_cache import RowStaticCache, attention_mask, forward_rows
from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP
from tests.decoding.test_greedy_equivalence import random_head


def reference_logits(model, tokens: list[int], last: int) -> torch.Tensor:
    with torch.inference_mode():
        return kv.forward(model, kv.new_cache(), tokens, last=last)[0]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])  # a bool mask for SDPA, an additive one for eager
def test_rollback_matches_a_dynamic_cache(make_llama, attention):
    target = make_llama(0)
    target.set_attn_implementation(attention)
    assert target.config._attn_implementation == attention
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (3, 7, 1)]
    cache = row_cache(target, 3, 32)
    ids = torch.zeros(3, 7, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
    with torch.inference_mode():
        logits, _ = forward_rows(target, cache, ids)
        for b, r in enumerate(rows):
            torch.testing.assert_close(logits[b, : len(r)], reference_logits(target, r, len(r)))
        # a prefill's read of one position per row (`at`): each row's last prompt token's logits, the same values
        last = torch.tensor([len(r) - 1 for r in rows])
        one, states = forward_rows(target, cache, ids, hidden=True, at=last)
        assert one.shape == (3, 1, logits.shape[-1]) and states.shape[:2] == (3, 7)
        torch.testing.assert_close(one[:, 0], logits[torch.arange(3), last])
        cache.rollback(torch.tensor([len(r) for r in rows]))
        for step in range(3):  # feed 4, keep a different number per row, repeat
            new = torch.randint(0, 96, (3, 4), generator=gen)
            logits, _ = forward_rows(target, cache, new)
            for b in range(3):
                fed = rows[b] + new[b].tolist()
                torch.testing.assert_close(logits[b], reference_logits(target, fed, 4))
            keep = torch.tensor([(step + b) % 5 for b in range(3)])  # 0..4 of the 4 new tokens
            for b in range(3):
                rows[b] = rows[b] + new[b, : keep[b]].tolist()
            cache.rollback(cache.lengths + keep)
    assert cache.lengths.tolist() == [len(r) for r in rows]


def test_a_bfloat16_cache_write_copies_only_the_new_entries():
    """A step writes B x kv_heads x T x head_dim numbers into each layer, not the layer: CPU `scatter_` into a bf16
    buffer converted the whole buffer to float32 and back (two copies of its shape per call, ~70x the store's time
    at B = 16), and every bf16 decode step paid it in every layer. The write lands where scatter_ put it."""
    from transformers import LlamaConfig
    from torch.profiler import ProfilerActivity, profile

    config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    cache = RowStaticCache(config, 3, 16, torch.bfloat16, torch.device("cpu"), forward_kwarg="past_key_values")
    layer, shape = cache.layers[0], tuple(cache.layers[0].keys.shape)
    cache.slots = torch.tensor([[0, 1], [5, 6], [14, 15]])
    k, v = torch.randn(3, 2, 2, 8), torch.randn(3, 2, 2, 8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        layer.update(k, v)
    full_copies = [e.name for e in prof.events() if "copy" in e.name and e.input_shapes and tuple(e.input_shapes[0]) == shape]
    assert full_copies == []
    index = cache.slots[:, None, :, None].expand(-1, 2, -1, 8)
    expected = torch.zeros(shape, dtype=torch.bfloat16).scatter_(2, index, k.bfloat16())
    assert torch.equal(layer.keys, expected)
    assert torch.equal(layer.values, torch.zeros(shape, dtype=torch.bfloat16).scatter_(2, index, v.bfloat16()))


def test_mask_sees_exactly_the_row_prefix():
    mask = attention_mask(torch.tensor([2, 0]), 3, 6, torch.float32)  # (2, 1, 3, 6)
    seen = (mask[:, 0] == 0).int().tolist()
    assert torch.equal(attention_mask(torch.tensor([2, 0]), 3, 6, None)[:, 0], mask[:, 0] == 0)  # the SDPA form
    assert seen[0] == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert seen[1] == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]]


@pytest.mark.slow
def test_compiled_forward_equals_eager(llama_pair):
    """Inductor-compiled verify/draft steps give the eager logits (1e-5) at ragged lengths, and a compiled
    batched decode (fixed K, SpecDec++ per row and lockstep, the batch-aware rule, the global verify budget)
    gives the eager tokens and rounds."""
    target, drafter = llama_pair
    compiled = forward_step(StepCompiler("default"), target)
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for width in (1, 5):
            eager_cache = row_cache(target, 2, 64)
            comp_cache = row_cache(target, 2, 64)
            for lengths in ([3, 9], [10, 4], [12, 13]):  # the same graph at other lengths: no stale constants
                ids = torch.randint(0, 96, (2, width), generator=gen)
                eager_cache.rollback(torch.tensor(lengths))
                comp_cache.rollback(torch.tensor(lengths))
                want = forward_rows(target, eager_cache, ids)[0]
                got = compiled(comp_cache, ids)[0]
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    head = random_head(drafter.config.hidden_size, 0)
    compiler = StepCompiler("default")  # one compiler for every call: each graph compiles once
    from specdraft.decoding.policies.batch_aware import GlobalVerifyBudget, LockstepBatchAwareSpecDec
    from tests.decoding.test_batch_decode import cost_table

    table = cost_table(k_max=5)
    # decision 0 in the first draft graph (the rule drafts at these sizes), a round of no graph (drafts never pay:
    # every row stops at decision 0, known to the host), and decision 0 made eagerly and read (own rate, lockstep)
    never = cost_table(draft=lambda b: 10.0, k_max=5)
    assert LockstepBatchAwareSpecDec(head, table, 0.7, 5).zero_stop(3) is False
    for policy in (FixedK(3), SpecDecPP(head, 0.5, k_max=5), LockstepSpecDecPP(head, 0.5, k_max=5),
                   LockstepBatchAwareSpecDec(head, table, 0.7, 5), LockstepBatchAwareSpecDec(head, never, 0.7, 5),
                   LockstepBatchAwareSpecDec(head, table, 0.7, 5, reference_rate=None),
                   GlobalVerifyBudget(head, table, 0.7, 3)):
        eager = generate_batch(target, prompts, 20, drafter=drafter, policy=policy)
        comp = generate_batch(target, prompts, 20, drafter=drafter, policy=policy, compile=compiler)
        # a rule that reads the batch's size decides differently once an eager decode drops its finished rows
        # (a compiled one keeps them): its tokens, not its rounds, must match
        batch_dependent = isinstance(policy, (LockstepBatchAwareSpecDec, GlobalVerifyBudget))
        if getattr(policy, "table", None) is never:
            assert policy.zero_stop(3) is True and all(sum(c.metrics.drafted) == 0 for c in comp)
        for e, c in zip(eager, comp):
            assert c.tokens == e.tokens
            if not batch_dependent:
                assert (c.metrics.drafted, c.metrics.accepted) == (e.metrics.drafted, e.metrics.accepted)


@pytest.mark.slow
def test_compiled_sampled_drafting_equals_eager(llama_pair):
    """Sampled drafting runs inside the compiled draft graphs too: each round's uniforms are drawn before it, and
    a draft is the inverse CDF of q at its uniform, eager and compiled alike. So from one seed a compiled decode
    gives the eager tokens and rounds (whose distribution the chi-square tests check, test_batch_losslessness),
    for fixed K (one graph a round) and head rules (segments). Batch 1: an eager decode of a batch drops finished
    rows and then draws a narrower stream than a compiled one, which keeps them."""
    from specdraft.decoding.policies.batch_aware import LockstepBatchAwareSpecDec
    from specdraft.decoding.rounds.sampling import SamplingConfig
    from tests.decoding.test_batch_decode import cost_table

    target, drafter = llama_pair
    head = random_head(drafter.config.hidden_size, 0)
    compiler = StepCompiler("default")
    sampling = SamplingConfig(temperature=0.8, top_k=20)
    drafted = accepted = 0
    for policy in (FixedK(3), SpecDecPP(head, 0.5, k_max=5), LockstepBatchAwareSpecDec(head, cost_table(k_max=5), 0.7, 5)):
        for seed, prompt in enumerate(([1, 2, 3], [4, 5, 6, 7, 8, 9, 10])):
            kwargs = dict(drafter=drafter, policy=policy, sampling=sampling, seed=seed)
            eager = generate_batch(target, [prompt], 20, **kwargs)[0]
            comp = generate_batch(target, [prompt], 20, compile=compiler, **kwargs)[0]
            assert comp.tokens == eager.tokens
            assert (comp.metrics.drafted, comp.metrics.accepted) == (eager.metrics.drafted, eager.metrics.accepted)
            drafted += sum(eager.metrics.drafted)
            accepted += sum(eager.metrics.accepted)
    assert drafted > accepted > 0  # rejections and acceptances both


@pytest.mark.slow
def test_compiled_autoregressive_bandit_and_eagle_equal_eager(llama_pair):
    """The other compiled paths: autoregressive (a width-1 verify), UCBSpec lengths (per-row caps under
    a padded verify) and EAGLE-1 and EAGLE-3 chains (the drafter's step and the target's verify with features:
    the final state, or three layers' hidden states)."""
    from specdraft.decoding.policies.batch_length_ucb import LengthUCB
    from tests.decoding.eagle_fixtures import mimic_drafter, tiny_target, trained_eagle3

    target, drafter = llama_pair
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11]]
    for kwargs in ({}, {"drafter": drafter, "policy": LengthUCB((0, 1, 3))}):
        eager = generate_batch(target, prompts, 16, **kwargs)
        comp = generate_batch(target, prompts, 16, compile="default", **kwargs)
        assert [c.tokens for c in comp] == [e.tokens for e in eager]
        assert [c.metrics.drafted for c in comp] == [e.metrics.drafted for e in eager]
    eagle1_target, eagle3_target = tiny_target("llama", 0), tiny_target("llama", 0, layers=3)
    for eagle_target, eagle in ((eagle1_target, mimic_drafter(eagle1_target, 0.3, seed=1)),
                                (eagle3_target, trained_eagle3(eagle3_target, steps=60, greedy=True))):
        eager = generate_batch(eagle_target, prompts, 16, drafter=eagle, policy=FixedK(3))
        comp = generate_batch(eagle_target, prompts, 16, drafter=eagle, policy=FixedK(3), compile="default")
        assert [c.tokens for c in comp] == [e.tokens for e in eager]
        assert [c.metrics.accepted for c in comp] == [e.metrics.accepted for e in eager]


def test_sliding_windows_shorter_than_the_decode_are_refused():
    from transformers import MistralConfig

    from specdraft.core.errors import InputError

    cfg = MistralConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, sliding_window=16)
    RowStaticCache(cfg, 2, 16, torch.float32, torch.device("cpu"), forward_kwarg="cache")  # the window covers the cache: full attention
    with pytest.raises(InputError, match="sliding-window"):
        RowStaticCache(cfg, 2, 64, torch.float32, torch.device("cpu"), forward_kwarg="cache")


def test_compiled_steps_keep_only_the_guards_on_their_arguments():
    """The guard filter of compiled steps: guards on the call's arguments (which pick the graph for a width,
    a batch size or the `hidden` flag) stay; those on the model, on library globals and Python identity
    lambdas go (they cost more than a small model's forward; the step is keyed by its model)."""
    from torch._dynamo.types import GuardFilterEntry

    from specdraft.decoding.compilation import argument_guards

    def entry(name, guard_type="TENSOR_MATCH", is_global=False):
        return GuardFilterEntry(name=name, has_value=False, value=None, guard_type=guard_type,
                                derived_guard_types=(), is_global=is_global, orig_guard=None)

    kept = {"ids": True, "hidden": True, "cache.layers[0].keys": True, "cache.lengths": True,
            "model._modules['model']._modules['layers']": False, "model.config": False,
            "dict(type(model.config).__mro__[1])": False, "G['torch'].nn": False, "cache is owner": False}
    entries = [entry(n, "LAMBDA_GUARD" if n == "cache is owner" else "TENSOR_MATCH", n.startswith("G[")) for n in kept]
    assert argument_guards(entries) == list(kept.values())


def test_compiled_rounds_verify_a_few_widths_and_never_fewer_than_drafted():
    from specdraft.decoding.rounds.shapes import verify_width

    widths = {s: verify_width(s, 8) for s in range(9)}
    assert widths == {0: 0, 1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 7: 8, 8: 8}
    assert all(verify_width(s, 5) == min(5, widths[s]) for s in range(6))  # never past the policy's width


def test_a_rounds_drafter_feeds_as_the_compiled_graphs_run_them(llama_pair):
    """The width-1 drafter forwards a round runs beyond its catch-up (`round_feeds`, which the predictor prices):
    eagerly one per draft but the last; compiled, a rule without a head drafts its whole width in one graph, one
    with a head whole `segments` (HEAD_SEGMENT = 4 positions, then doubling), and no feed after the round's last
    position."""
    from specdraft.decoding.rounds.shapes import HEAD_SEGMENT, round_feeds, segments

    assert HEAD_SEGMENT == 4
    head = random_head(llama_pair[1].config.hidden_size, 0)
    headed, plain = SpecDecPP(head, 0.5, k_max=8), FixedK(8)
    assert [round_feeds(headed, s, False) for s in range(9)] == [0, 0, 1, 2, 3, 4, 5, 6, 7]
    assert [round_feeds(headed, s, True) for s in range(9)] == [0, 4, 4, 4, 4, 7, 7, 7, 7]
    assert [round_feeds(plain, s, True) for s in range(9)] == [0] + [7] * 8
    assert [round_feeds(SpecDecPP(head, 0.5, k_max=6), s, True) for s in (3, 5)] == [4, 5]
    long = SpecDecPP(head, 0.5, k_max=16)
    assert segments(16, long) == [(0, 4), (4, 8), (8, 16)] and segments(16, FixedK(16)) == [(0, 16)]
    assert segments(20, long) == [(0, 4), (4, 8), (8, 16), (16, 20)] and segments(3, long) == [(0, 3)]
    assert [round_feeds(long, s, True) for s in (4, 5, 8, 9, 15, 16)] == [4, 8, 8, 15, 15, 15]
    # the cost of a round: the catch-up and its feeds, whatever it drafted
    from tests.decoding.test_batch_decode import cost_table
    t = cost_table(k_max=8)
    assert t.round_cost(1, 3, feeds=4) - t.round_cost(1, 3) == pytest.approx(2 * t.t_draft(1))


def test_compiled_prefills_run_at_a_few_widths_never_shorter_than_the_prompt():
    from specdraft.decoding.rounds.shapes import prefill_width

    widths = [prefill_width(n) for n in range(1, 300)]
    assert set(widths) == {16, 32, 64, 128, 256, 512}
    assert all(w >= n for n, w in zip(range(1, 300), widths))


def test_under_a_verify_floor_every_k_decodes_over_a_cache_of_one_length():
    """bf16 on a CPU: AR and every K up to 62 allocate the same cache for the same prompts and new tokens (attention's
    sum over the keys follows the cache's length: a 256- and a 320-slot cache parted a real target's greedy output),
    and it holds any of their rounds; fp32 keeps the policy's own reservation."""
    from specdraft.decoding.rounds.shapes import decode_cache_length, drafts_reserved, verify_floor

    floor = verify_floor("bfloat16", "cpu")
    assert floor > 1 and verify_floor("float32", "cpu") == verify_floor("bfloat16", "cuda") == 1
    for longest in range(1, 300, 7):
        for new in (1, 48, 64, 200):
            lengths = {decode_cache_length(longest, new, drafts_reserved(w, floor), "none") for w in (0, 1, 4, 8, 16, 62)}
            assert len(lengths) == 1 and lengths.pop() >= longest + new + 62 + 2, (longest, new)
    assert drafts_reserved(4, 1) == 4 and drafts_reserved(100, floor) == 100


def test_a_bf16_cpu_decode_runs_its_target_forwards_at_least_four_rows_as_its_rows_go(llama_pair):
    """The verify floor counts a forward's rows (batch rows x positions): an AR decode of 8 rows steps 1 position a
    row while 4 or more rows are live, 2 at 2-3 rows, 4 once one is left (an eager decode drops finished rows), and
    alone 4 throughout; K = 4's verify is 5 positions anyway. fp32 steps 1 position a row at every batch size."""
    target = copy.deepcopy(llama_pair[0]).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 64, (6,), generator=gen).tolist() for _ in range(8)]
    seen = []
    hook = target.model.register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)),
                                                  with_kwargs=True)
    try:
        free = generate_batch(target, prompts, 24)
        # stop tokens the rows emit at different steps: the batch shrinks as they stop
        stop = sorted({r.tokens[2 + 2 * i] for i, r in enumerate(free[:7])})
        shapes = {}
        for name, batch in (("batch", prompts), ("alone", prompts[:1])):
            seen.clear()
            generate_batch(target, batch, 24, eos_token_id=stop)
            shapes[name] = steps = seen[1:]  # after the prefill
            assert steps and all(width == -(-4 // rows) for rows, width in steps), steps
        live = {rows for rows, _ in shapes["batch"]}
        assert 8 in live and min(live) < 4 and {w for _, w in shapes["alone"]} == {4}, live
        target.float()
        seen.clear()
        generate_batch(target, prompts, 8)
        assert all(width == 1 for _, width in seen[1:]), seen
    finally:
        hook.remove()


def test_a_decode_cache_holds_the_longest_prompt_and_the_round_not_the_padding(llama_pair):
    """A decode's static cache: the longest prompt, the new tokens, a round's drafts and two more, rounded up to
    64 slots; compiled, also the padded prefill's width (which the prefill writes). A 68-token prompt prefills 128
    positions compiled, and 4 new tokens need 74 slots: 128, not the 192 of the padded width plus the new tokens
    (every step attends over every slot). Checked in a decode with the compiled path's padding and cache reuse and
    eager functions: it allocates what `decode_cache_length` says and gives the eager decode's tokens."""
    from specdraft.decoding.rounds.shapes import decode_cache_length

    assert decode_cache_length(68, 4, 0, "none") == decode_cache_length(68, 4, 0, "default") == 128
    assert decode_cache_length(68, 48, 8, "default") == 128 and decode_cache_length(68, 60, 8, "none") == 192
    assert decode_cache_length(20, 4, 0, "none") == decode_cache_length(20, 4, 0, "default") == 64
    assert decode_cache_length(130, 4, 0, "none") == 192 and decode_cache_length(130, 4, 0, "default") == 256

    class Padded(StepCompiler):  # the compiled decode's padding and cache reuse, with eager functions
        def __init__(self):
            super().__init__("default")
            self.sizes = []

        def apply(self, fn, model, name, graphs=False):
            return fn

        def cache(self, model, batch, max_len):
            self.sizes.append(max_len)
            return super().cache(model, batch, max_len)

    target, drafter = llama_pair
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 96, (n,), generator=gen).tolist() for n in (68, 5)]
    padded = Padded()
    with torch.inference_mode():
        for policy in (None, FixedK(3)):
            kw = dict(drafter=drafter, policy=policy) if policy else {}
            want = generate_batch(target, prompts, 4, **kw)
            got = generate_batch(target, prompts, 4, compile=padded, **kw)
            assert [r.tokens for r in got] == [r.tokens for r in want]
    assert padded.sizes == [128, 128, 128]  # AR's target cache; fixed K's target and drafter caches


class EagerRecording(StepCompiler):
    """A compiled decode's steps (its segments, padding and reads) with each graph replaced by its eager function,
    recording the target's forward widths (`verifies`: the prefill's, then each round's verify) and the name of
    every draft graph called (`drafts`: ("draft", rule, sampling, bounds, width, decide_zero))."""

    def __init__(self, target):
        super().__init__("default")
        self.target, self.verifies, self.drafts = target, [], []

    def apply(self, fn, model, name, graphs=False):
        def step(*args):
            if model is self.target and name == "forward":
                self.verifies.append(args[1].shape[1])
            elif isinstance(name, tuple) and name[0] == "draft":
                self.drafts.append(name)
            return fn(*args)
        return step


def test_a_compiled_head_round_verifies_its_longest_rows_drafts_not_its_segment(llama_pair):
    """Compiled, a head rule drafts in segments of HEAD_SEGMENT positions, but its round verifies at the longest
    row's drafts (padded, `verify_width`), as the cost table prices it: rounds that stop after 2 drafts verify 3
    positions (the last token and 2 drafts), not the 5 of the segment's end. Graphs replaced by their eager functions (the compiled decode's
    segments, padding and reads)."""
    target, drafter = llama_pair
    # a head that predicts rejection everywhere: SpecDec++ stops each row at its first decision with a head (k = 2)
    head = torch.nn.Linear(drafter.config.hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.constant_(head.bias, -10.0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    recording = EagerRecording(target)
    with torch.inference_mode():
        want = generate_batch(target, prompts, 8, drafter=drafter, policy=SpecDecPP(head, 0.5, k_max=8))
        got = generate_batch(target, prompts, 8, drafter=drafter, policy=SpecDecPP(head, 0.5, k_max=8),
                             compile=recording)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert all(max(r.metrics.drafted) == 2 for r in got), [r.metrics.drafted for r in got]
    rounds = recording.verifies[1:]  # after the prefill
    assert rounds and max(rounds) == 3, rounds


@pytest.mark.slow
def test_compiled_steps_of_two_models_of_one_shape_stay_apart(make_llama):
    """Two models of the same architecture: each compiled step gives its own model's logits (the steps keep
    no guard on the model and hold its weights in the graph, so a graph of one must never serve the other)."""
    a, b = make_llama(0), make_llama(1)
    ids = torch.tensor([[3, 5, 7]])
    compiler = StepCompiler("default")
    with torch.inference_mode():
        for model in (a, b, a):
            cache = row_cache(model, 1, 32)
            want = forward_rows(model, cache, ids)[0]
            torch.testing.assert_close(forward_step(compiler, model)(cache, ids)[0], want, atol=1e-5, rtol=1e-5)


def test_rules_that_differ_only_in_their_cost_tables_get_graphs_of_their_own():
    """A compiled draft graph is kept under `rule_key`: two batch-aware rules with equal numbers but different
    tables print alike, and the second reused the first's graphs, deciding with the first's table (found when a
    benchmark profiled a table per batch size: B = 2's rule raised B = 1's table's 'no batch size = 2')."""
    from specdraft.decoding.batch_draft import rule_key
    from specdraft.decoding.policies.batch_aware import LockstepBatchAwareSpecDec
    from tests.decoding.test_batch_decode import cost_table

    head = random_head(16, 0)
    one, other = cost_table(k_max=5), cost_table(draft=lambda b: 0.3, k_max=5)
    first, second = LockstepBatchAwareSpecDec(head, one, 0.7, 5), LockstepBatchAwareSpecDec(head, other, 0.7, 5)
    assert repr(first) == repr(second) and rule_key(first) != rule_key(second)
    assert rule_key(first) == rule_key(LockstepBatchAwareSpecDec(head, one, 0.7, 5))  # a new policy, same graphs


def test_compiled_steps_trace_with_the_weights_in_the_graph_and_leave_dynamos_config_as_it_was():
    """`weights_in_graph` turns on dynamo's install_free_tensors around each call (it is read when a call traces)
    and restores it afterwards, also when the call raises: other compiles in the process keep their defaults."""
    import torch._dynamo.config as dynamo_config

    from specdraft.decoding.compilation import weights_in_graph

    seen = []

    def step(x):
        seen.append(dynamo_config.install_free_tensors)
        if x is None:
            raise ValueError("boom")
        return x

    before = dynamo_config.install_free_tensors
    assert weights_in_graph(step)(3) == 3 and seen == [True] and dynamo_config.install_free_tensors == before
    with pytest.raises(ValueError):
        weights_in_graph(step)(None)
    assert seen == [True, True] and dynamo_config.install_free_tensors == before


def test_a_compiled_head_round_of_16_drafts_runs_three_draft_graphs(llama_pair):
    """Compiled, a head rule's round drafts in doubling segments: a round that drafts all 16 calls the graphs of
    [0, 4), [4, 8) and [8, 16), not four of 4, and gives the eager tokens and rounds. Graphs replaced by their eager
    functions (the compiled decode's segments, padding and reads)."""
    target, drafter = llama_pair
    # a head that predicts acceptance everywhere: no row stops before K_max
    head = torch.nn.Linear(drafter.config.hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.constant_(head.bias, 10.0)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    recording = EagerRecording(target)
    with torch.inference_mode():
        want = generate_batch(target, prompts, 40, drafter=drafter, policy=SpecDecPP(head, 0.5, k_max=16))
        got = generate_batch(target, prompts, 40, drafter=drafter, policy=SpecDecPP(head, 0.5, k_max=16),
                             compile=recording)
    assert [(r.tokens, r.metrics.drafted) for r in got] == [(r.tokens, r.metrics.drafted) for r in want]
    assert max(d for r in got for d in r.metrics.drafted) == 16
    bounds = [name[3] for name in recording.drafts]
    assert bounds[:3] == [(0, 4), (4, 8), (8, 16)] and set(bounds) == {(0, 4), (4, 8), (8, 16)}


def test_a_round_drafts_no_further_than_the_length_limit_leaves_room_for(llama_pair):
    """Near a row's end a round of fixed K = 16 runs the draft graph and the verify of the padded room the length
    limit leaves (6 new tokens: at most 5 drafts, a graph of 8), not of 16: the eager tokens and rounds either way.
    Graphs replaced by their eager functions."""
    target, drafter = llama_pair
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    recording = EagerRecording(target)
    with torch.inference_mode():
        want = generate_batch(target, prompts, 6, drafter=drafter, policy=FixedK(16))
        got = generate_batch(target, prompts, 6, drafter=drafter, policy=FixedK(16), compile=recording)
    assert [(r.tokens, r.metrics.drafted) for r in got] == [(r.tokens, r.metrics.drafted) for r in want]
    widths = [name[4] for name in recording.drafts]  # the width of the round each draft graph drafts
    assert widths and max(widths) == 8, widths
    assert max(recording.verifies[1:]) == 9, recording.verifies  # after the prefill


class ShapeRecording(StepCompiler):
    """A compiled decode's calls with each graph replaced by its eager function, recording per compiled function
    (its name) the shapes of the tensors and the values of the ints it is called with: what dynamo's guards on
    the arguments tell apart, one graph per distinct signature."""

    def __init__(self):
        super().__init__("default")
        self.signatures: dict = {}

    def apply(self, fn, model, name, graphs=False):
        def step(*args):
            signature = tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args
                              if isinstance(a, (torch.Tensor, int)))
            self.signatures.setdefault(name, set()).add(signature)
            return fn(*args)
        return step


def test_a_rounds_tails_are_one_graph_per_width_whatever_the_policys_k(llama_pair):
    """Decodes of fixed K = 1, 2, 3 and 4 at one batch size compile the round's verify-and-commit tail once per
    verify width, not once per K: its output buffer's width does not follow K (it did, max_new + K + 2, and a
    sweep of Ks, head rules and 5 batch sizes passed dynamo's recompile limit, after which new shapes ran
    eagerly inside a compiled benchmark)."""
    target, drafter = llama_pair
    recording = ShapeRecording()
    with torch.inference_mode():
        for k in (1, 2, 3, 4):
            generate_batch(target, [[1, 2, 3], [4, 5, 6, 7]], 6, drafter=drafter, policy=FixedK(k), compile=recording)
    tails = recording.signatures["verify"]
    widths = {signature[0][1] for signature in tails}  # the logits' (rows, width, vocab)
    assert widths >= {2, 3, 5} and len(tails) == len(widths), sorted(tails)
