"""The evaluate stage's plan / run / aggregate pieces on tiny random models (no pipeline run needed):
the plan's shape, a new family plugged in as a planner only, repeats and raw times, the counted cost."""
import json

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.metrics import GenerationMetrics
from specdraft.decoding.speculators.prompt_lookup import PromptLookupSpeculator
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.costs.calibration import Calibration, calibrate
from specdraft.pipelines.evaluate.aggregate import Setup, summarize
from specdraft.pipelines.evaluate.methods import MethodKey, label, params
from specdraft.pipelines.evaluate.plan import PLANNERS, Built, Env, Prompt, Run, build_plan
from specdraft.pipelines.evaluate.run import Record, execute
from specdraft.pipelines.schema import EvaluateSection
from tests.decoding.conftest import noisy_copy, tiny_llama

MODES = {"greedy": SamplingConfig(temperature=0.0), "sampling": SamplingConfig(temperature=1.0)}


@pytest.fixture(scope="module")
def env():
    torch.manual_seed(0)
    target = tiny_llama(0)
    drafters = {"a": noisy_copy(target, 0.05, seed=1), "b": noisy_copy(target, 0.3, seed=2)}
    cfg = EvaluateSection(ks=[1, 3], k=3, bandits=[], stream_bandits=[], sampling_prompts=1, repeats=2)
    return Env(cfg, 0, 3, target, drafters, own={"x": "a"}, ofa="b", arms=["a", "b"], routers={},
               heads={"greedy": {}, "sampling": {}}, sampling=MODES, cost_ratio=0.37)


def prompts():
    gen = torch.Generator().manual_seed(5)
    return [Prompt("test", "x", f"x{i}", tuple(torch.randint(0, 96, (6,), generator=gen).tolist()), i)
            for i in range(2)]


def plan_lookup(env, p):
    """A family the stage never heard of: model-free prompt lookup, added as a planner and nothing else."""
    return [Run(MethodKey("lookup", k=4, params=params(ngram=2)), p,
                lambda done: Built(PromptLookupSpeculator(ngram=2, max_tokens=4)))]


def test_plan_lists_each_method_once_per_prompt_in_order(env):
    plan = build_plan(env, prompts())
    keys = [r.key for r in plan if r.prompt.id == "x0"]
    assert len(keys) == len(set(keys))
    assert keys[0] == MethodKey("ar")  # the oracle replays AR's tokens, so AR comes first
    fixed = {(k.drafter, k.k) for k in keys if k.family == "fixed" and k.mode == "greedy"}
    assert fixed == {("a", 3), ("b", 3), ("a", 1), ("b", 1)}  # per-drafter K=3 and the K sweep, K=3 once
    assert {k.drafter for k in keys if k.family == "oracle"} == {"a", "b"}
    # sampling rows only on the first test prompt per domain (sampling_prompts=1)
    assert any(k.mode == "sampling" for k in keys)
    assert not any(r.key.mode == "sampling" for r in plan if r.prompt.id == "x1")
    key = MethodKey("fixed", drafter="a", k=3)
    assert hash(key) == hash(MethodKey("fixed", drafter="a", k=3)) and key.fields()["params"] == {}
    assert MethodKey.from_fields(MethodKey("lookup", params=params(n=2, m=1)).fields()) == \
        MethodKey("lookup", params=params(m=1, n=2))


def test_new_family_runs_through_the_same_loop_and_aggregation(env):
    plan = build_plan(env, prompts(), PLANNERS + [plan_lookup])
    records = execute(plan, env.target, 10, MODES, None, "cpu", repeats=2, progress=False)
    assert [(r.prompt, r.key) for r in records] == [(r.prompt.id, r.key) for r in plan]
    assert all(len(r.times) == 2 and all(t.time > 0 for t in r.times) for r in records)
    # greedy: every method emits AR's tokens, a model-free one included
    greedy = [r for r in records if r.key.mode == "greedy"]
    assert len({(r.prompt, r.metrics.n_generated) for r in greedy}) == 2
    lookup = [r for r in records if r.key.family == "lookup"]
    assert len(lookup) == 2 and all(r.metrics.n_draft == 0 for r in lookup)  # no draft forwards
    calib = calibrate(env.target, env.drafters, 5, 16, 3, "cpu", 0)
    assert set(calib.target_s) == {1, 2, 3, 4, 5} and calib.v(0) == 1.0
    metrics = summarize(records, calib, Setup(env.cfg, 3, env.own, env.ofa, env.heads, MODES["sampling"], "cpu", 2,
                                              2, env.arms, [], 0, len(plan)))
    rows = [r for r in metrics["rows"] if r["family"] == "lookup" and r["domain"] == "all"]
    assert len(rows) == 1 and rows[0]["params"] == {"ngram": 2} and label(rows[0]) == "lookup K=4 ngram=2"
    assert rows[0]["speedup_lo"] <= rows[0]["speedup"] <= rows[0]["speedup_hi"]
    assert rows[0]["counted_speedup"] is not None
    assert len(metrics["runs"]) == len(plan)
    assert {k: v for k, v in metrics["runs"][0].items() if k in ("family", "mode")} == {"family": "ar",
                                                                                        "mode": "greedy"}


def test_every_bandit_prices_drafts_at_the_bundles_cost_ratio(env):
    """The bandits (drafter arms, model-free arms with the throughput reward) take c from the environment,
    i.e. the bundle's measured c; none falls back on a constant of its own."""
    import dataclasses

    cfg = dataclasses.replace(env.cfg, bandits=["ucb-bd", "ucbspec"], model_free_arms=["lookup"],
                              model_free_bandit="ucbspec")
    bandit_env = dataclasses.replace(env, cfg=cfg, streams={})
    plan = [r for r in build_plan(bandit_env, prompts()[:1]) if r.key.bandit is not None and r.key.family != "ceiling"]
    assert {r.key.family for r in plan} == {"bandit", "model_free"} and any(r.key.reward == "throughput" for r in plan)
    built = [r.build({}).speculator for r in plan]
    assert all(s.cost_ratio == 0.37 for s in built)
    model_free = next(s for r, s in zip(plan, built) if r.key.family == "model_free")
    drafter_arm = next(i for i, a in enumerate(model_free.arms) if getattr(a.speculator, "drafter", None) is not None)
    assert model_free.arm_cost(drafter_arm) == 0.37


def test_stream_runs_are_not_repeated(env):
    p = prompts()[0]
    calls = []

    def build(done):
        calls.append(1)
        return Built(None)

    plan = [Run(MethodKey("ar"), p, build), Run(MethodKey("ar", mode="x"), p, build, repeatable=False)]
    records = execute(plan, env.target, 4, {"greedy": MODES["greedy"], "x": MODES["greedy"]}, None, "cpu", 3,
                      progress=False)
    assert [len(r.times) for r in records] == [3, 1] and len(calls) == 4


def test_counted_cost_by_hand():
    # t(n) = 1 + 0.1 (n - 1) ms; t_draft 0.3 ms
    calib = Calibration({n: (1 + 0.1 * (n - 1)) * 1e-3 for n in range(1, 6)}, {"a": 0.3e-3}, 16, 1)
    assert calib.v(4) == pytest.approx(1.4)
    assert calib.target(7) == pytest.approx(1.6e-3)  # beyond the calibrated sizes: the last step extended
    m = GenerationMetrics(n_generated=9, n_target=3, n_draft=7, drafted=[4, 3, 0], accepted=[4, 2, 0])
    spec = Record(MethodKey("fixed", drafter="a", k=4), "p", "test", "x", m, drafter="a")
    assert calib.cost(spec) == pytest.approx((1.4 + 1.3 + 1.0 + 7 * 0.3) * 1e-3)
    ar = Record(MethodKey("ar"), "p", "test", "x", GenerationMetrics(n_generated=9, n_target=9))
    assert calib.cost(ar) == pytest.approx(9e-3)
    # a sequential cascade: 9 drafter tokens, 2 deferrals outside any speculative round (one-token forwards)
    seq = Record(MethodKey("cascade", drafter="a"), "p", "test", "x",
                 GenerationMetrics(n_generated=9, n_target=2, n_draft=9), drafter="a")
    assert calib.cost(seq) == pytest.approx((2 * 1.0 + 9 * 0.3) * 1e-3)


def test_pinned_costs_make_counted_ratios_independent_of_the_clock():
    """evaluate.counted_costs: two machines (or two load phases) calibrate different v(K), c and milliseconds;
    priced with the pinned ratios, a run's counted cost over AR's is the same number on both, the one the
    counts give by hand."""
    from specdraft.pipelines.evaluate import pinned_costs
    from specdraft.pipelines.schema import CountedCosts

    m = GenerationMetrics(n_generated=9, n_target=3, n_draft=7, drafted=[4, 3, 0], accepted=[4, 2, 0])
    spec = Record(MethodKey("fixed", drafter="a", k=4), "p", "test", "x", m, drafter="a")
    ar = Record(MethodKey("ar"), "p", "test", "x", GenerationMetrics(n_generated=9, n_target=9))
    quiet = Calibration({n: (1 + 0.1 * (n - 1)) * 1e-3 for n in range(1, 6)}, {"a": 0.3e-3}, 16, 1)
    busy = Calibration({n: (2.5 + 0.01 * (n - 1)) * 1e-3 for n in range(1, 6)}, {"a": 0.2e-3}, 16, 1)
    assert quiet.cost(spec) / quiet.cost(ar) != pytest.approx(busy.cost(spec) / busy.cost(ar), rel=0.05)
    costs = CountedCosts(cost_ratio=0.1, verify_slope=0.02)
    by_hand = ((1 + 0.02 * 4) + (1 + 0.02 * 3) + 1.0 + 7 * 0.1) / 9
    for measured in (quiet, busy):
        pinned = pinned_costs(measured, costs)
        assert pinned.cost(spec) / pinned.cost(ar) == pytest.approx(by_hand)
        assert pinned.target(1) == measured.target(1)  # the unit stays this machine's 1-token forward
        assert pinned.as_dict()["cost_ratio"] == pytest.approx(0.1) and pinned.v(4) == pytest.approx(1.08)
    with pytest.raises(InputError, match="evaluate.counted_costs"):
        EvaluateSection(counted_costs=CountedCosts(cost_ratio=0.0)).check()


def test_sequential_cascades_decode_with_their_own_loop(env):
    """token_chow / seq_chow beside the speculative rules: same key family and seeds, their own decode loop
    (no speculator), the drafter writing every token at the most lenient alpha and the target deferred to
    at alpha = 0 (a confidence below 1 always defers)."""
    import dataclasses

    from specdraft.pipelines.evaluate.plan import plan_cascades

    cfg = dataclasses.replace(env.cfg, cascades=["token_chow", "seq_chow", "opt"], cascade_alphas=[0.0, 0.99])
    wide = dataclasses.replace(env, cfg=cfg)
    runs = plan_cascades(wide, prompts()[0])
    assert sorted((dict(r.key.params)["rule"], dict(r.key.params)["alpha"]) for r in runs) == \
        sorted((rule, a) for rule in ("token_chow", "seq_chow", "opt") for a in (0.0, 0.99))
    for r in runs:
        built = r.build({})
        rule, alpha = dict(r.key.params)["rule"], dict(r.key.params)["alpha"]
        assert (built.decode is None) == (rule == "opt") and (built.speculator is None) == (rule != "opt")
        if built.decode is None:
            continue
        res = built.decode(env.target, list(r.prompt.ids), 12, MODES["sampling"], None,
                           torch.Generator().manual_seed(r.seed))
        assert res.metrics.n_generated == len(res.tokens) == 12
        assert res.metrics.n_draft >= 12  # the drafter proposes every token (or, seq_chow, a whole answer first)
        assert (res.metrics.n_target > 0) == (alpha == 0.0), (rule, alpha)


def test_cascades_sweep_alphas_on_further_prompts_and_score_quality(env):
    """cascade_alphas: one run per rule x alpha, with one seed per rule (common random numbers across
    alphas); further_prompts widens SpecTr / cascades beyond the sampling prompts; sampling runs on a scored
    domain get data/quality.py's primary metric against the reference, pooled in the rows."""
    import dataclasses

    from specdraft.pipelines.evaluate.aggregate import score_quality
    from specdraft.pipelines.evaluate.plan import plan_cascades, plan_spectr

    cfg = dataclasses.replace(env.cfg, cascades=["opt", "token_v3"], cascade_alphas=[0.0, 0.5, 1.0],
                              spectr_drafts=[1, 2], further_prompts=2)
    wide = dataclasses.replace(env, cfg=cfg)
    ps = prompts()
    runs = [r for p in ps for r in plan_cascades(wide, p)]
    assert len(runs) == 2 * 2 * 3
    assert {(dict(r.key.params)["rule"], dict(r.key.params)["alpha"]) for r in runs if r.prompt.id == "x0"} == \
        {(rule, a) for rule in ("opt", "token_v3") for a in (0.0, 0.5, 1.0)}
    assert len({r.seed for r in runs if r.prompt.id == "x0" and dict(r.key.params)["rule"] == "opt"}) == 1
    assert len([r for p in ps for r in plan_spectr(wide, p)]) == 2 * 2
    assert [r for p in ps for r in plan_cascades(env, p) if p.index >= 1] == []  # default: sampling_prompts = 1

    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "Answer: 7" if ids and ids[0] == 1 else "Answer: 3"

    def rec(first, prompt, mode="sampling"):
        return Record(MethodKey("ar", mode=mode), prompt, "test", "math", GenerationMetrics(), tokens=[first])

    records = [rec(1, "m0"), rec(2, "m1"), rec(1, "m0", "greedy")]
    # ("ood", "m1") shares the test prompt's id: references are keyed by set as well
    references = {("test", "m0"): "so Answer: 7", ("test", "m1"): "Answer: 7", ("ood", "m1"): "Answer: 3"}
    score_quality(records, references, Tok())
    assert [r.quality for r in records] == [100.0, 0.0, None]


def test_calibration_times_each_drafter_as_a_round_right_after_a_target_forward(env, monkeypatch):
    """Decoding alternates one verification forward with a run of K drafting forwards; the calibration
    prices a drafted token the same way (a lone forward after the target's would price every drafted token
    as the cold first one of a round)."""
    import specdraft.decoding.costs.calibration as evaluate

    calls, forward = [], evaluate.kv.forward
    names = {id(env.target): "target", **{id(m): n for n, m in env.drafters.items()}}

    def recording(model, cache, ids, *args, **kwargs):
        calls.append((names[id(model)], len(ids)))
        return forward(model, cache, ids, *args, **kwargs)

    cal = evaluate.Calibrator(env.target, env.drafters, 3, 8, "cpu", 0, draft_run=4)
    monkeypatch.setattr(evaluate.kv, "forward", recording)
    cal.sample(1)
    assert calls == [("target", 1), ("a", 1), ("a", 1), ("a", 1), ("a", 1),
                     ("target", 2), ("b", 1), ("b", 1), ("b", 1), ("b", 1), ("target", 3)]
    assert set(cal.result().drafter_s) == {"a", "b"}


def test_units_keep_a_stream_on_one_shard_and_records_survive_the_disk(env, tmp_path):
    """A prompt is a unit of its own unless a stream bandit keeps state across its (set, domain): then
    the whole (set, domain) is one unit. A record read back from its unit file equals the one written,
    and the merge puts records back in plan order whatever order the units ran in."""
    import dataclasses

    from specdraft.pipelines.evaluate.units import missing, read_back, run_units, share, units

    plain = build_plan(env, prompts())
    assert [u.name for u in units(plain)] == ["prompt test/x0", "prompt test/x1"]
    streamed = dataclasses.replace(env, cfg=dataclasses.replace(env.cfg, stream_bandits=["ucb-bd"]), streams={})
    plan = build_plan(streamed, prompts())
    (unit,) = units(plan)
    assert unit.name == "stream test/x" and list(unit.runs) == plan
    assert [u.index for u in share(units(plain), 1, 2)] == [1] and share(units(plain), 0, 3)[0].index == 0

    ran = []
    ordered = [r for r in plain if r.key.family in ("ar", "fixed")]

    def execute_runs(runs):
        ran.append(runs[0].prompt.id)
        return execute(runs, env.target, 4, MODES, None, "cpu", 1, progress=False)

    pieces = units(ordered)
    run_units(list(reversed(pieces)), tmp_path, execute_runs, lambda: {"target": {}, "drafters": {}, "passes": 0})
    assert ran == ["x1", "x0"] and missing(pieces, tmp_path) == []
    records, samples = read_back(ordered, pieces, tmp_path)
    assert [(r.prompt, r.key) for r in records] == [(r.prompt.id, r.key) for r in ordered] and len(samples) == 2
    again = execute(ordered, env.target, 4, MODES, None, "cpu", 1, progress=False)
    assert [(r.metrics.n_generated, r.metrics.n_target, r.tokens) for r in records] == \
        [(r.metrics.n_generated, r.metrics.n_target, r.tokens) for r in again]
    assert all(Record.from_json(json.loads(json.dumps(r.as_json()))) == r for r in again)


# --- timing a GPU can trust: built outside the timed call, warm-up, repeats until narrow ----------------

def _burn(seconds: float) -> None:
    """Spend this much CPU time (the CPU timer's unit of account)."""
    import time

    t0 = time.process_time()
    while time.process_time() - t0 < seconds:
        pass


def test_speculators_are_built_outside_the_timed_call_unless_building_is_serving(env):
    from specdraft.pipelines.evaluate.run import TimingPolicy

    p = prompts()[0]

    def slow_build(done):
        _burn(0.3)
        return Built(None)

    plan = [Run(MethodKey("ar"), p, slow_build), Run(MethodKey("router", router="x"), p, slow_build, timed_build=True)]
    records = execute(plan, env.target, 2, MODES, None, "cpu", 1, progress=False, policy=TimingPolicy(1))
    built_first, routed = records
    assert built_first.times[0].time < 0.2 <= 0.3 <= routed.times[0].time  # routing is the method's own cost


def test_one_warmup_per_method_and_prompt_length_class(env):
    from specdraft.pipelines.evaluate.run import TimingPolicy, shape

    calls = []
    short = prompts()  # two 6-token prompts: one length class
    longer = Prompt("test", "x", "long", tuple(range(1, 20)), 2)

    def build(done):
        calls.append(1)
        return Built(None)

    plan = [Run(MethodKey("ar"), q, build) for q in [*short, longer]]
    warmed: set = set()
    execute(plan, env.target, 2, MODES, None, "cpu", 2, progress=False,
            policy=TimingPolicy(2, warmup=True), warmed=warmed)
    assert len(calls) == 3 * 2 + 2  # two timed passes per prompt, a warm-up per length class (8 and 32)
    assert warmed == {shape(plan[0]), shape(plan[2])} and shape(plan[0]) == shape(plan[1])
    execute(plan[:1], env.target, 2, MODES, None, "cpu", 2, progress=False, policy=TimingPolicy(2, warmup=True),
            warmed=warmed)
    assert len(calls) == 8 + 2  # a shape warmed in an earlier call (an earlier unit) is not warmed again


def test_repeats_go_on_until_the_interval_is_narrow_or_the_cap(env, monkeypatch):
    import specdraft.pipelines.evaluate.run as run_mod
    from specdraft.decoding.timing import Timing
    from specdraft.pipelines.evaluate.run import TimingPolicy, relative_half_width

    p = prompts()[0]
    noisy = iter([1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0])  # never within +-5%
    steady = iter([1.0, 1.001, 1.0, 1.0, 1.0])

    def fake_timed_call(fn, device):
        out = fn()
        t = next(noisy if out[0].drafter == "noisy" else steady)
        return out, Timing(time=t, wall=t, cpu=t)

    monkeypatch.setattr(run_mod, "timed_call", fake_timed_call)
    plan = [Run(MethodKey("ar"), p, lambda done: Built(None, drafter="steady")),
            Run(MethodKey("ar", mode="sampling"), p, lambda done: Built(None, drafter="noisy"), seed=1)]
    records = execute(plan, env.target, 2, MODES, None, "cpu", 2, progress=False,
                      policy=TimingPolicy(2, repeats_max=5, repeat_ci=0.05))
    steady_rec, noisy_rec = records
    assert len(steady_rec.times) == 2 and relative_half_width([t.time for t in steady_rec.times]) <= 0.05
    assert len(noisy_rec.times) == 5  # the cap
    assert relative_half_width([1.0]) == float("inf")


def test_timed_and_counted_disagreement_is_said_next_to_the_numbers():
    from specdraft.pipelines.evaluate.aggregate import intervals_disagree
    from specdraft.pipelines.evaluate.render import timing_lines

    row = {"speedup": 0.6, "speedup_lo": 0.5, "speedup_hi": 0.7,
           "counted_speedup": 1.5, "counted_speedup_lo": 1.3, "counted_speedup_hi": 1.7}
    assert intervals_disagree(row, "speedup", "counted_speedup")
    assert not intervals_disagree({**row, "speedup_hi": 1.4}, "speedup", "counted_speedup")
    assert not intervals_disagree({**row, "speedup_lo": None}, "speedup", "counted_speedup")
    metrics = {"rows": [{**row, "timed_counted_disagree": True}],
               "timing": {"timer": "cuda events", "warmup": True, "repeats": 2, "repeats_max": 6, "repeat_ci": 0.05,
                          "runs": 10, "passes_mean": 3.2, "passes_max": 6, "narrow_share": 0.8}}
    text = " ".join(timing_lines(metrics))
    assert "cuda events" in text and "up to 6" in text and "+-5%" in text and "1 rows' timed and counted" in text


def test_chain_rows_decode_in_the_loop_specdraft_generate_runs(env, monkeypatch):
    """One product decode loop for chains: evaluate's per-prompt AR, fixed-K and SpecDec++ rows call
    `generate_batch` (a batch of one), the function `specdraft generate` decodes with; the rows that need the
    one-prompt loop (the oracle) do not."""
    import specdraft.decoding.batched as batched
    import specdraft.decoding.generate as generate
    import specdraft.pipelines.evaluate.run as run_module
    from specdraft.pipelines.evaluate.plan import Head
    from tests.decoding.test_greedy_equivalence import random_head

    assert run_module.generate_batch is batched.generate_batch is generate.generate_batch
    calls = []

    def spy(target, prompts, *args, **kwargs):
        calls.append((len(prompts), type(kwargs.get("policy")).__name__))
        return batched.generate_batch(target, prompts, *args, **kwargs)

    monkeypatch.setattr(run_module, "generate_batch", spy)
    head = Head(random_head(env.drafters["a"].config.hidden_size, 0), 0.5, 6, "h")
    with_head = Env(**{**vars(env), "heads": {"greedy": {"a": head}, "sampling": {}}})
    plan = [r for r in build_plan(with_head, prompts()[:1]) if r.key.mode == "greedy"]
    records = execute(plan, env.target, 10, MODES, None, "cpu", repeats=1, progress=False)
    by_family = {}
    for r in records:
        by_family.setdefault(r.key.family, []).append(r)
    assert {"ar", "fixed", "specdecpp", "oracle"} <= set(by_family)
    chain_rows = len(by_family["ar"]) + len(by_family["fixed"]) + len(by_family["specdecpp"])
    assert len(calls) == chain_rows and all(b == 1 for b, _ in calls)
    assert {name for _, name in calls} == {"NoneType", "FixedK", "SpecDecPP"}
    tokens = {tuple(r.tokens) for r in records}
    assert len(tokens) == 1  # greedy: every row, product loop or one-prompt loop, emits AR's tokens


def test_each_drafter_also_runs_at_the_fixed_k_generate_serves_it_with(env):
    """Besides the common K and the sweep, a drafter's fixed-K row at its served K (`Bundle.fixed_k`)."""
    served = Env(**{**vars(env), "served_k": {"a": 5, "b": 3}})
    keys = {(r.key.drafter, r.key.k) for r in build_plan(served, prompts()[:1])
            if r.key.family == "fixed" and r.key.mode == "greedy"}
    assert keys == {("a", 3), ("b", 3), ("a", 1), ("b", 1), ("a", 5)}  # b's served K is the common K: once


def test_the_timing_line_says_one_pass_gives_a_run_no_interval_of_its_own():
    """The demo times each run once: the report must not count runs 'narrow' from a single time."""
    from specdraft.pipelines.evaluate.render import timing_lines

    base = {"timer": "process CPU time", "warmup": True, "repeat_ci": 0.05, "passes_mean": 2.0, "narrow_share": 0.4,
            "runs": 10}
    one = timing_lines({"timing": {**base, "repeats": 1, "repeats_max": 1}, "rows": []})[0]
    assert "One timed pass per run" in one and "90% interval of their mean" not in one
    two = timing_lines({"timing": {**base, "repeats": 2, "repeats_max": 2}, "rows": []})[0]
    assert "2 interleaved passes per run (no further passes" in two and "of 10 runs have a 90% interval" in two
    capped = timing_lines({"timing": {**base, "repeats": 2, "repeats_max": 4}, "rows": []})[0]
    assert "more (up to 4)" in capped and "2.0 passes on average" in capped
