"""The decoder's measured cost table (decoding/costs/model.CostTable) and its profiler
(decoding/costs/profile.py) on tiny random models: shape, the sanity that must hold, the on-disk cache,
the JSON round trip, and one-line errors."""
import copy
import dataclasses
import json

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.costs.profile import (cached_cost_table, isotonic, model_identity, monotone_grid,
                                             profile_cost_table, profiled_widths)
from specdraft.decoding.costs.rules import price_head_rules, price_rules
from specdraft.decoding.costs.model import CostTable
from specdraft.decoding.rounds.int8_linear import quantize_linears
from specdraft.decoding.rounds.shapes import verify_width
from tests.decoding.conftest import tiny_llama


@pytest.fixture(scope="module")
def pair():
    # deep enough that a (16 x 5)-token verify is clearly dearer than a 1-token step even on a busy box
    return tiny_llama(0, layers=4), tiny_llama(1, layers=1)


@pytest.fixture(scope="module")
def profiled(pair):
    return profile_cost_table(*pair, batch_sizes=[16, 1, 4], max_width=5, compile="none", repeats=3)


def test_shape_identity_and_sanity(profiled, pair):
    t = profiled
    assert t.batch_sizes == (1, 4, 16) and t.widths == (1, 2, 3, 4, 5) and t.max_drafts == 4
    assert len(t.verify) == 3 and all(len(r) == 5 for r in t.verify) and len(t.draft) == len(t.catchup) == 3
    assert t.compile == "none" and t.torch_version == torch.__version__ and t.device.startswith("cpu")
    assert t.target_id == model_identity(pair[0]) != t.drafter_id == model_identity(pair[1])
    # the identity is the shape, not the weights: a retrained drafter of the same shape shares the table
    assert model_identity(tiny_llama(7, layers=1)) == t.drafter_id
    int8 = tiny_llama(7, layers=1)  # the same shape with int8 weights steps at another cost: a table of its own
    assert quantize_linears(int8) and model_identity(int8) != t.drafter_id
    # what must hold whatever the load: 80 positions through 4 layers cost more than 1; a round that drafts
    # pays the drafter on top of its verify
    assert t.t_verify(16, 5) > t.t_verify(1, 1)
    assert all(t.round_cost(b, k) > t.t_verify(b, k + 1) for b in t.batch_sizes for k in range(1, 5))
    assert t.round_cost(4, 0) == t.t_verify(4, 1)


def profiler_reads(clock: list, monkeypatch) -> None:
    """The profiler's timer reads clock[0], a virtual clock the test advances."""
    import specdraft.decoding.costs.profile as cp
    from specdraft.decoding.timing import Timing

    def virtual_timed_call(fn, device="cpu"):
        before = clock[0]
        out = fn()
        return out, Timing(time=clock[0] - before, wall=0.0, cpu=0.0)

    monkeypatch.setattr(cp, "timed_call", virtual_timed_call)


def on_a_virtual_clock(pair, monkeypatch, cost) -> None:
    """Every model step the profiler makes costs cost(is_drafter, ids) seconds on a virtual clock, which its
    timer reads (the steps still run, so the caches move as in a profile)."""
    import specdraft.decoding.costs.profile as cp

    clock = [0.0]
    real_step = cp.forward_step

    def fake_forward_step(compiler, model):
        step = real_step(compiler, model)

        def timed(cache, ids, *rest):
            clock[0] += cost(model is pair[1], ids)
            return step(cache, ids, *rest)
        return timed

    monkeypatch.setattr(cp, "forward_step", fake_forward_step)
    profiler_reads(clock, monkeypatch)


def test_drafter_steps_are_priced_as_a_round_chains_them(pair, monkeypatch):
    """On a virtual clock where a drafter step's cost depends on what ran before it (as warm caches make it on a
    real machine: the first width-1 step after the catch-up dearer than the ones after it), the table prices
    every round of k >= 2 drafts at its chain's cost, and the target step that precedes a chain is not in it."""
    last = [None]

    def cost(drafter, ids):
        width = ids.shape[1]
        if not drafter:
            value = 100.0 + width  # the target: never inside a drafter's chain
        elif width == 2:
            value = 3.0  # the catch-up
        else:
            value = 2.0 if last[0] == 2 else 1.0  # first width-1 step after the catch-up, then the steady ones
        last[0] = width if drafter else None
        return value

    on_a_virtual_clock(pair, monkeypatch, cost)
    t = profile_cost_table(*pair, batch_sizes=[1, 2], max_width=6, compile="none", repeats=2)
    assert t.draft == (1.0, 1.0) and t.catchup == (4.0, 4.0)  # 3 + 2 - 1: the first step's excess rides along
    for k in range(2, t.max_drafts + 1):  # the chain: 3 + 2 + (k - 2) * 1
        assert t.round_cost(1, k) - t.t_verify(1, k + 1) == pytest.approx(3.0 + 2.0 + (k - 2) * 1.0)
    assert t.t_verify(2, 3) == 103.0


def test_a_step_is_priced_after_what_precedes_it_in_a_decode(pair, monkeypatch):
    """On a virtual clock where a target step costs more right after a call of another shape (as a real CPU's
    caches make it: compiled, B = 1's one-token step cost 2.8 ms after itself and 3.2 ms after B = 32's 9-wide
    one), the table prices each verify at its cost after itself, as a decode runs it, however the profile
    interleaves batch sizes and widths."""
    previous = [None]

    def cost(drafter, ids):
        if drafter:
            return 1.0
        shape = tuple(ids.shape)
        warm, previous[0] = previous[0] == shape, shape
        return 100.0 + ids.shape[1] + (0.0 if warm else 50.0)

    on_a_virtual_clock(pair, monkeypatch, cost)
    t = profile_cost_table(*pair, batch_sizes=[1, 2], max_width=4, compile="none", repeats=2)
    assert t.verify == ((101.0, 102.0, 103.0, 104.0),) * 2


def test_isotonic_is_the_least_squares_non_decreasing_fit():
    """Against the min-max formula of isotonic regression, y_i = max_{j <= i} min_{k >= i} mean(x_j..x_k), on
    random sequences with ties and long violating runs."""
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 5, 9, 17):
        for _ in range(20):
            x = torch.randint(0, 6, (n,), generator=gen).double().tolist()
            want = [max(min(sum(x[j:k + 1]) / (k + 1 - j) for k in range(i, n)) for j in range(i + 1)) for i in range(n)]
            assert isotonic(x) == pytest.approx(want)
    assert isotonic([3.0, 1.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0]) and isotonic([1.0, 2.0]) == [1.0, 2.0]


def test_the_table_puts_its_steps_in_order(pair, monkeypatch):
    """On a virtual clock where a 3-wide verify costs less than a 2-wide one and batch 1 more than batch 2 (as a
    slow phase catching every pass of some entries leaves them), the table is non-decreasing in width and in batch
    size, each run out of order replaced by its mean; a table in order is kept as timed."""
    def cost(drafter, ids):
        batch, width = ids.shape
        if drafter:
            return 1.0 + 0.5 * (batch == 1)  # batch 1's drafter steps dearer than batch 2's
        return 100.0 + width - 3.0 * (width == 3) + 5.0 * (batch == 1)

    on_a_virtual_clock(pair, monkeypatch, cost)
    t = profile_cost_table(*pair, batch_sizes=[1, 2], max_width=4, compile="none", repeats=1)
    # rows [106, 107, 105, 109] and [101, 102, 100, 104] pool their first three; then each column pools its two rows
    assert [v for row in t.verify for v in row] == pytest.approx([103.5, 103.5, 103.5, 106.5] * 2)
    # drafter chains of 1 and 2 steps after the catch-up, [3, 2] and [4.5, 3] ms at B = 1, 2: each pooled over B
    assert t.draft == pytest.approx((1.25, 1.25)) and t.catchup == pytest.approx((1.25, 1.25))
    assert monotone_grid([[1.0, 2.0], [3.0, 4.0]]) == ((1.0, 2.0), (3.0, 4.0))


def test_calibration_decodes_are_timed_after_their_own_batch_and_method(pair, monkeypatch):
    """Each timed calibration decode follows an untimed decode of the same batch size and method: after another
    batch size's decode the short one paid for refilling the CPU's caches, and the difference of the two lengths
    took it from the loop (compiled, B = 1's loop came out 0 in a table of B = 1, 8, 32, 0.44 ms alone)."""
    import specdraft.decoding.batched as batched
    import specdraft.decoding.costs.profile as cp

    calls, timed = [], []
    real, real_timed = batched.generate_batch, cp.timed_call

    def recording(target, prompts, n, drafter=None, **k):
        calls.append((len(prompts), drafter is not None))
        return real(target, prompts, n, drafter=drafter, **k)

    def recording_timed(fn, device="cpu"):
        before = len(calls)
        out = real_timed(fn, device)
        if len(calls) > before:  # a decode (not a step)
            timed.append((calls[before - 1], calls[before]))
        return out

    monkeypatch.setattr(batched, "generate_batch", recording)
    monkeypatch.setattr(cp, "timed_call", recording_timed)
    profile_cost_table(*pair, batch_sizes=[1, 2], max_width=3, repeats=1, context=20, calibrate=True)
    assert len(timed) == 24 and all(before == this for before, this in timed)  # B x (AR, 2 Ks) x 2 lengths x 2 passes


def test_the_loop_is_calibrated_from_decodes(pair, profiled):
    assert profiled.loop == profiled.loop_spec == profiled.loop_draft == ()  # off by default: a start wants seconds
    t = profile_cost_table(*pair, batch_sizes=[1, 4], max_width=3, compile="none", repeats=1, calibrate=True)
    assert len(t.loop) == len(t.loop_spec) == len(t.loop_draft) == 2 and min(t.loop_spec + t.loop_draft) >= 0
    # the per-round term is signed (a loop may run a step faster than it times alone), a step in it never free
    assert all(t.t_verify(b, 1) + t.t_loop(b) > 0 for b in t.batch_sizes)
    # the decode loop's own work is priced into every round, on top of the steps
    assert t.round_cost(4, 2) == pytest.approx(t.t_catchup(4) + t.t_draft(4) + t.t_verify(4, 3) + t.t_loop(4)
                                               + t.t_loop_spec(4) + 2 * t.t_loop_draft(4))
    assert t.round_cost(1, 0) == t.t_verify(1, 1) + t.t_loop(1)
    # a call's start: its setup beyond the prefills, and the prefill steps timed at the widths the cache holds
    assert len(t.start) == len(t.start_draft) == 2 and min(t.start + t.start_draft) >= 0
    assert t.prefill_widths == (16, 32, 64, 128) and t.cache_length == 128
    assert all(len(part) == 2 and all(len(r) == 4 and min(r) > 0 for r in part) for part in (t.prefill, t.prefill_draft))
    assert t.prefill_positions(t.context) == 64
    assert t.t_start(4, False) == pytest.approx(t.start[1] + t.prefill[1][2])  # 64 positions: a timed width
    assert t.t_start(4, True) == pytest.approx(t.t_start(4, False) + t.start_draft[1] + t.prefill_draft[1][2])
    assert profiled.t_start(1, True) == 0.0  # uncalibrated: no start priced
    assert CostTable.from_dict(t.as_dict()) == t


def test_a_compiled_start_is_priced_at_the_prefill_width():
    """Compiled, a call's prefill runs right-padded to a power of two (`prefill_width`): a batch whose longest
    prompt is 68 tokens prefills 128 positions, twice a 52-token batch's 64, and its start is priced at that,
    not at 68 / 52 of it (on the demo target at B = 8 it measured ~2x). Eager, the prompt's length itself."""
    eager = CostTable(batch_sizes=(1, 8), widths=(1, 2, 3, 5), verify=((1.0, 1.1, 1.2, 1.4), (2.0, 2.2, 2.4, 2.8)),
                      draft=(0.1, 0.2), catchup=(0.1, 0.2), device="cpu", torch_version="x", compile="none",
                      target_id="t", drafter_id="d", context=40, loop=(0.0, 0.0), loop_draft=(0.0, 0.0),
                      start=(3.0, 6.0), start_draft=(1.0, 2.0))
    compiled = dataclasses.replace(eager, compile="default")
    assert [compiled.prefill_positions(n) for n in (16, 40, 52, 64, 65, 68)] == [16, 64, 64, 64, 128, 128]
    assert [eager.prefill_positions(n) for n in (40, 52, 68)] == [40, 52, 68]
    # a table without prefill steps (an older one) scales its start by the positions
    for drafter in (False, True):
        base = compiled.t_start(8, drafter)  # the context's 40 tokens prefill 64 positions
        assert compiled.t_start(8, drafter, compiled.prefill_positions(52)) == pytest.approx(base)
        assert compiled.t_start(8, drafter, compiled.prefill_positions(68)) == pytest.approx(2 * base)
        assert eager.t_start(8, drafter, eager.prefill_positions(68)) == pytest.approx(68 / 40 * eager.t_start(8, drafter))
    # with them: the setup plus the prefills at the positions (a 128-wide one need not cost 2x a 64-wide one)
    timed = dataclasses.replace(compiled, prefill_widths=(16, 32, 64, 128), prefill=((1, 2, 3, 5), (4, 6, 10, 40)),
                                prefill_draft=((0.1, 0.2, 0.3, 0.5), (0.4, 0.6, 1.0, 4.0)))
    assert timed.t_start(8, False, timed.prefill_positions(68)) == pytest.approx(6.0 + 40)
    assert timed.t_start(8, True, timed.prefill_positions(68)) == pytest.approx(6.0 + 2.0 + 40 + 4.0)
    assert timed.t_start(8, False) == pytest.approx(6.0 + 10)  # the context's 64 positions
    assert timed.t_start(1, False, 8) == pytest.approx(3.0 + 1)  # below the narrowest: priced as it
    eager_timed = dataclasses.replace(timed, compile="none")
    assert eager_timed.t_start(8, False, 48) == pytest.approx(6.0 + 8)  # between 32 and 64 positions
    assert CostTable.from_dict(timed.as_dict()) == timed
    with pytest.raises(InputError, match="prefill"):
        dataclasses.replace(timed, prefill=((1, 2, 3), (4, 6, 10)))


def test_a_prefill_past_the_widest_timed_width_is_extended_not_refused():
    """A long prompt is an ordinary prompt: past the widest timed prefill its cost follows the line through the
    two widest (B = 8: 10 -> 40 over 64 -> 128 positions, 30 per 64), and `extends_prefill` says so; within the
    widths nothing changes, and a batch size or verify width outside the table is still refused."""
    timed = CostTable(batch_sizes=(1, 8), widths=(1, 2), verify=((1.0, 1.1), (2.0, 2.2)), draft=(0.1, 0.2),
                      catchup=(0.1, 0.2), device="cpu", torch_version="x", compile="none", target_id="t",
                      drafter_id="d", context=40, loop=(0.0, 0.0), loop_draft=(0.0, 0.0), start=(3.0, 6.0),
                      start_draft=(1.0, 2.0), prefill_widths=(16, 32, 64, 128), prefill=((1, 2, 3, 5), (4, 6, 10, 40)),
                      prefill_draft=((0.1, 0.2, 0.3, 0.5), (0.4, 0.6, 1.0, 4.0)))
    assert timed.t_prefill(8, 256, False) == pytest.approx(40 + 30 * 2)
    assert timed.t_prefill(8, 2048, True) == pytest.approx(40 + 30 * 30 + 4.0 + 3.0 * 30)
    assert timed.t_start(1, False, 379) == pytest.approx(3.0 + 5 + 2 / 64 * (379 - 128))
    assert [timed.extends_prefill(n) for n in (64, 128, 129, 2048)] == [False, False, True, True]
    with pytest.raises(InputError, match="batch size = 9"):
        timed.t_prefill(9, 256, False)
    with pytest.raises(InputError, match="verify width = 3"):
        timed.t_verify(1, 3)


def test_a_table_records_its_dtype_and_prices_no_other(pair):
    """The steps' dtype is the target's, recorded with the table (JSON round trip, the rendered header) and in its
    cache key; a table of another dtype, or of none (an older one), is refused for a decoder of this one."""
    t = profile_cost_table(*pair, batch_sizes=[1], max_width=2, repeats=1)
    assert t.dtype == "float32" and ", float32," in t.render() and CostTable.from_dict(t.as_dict()) == t
    t.check_dtype("float32", "here")
    with pytest.raises(InputError, match=r"profiled in float32, and the target runs in bfloat16 here"):
        t.check_dtype("bfloat16", "here")
    older = {k: v for k, v in t.as_dict().items() if k != "dtype"}
    with pytest.raises(InputError, match="records no dtype"):
        CostTable.from_dict(older).check_dtype("float32", "FILE")
    bf16 = [copy.deepcopy(m).to(torch.bfloat16) for m in pair]
    assert model_identity(bf16[0]) != model_identity(pair[0])
    assert profile_cost_table(*bf16, batch_sizes=[1], max_width=2, repeats=1).dtype == "bfloat16"


def test_lookup_interpolates_and_never_extrapolates(profiled):
    t = profiled
    mid = t.t_verify(10, 3)
    assert mid == pytest.approx(t.t_verify(4, 3) + (t.t_verify(16, 3) - t.t_verify(4, 3)) / 2)
    for bad in (lambda: t.t_verify(32, 1), lambda: t.t_verify(1, 6), lambda: t.t_draft(0.5), lambda: t.round_cost(1, 5)):
        with pytest.raises(InputError, match="profile") as e:
            bad()
        assert "\n" not in str(e.value)


def test_save_load_round_trip(profiled, tmp_path):
    profiled.save(tmp_path / "t.json")
    assert CostTable.load(tmp_path / "t.json") == profiled


def test_compiled_tables_price_the_verify_width():
    assert profiled_widths(9, "default") == (1, 2, 3, 5, 9)
    assert profiled_widths(4, "none") == (1, 2, 3, 4)
    assert [verify_width(k, 8) for k in range(9)] == [0, 1, 2, 4, 4, 8, 8, 8, 8]
    t = CostTable(batch_sizes=(1,), widths=(1, 2, 3, 5, 9), verify=((1.0, 2.0, 3.0, 5.0, 9.0),), draft=(0.5,),
                  catchup=(0.7,), device="x", torch_version="x", compile="default", target_id="t", drafter_id="d")
    assert t.round_cost(1, 3) == pytest.approx(0.7 + 2 * 0.5 + 5.0)  # 3 drafts verify at width 4 + 1


def test_the_cache_is_hit_on_a_second_start(pair, tmp_path, monkeypatch):
    first, path, hit = cached_cost_table(*pair, [1, 2], 3, repeats=1, directory=tmp_path)
    assert not hit and path.is_file() and path.parent == tmp_path
    import specdraft.decoding.costs.profile as cp

    monkeypatch.setattr(cp, "profile_cost_table", lambda *a, **k: pytest.fail("re-profiled despite the cache"))
    second, path2, hit2 = cached_cost_table(*pair, [2, 1], 3, repeats=1, directory=tmp_path)
    assert hit2 and path2 == path and second == first
    # another mode or grid is another entry; a torn file is re-profiled, not trusted
    monkeypatch.undo()
    path.write_text("{")
    third, _, hit3 = cached_cost_table(*pair, [1, 2], 3, repeats=1, directory=tmp_path)
    assert not hit3 and CostTable.load(path) == third


def test_a_process_that_waits_for_anothers_profile_reads_its_table(pair, tmp_path, monkeypatch):
    """Two starts on an empty cache: while one process profiles (holding the profiling lock), the other waits,
    says so once, and then reads the table the first wrote instead of timing it again."""
    import subprocess
    import sys

    import specdraft.decoding.costs.profile as cp

    table, path, _ = cached_cost_table(*pair, [1], 3, repeats=1, directory=tmp_path / "made")
    written = tmp_path / "cache" / path.name
    # a second process takes the lock, then (after we start waiting) writes the table and lets go
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, pathlib, shutil, sys, time\n"
        f"d = pathlib.Path({str(tmp_path / 'cache')!r}); d.mkdir(parents=True, exist_ok=True)\n"
        "f = open(d / '.profiling.lock', 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('locked', flush=True); time.sleep(1.5)\n"
        f"shutil.copy({str(path)!r}, {str(written)!r})\n")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    monkeypatch.setattr(cp, "profile_cost_table", lambda *a, **k: pytest.fail("profiled while another process did"))
    waits = []
    got, got_path, hit = cached_cost_table(*pair, [1], 3, repeats=1, directory=tmp_path / "cache", on_wait=waits.append)
    assert holder.wait(timeout=30) == 0
    assert hit and got_path == written and got == table
    assert len(waits) == 1 and "waiting for another process" in waits[0]


class SlowHead(torch.nn.Module):
    """A head whose forward burns `ms` of this process's CPU time: what a rule's pricing must find per draft."""

    def __init__(self, hidden: int, ms: float):
        super().__init__()
        self.lin, self.ms = torch.nn.Linear(hidden, 1), ms

    def forward(self, x):
        import time

        end = time.process_time() + self.ms / 1e3
        while time.process_time() < end:
            pass
        return self.lin(x).squeeze(-1)


def test_rules_are_priced_per_draft_and_per_round(profiled):
    from specdraft.decoding.policies.batch_aware import LockstepBatchAwareSpecDec, Prior
    from specdraft.decoding.policies.stopping import LockstepSpecDecPP

    head = SlowHead(32, 2.0)
    rules = [LockstepSpecDecPP(head, 0.7, 4), LockstepBatchAwareSpecDec(head, profiled, Prior((0.8,)), 4)]
    t = price_rules(profiled, rules, 32, repeats=3, inner=2)
    assert [name for name, *_ in t.rules] == ["LockstepSpecDecPP", "LockstepBatchAwareSpecDec"]
    for name, per_round, per_draft in t.rules:
        # 4 drafts run the head 3 times (the first draft has no e yet): ~1.5 ms per draft, none per round
        assert all(1.0e-3 < d < 3.0e-3 for d in per_draft) and all(r < 1.0e-3 for r in per_round)
        assert t.round_cost(4, 2, name) == pytest.approx(profiled.round_cost(4, 2) + t.t_rule(4, name)[0]
                                                         + 2 * t.t_rule(4, name)[1])
    assert t.round_cost(4, 2, "FixedK") == profiled.round_cost(4, 2)  # an unpriced rule pays nothing extra
    assert CostTable.from_dict(json.loads(json.dumps(t.as_dict()))) == t and "rule LockstepSpecDecPP" in t.render()
    # priced again: the new costs replace the old, other rules stay
    again = price_rules(t, rules[:1], 32, repeats=1, inner=1)
    assert [name for name, *_ in again.rules] == ["LockstepSpecDecPP", "LockstepBatchAwareSpecDec"]
    with pytest.raises(InputError, match="hidden_size"):
        price_rules(profiled, rules, 0)
    bad = {**t.as_dict(), "rules": {"X": {"round": [0.0], "draft": [0.0, 0.0, 0.0]}}}
    with pytest.raises(InputError, match="re-price"):
        CostTable.from_dict(bad)


@pytest.mark.slow
def test_compiled_rules_are_priced_from_a_compiled_segment(profiled):
    """Under a compile mode a rule's work is priced from a compiled segment of it (HEAD_SEGMENT positions of
    head and decision, as inside the decoder's draft graphs), which decides as the eager rule does."""
    from specdraft.decoding.policies.decide import head_sigma
    from specdraft.decoding.rounds.shapes import HEAD_SEGMENT
    from specdraft.decoding.compilation import StepCompiler
    from specdraft.decoding.costs.rules import _rule_segment
    from specdraft.decoding.policies.stopping import LockstepSpecDecPP, SpecDecPP
    from tests.decoding.test_greedy_equivalence import random_head

    head = random_head(32, 0)
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(0))
    for policy in (SpecDecPP(head, 0.45, 8), LockstepSpecDecPP(head, 0.45, 8)):
        with torch.inference_mode():
            state, drafting = _rule_segment(StepCompiler("default"), policy)(policy.round_state(5, "cpu"), hidden,
                                                                              torch.ones(5, dtype=torch.bool))
            want_state, want = policy.round_state(5, "cpu"), torch.ones(5, dtype=torch.bool)
            for i in range(HEAD_SEGMENT):
                want_state, stop = policy.stop_rows(want_state, i + 1, head_sigma(head, hidden), want)
                want = want & ~stop
        assert torch.equal(drafting, want)
    compiled = CostTable.from_dict({**profiled.as_dict(), "compile": "default"})
    t = price_rules(compiled, [LockstepSpecDecPP(head, 0.7, 4)], 32, repeats=2, inner=2)
    (name, per_round, per_draft), = t.rules
    assert name == "LockstepSpecDecPP" and len(per_round) == len(per_draft) == 3
    assert min(per_round + per_draft) >= 0


def test_a_head_is_priced_once_and_cached_with_the_table(pair, tmp_path):
    from specdraft.decoding.policies.acceptance_head import AcceptanceHead
    from specdraft.decoding.policies.batch_aware import Prior

    hidden = pair[1].config.hidden_size
    head = AcceptanceHead(hidden, 1)
    with pytest.raises(InputError, match="prior"):
        cached_cost_table(*pair, [1], 3, repeats=1, directory=tmp_path, head=head)
    first, path, hit = cached_cost_table(*pair, [1], 3, repeats=1, directory=tmp_path, head=head, prior=Prior((0.8,)))
    assert not hit and {name for name, *_ in first.rules} == {
        "SpecDecPP", "LockstepSpecDecPP", "BatchAwareSpecDec", "LockstepBatchAwareSpecDec", "GlobalVerifyBudget"}
    second, path2, hit2 = cached_cost_table(*pair, [1], 3, repeats=1, directory=tmp_path, head=AcceptanceHead(hidden, 1),
                                            prior=Prior((0.8,)))
    assert hit2 and path2 == path and second == first
    # a head of another shape, or none, is another table
    assert cached_cost_table(*pair, [1], 3, repeats=1, directory=tmp_path, head=AcceptanceHead(hidden, 2),
                             prior=Prior((0.8,)))[1] != path
    assert cached_cost_table(*pair, [1], 3, repeats=1, directory=tmp_path)[1] != path
    assert price_head_rules(first, head, hidden, Prior((0.8,)), 2).rules != ()


@pytest.mark.parametrize("kwargs, message", [
    (dict(batch_sizes=[], max_width=3), "batch sizes"),
    (dict(batch_sizes=[0], max_width=3), "batch sizes"),
    (dict(batch_sizes=[1], max_width=1), "max_width"),
    (dict(batch_sizes=[1], max_width=3, compile="fast"), "compile"),
    (dict(batch_sizes=[1], max_width=3, repeats=0), "repeats"),
])
def test_bad_profile_requests_are_one_line(pair, kwargs, message):
    with pytest.raises(InputError, match=message) as e:
        profile_cost_table(*pair, **kwargs)
    assert "\n" not in str(e.value)


def test_bad_tables_are_refused(tmp_path, profiled):
    data = profiled.as_dict()
    free_step = {"loop": [-row[0] for row in data["verify"]]}  # a one-wide step inside the loop would cost nothing
    for change in ({"format": "x"}, {"verify": [[1.0]]}, {"draft": [0.0, 1.0, 1.0]}, {"batch_sizes": [4, 1, 16]},
                   free_step, {"loop_spec": [-1e-3] * len(data["verify"])}):
        (tmp_path / "bad.json").write_text(json.dumps({**data, **change}))
        with pytest.raises(InputError) as e:
            CostTable.load(tmp_path / "bad.json")
        assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="no cost table"):
        CostTable.load(tmp_path / "missing.json")
    cheaper = {**data, "loop": [-0.5 * row[0] for row in data["verify"]]}  # the loop runs steps faster: allowed
    assert CostTable.from_dict(cheaper).round_cost(1, 0) == pytest.approx(0.5 * data["verify"][0][0])


def test_steps_and_calibration_decodes_run_over_the_cache_the_priced_decodes_allocate(pair, monkeypatch):
    """Attention runs over every slot of the static cache, so a table is timed over the cache length of the
    decodes it prices (`cache_length`): the profile's steps and the calibration's decodes all allocate exactly
    that many slots, the table records it, and a cache too small for the context and a round is one line."""
    from specdraft.decoding.compilation import StepCompiler

    seen = []
    real = StepCompiler.cache
    monkeypatch.setattr(StepCompiler, "cache", lambda self, model, batch, max_len: seen.append(max_len) or
                        real(self, model, batch, max_len))
    t = profile_cost_table(*pair, batch_sizes=[1, 2], max_width=3, compile="none", repeats=1, context=20,
                           calibrate=True, cache_length=192)
    assert t.cache_length == 192 and set(seen) == {192} and len(seen) > 4
    assert "cache 192 slots" in t.render() and CostTable.from_dict(t.as_dict()) == t
    seen.clear()
    assert profile_cost_table(*pair, batch_sizes=[1], max_width=3, repeats=1, context=20).cache_length == 64
    with pytest.raises(InputError, match="cache_length must be an integer >= context"):
        profile_cost_table(*pair, batch_sizes=[1], max_width=3, repeats=1, context=64, cache_length=68)


def test_the_calibration_decodes_share_one_compiler(pair, monkeypatch):
    """Every calibration decode gets the same StepCompiler: under a compile mode a mode string would give each call
    a compiler of its own, and each timed decode would pay its compilation again (a compiled table's start came
    out 6 s at B = 1 and its draft step 17 ms, so the batch-aware rule never drafted)."""
    import specdraft.decoding.batched as batched
    from specdraft.decoding.compilation import StepCompiler

    compilers = []
    real = batched.generate_batch
    monkeypatch.setattr(batched, "generate_batch", lambda *a, **k: compilers.append(k["compile"]) or real(*a, **k))
    profile_cost_table(*pair, batch_sizes=[1, 2], max_width=3, repeats=1, context=20, calibrate=True)
    # 2 batch sizes x 3 methods (AR, 2 fixed Ks) x 2 lengths, in a warm-up pass and 1 timed one, each after an
    # untimed short decode
    assert len(compilers) == 48 and isinstance(compilers[0], StepCompiler)
    assert all(c is compilers[0] for c in compilers)


@pytest.mark.parametrize("loop", [3e-3, -4e-3])
def test_calibration_prices_a_drafting_round_apart_from_its_draft_steps(pair, monkeypatch, loop):
    """On a virtual clock where every decode costs exactly the table's steps plus a known loop (3 ms a round), a
    drafting round's own work (5 ms) and a draft step's (0.5 ms), calibration gives back those three. With one
    fixed K (K = 4, before) the 5 ms were charged per draft: an 8-draft round priced 10 ms above a 4-draft one for
    work that costs them the same. And where the loop runs each round 4 ms faster than the table's steps time alone
    (on one H200 the decodes ran a target step in ~13 ms against 17.3 alone), the per-round term is -4 ms: clamped
    at 0 it left every prediction there 3-31% low."""
    import specdraft.decoding.batched as batched
    import specdraft.decoding.costs.profile as cp

    spec, per_draft, start = 5e-3, 0.5e-3, 20e-3
    table = CostTable(batch_sizes=(1, 2), widths=tuple(range(1, 10)), verify=(tuple(0.01 + 0.001 * w for w in range(1, 10)),
                                                                          tuple(0.02 + 0.002 * w for w in range(1, 10))),
                      draft=(0.001, 0.002), catchup=(0.0015, 0.003), device="cpu", torch_version="x", compile="none",
                      target_id="t", drafter_id="d", context=20, cache_length=128)
    clock = [0.0]
    real = batched.generate_batch

    def on_the_clock(target, prompts, n, drafter=None, **k):
        out = real(target, prompts, n, drafter=drafter, **k)
        b, m = len(prompts), out[0].metrics
        if drafter is None:
            clock[0] += start + m.n_generated * (table.t_verify(b, 1) + loop)
        else:
            clock[0] += 2 * start + sum(table.round_cost(b, d) + loop + (spec if d else 0.0) + d * per_draft
                                        for d in m.drafted)
        return out

    monkeypatch.setattr(batched, "generate_batch", on_the_clock)
    profiler_reads(clock, monkeypatch)
    assert cp.calibration_ks(8) == (2, 8) and cp.calibration_ks(2) == (1, 2) and cp.calibration_ks(1) == (1,)
    t = cp.calibrate_loop(*pair, table, repeats=1)
    for b in (1, 2):
        assert t.t_loop(b) == pytest.approx(loop) and t.t_loop_spec(b) == pytest.approx(spec)
        assert t.t_loop_draft(b) == pytest.approx(per_draft)
        # the loop and a drafting round's work in every drafting round, a draft step's in each of its drafts
        assert t.round_cost(b, 8) - t.round_cost(b, 4) == pytest.approx(
            table.round_cost(b, 8) - table.round_cost(b, 4) + 4 * per_draft)
        assert t.round_cost(b, 1) - t.round_cost(b, 0) == pytest.approx(
            table.round_cost(b, 1) - table.round_cost(b, 0) + spec + per_draft)
    assert "loop/spec" in t.render() and CostTable.from_dict(t.as_dict()) == t
