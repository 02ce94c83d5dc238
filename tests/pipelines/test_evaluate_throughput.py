"""Throughput rows (evaluate.batch_sizes): the config's errors, the batches the plan cuts, and batch runs whose
counts are those of the batched decoder called directly, aggregated per batch size and rendered."""
import dataclasses

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.batched import generate_batch
from specdraft.decoding.policies.batch_length_ucb import LengthUCB
from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.costs.calibration import calibrate
from specdraft.pipelines.evaluate.aggregate import Setup, summarize
from specdraft.pipelines.evaluate.claims import judge, throughput_verdict as claims_throughput
from specdraft.pipelines.evaluate.plan import BATCH_SET, Env, Head, Prompt, batches, build_plan
from specdraft.pipelines.evaluate.render import render
from specdraft.pipelines.evaluate.tables import throughput_section
from specdraft.pipelines.evaluate.run import execute
from specdraft.pipelines.schema import EvaluateSection
from tests.decoding.conftest import noisy_copy, tiny_llama
from tests.decoding.test_greedy_equivalence import random_head

MODES = {"greedy": SamplingConfig(temperature=0.0), "sampling": SamplingConfig(temperature=1.0)}
MAX_NEW = 10


@pytest.mark.parametrize("value, match", [
    ([0], "evaluate.batch_sizes: a batch size must be an integer >= 1"),
    ([True], "evaluate.batch_sizes: a batch size must be an integer >= 1, got True"),
    ([2, 4, 2], "evaluate.batch_sizes lists a batch size twice"),
])
def test_bad_batch_sizes_are_one_line_errors(value, match):
    with pytest.raises(InputError, match=match) as e:
        EvaluateSection(batch_sizes=value).check()
    assert "\n" not in str(e.value)


def test_batch_sizes_need_the_test_set_and_a_positive_prompt_count():
    with pytest.raises(InputError, match="add test to evaluate.sets"):
        EvaluateSection(batch_sizes=[1], sets=["ood"]).check()
    with pytest.raises(InputError, match="evaluate.throughput_prompts must be an integer >= 1"):
        EvaluateSection(batch_sizes=[1], throughput_prompts=0).check()
    EvaluateSection().check()  # the default: no throughput rows
    assert EvaluateSection().batch_sizes == []


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    target = tiny_llama(0)
    drafters = {"a": noisy_copy(target, 0.05, seed=1), "all": noisy_copy(target, 0.2, seed=2)}
    head = Head(random_head(drafters["all"].config.hidden_size, 0), 0.5, 6, "greedy/h")
    return target, drafters, head


def _env(models, **cfg) -> Env:
    target, drafters, head = models
    ecfg = EvaluateSection(ks=[1, 3], k=3, bandits=[], stream_bandits=[], sampling_prompts=0, repeats=2, **cfg)
    return Env(ecfg, 7, 3, target, drafters, own={"x": "a"}, ofa="all", arms=["a"], routers={},
               heads={"greedy": {"all": head}, "sampling": {}}, sampling=MODES, cost_ratio=0.2)


def _prompts(n_per_domain: int = 3) -> list[Prompt]:
    gen = torch.Generator().manual_seed(5)
    out = []
    for d in ("x", "y"):
        for i in range(n_per_domain):
            length = int(torch.randint(3, 12, (1,), generator=gen))
            out.append(Prompt("test", d, f"{d}{i}", tuple(torch.randint(0, 96, (length,), generator=gen).tolist()), i))
    return out + [Prompt("ood", "z", "z0", (1, 2, 3), 0)]  # not a test prompt: never batched


def test_batches_are_the_same_pooled_test_prompts_at_every_size(models):
    by = batches(_env(models, batch_sizes=[1, 2, 4]), _prompts())
    pools = {b: [p.id for batch in group for p in batch.batch] for b, group in by.items()}
    # 6 test prompts, cut to a multiple of lcm(1, 2, 4) = 4, taken round-robin over the domains
    assert pools[1] == pools[2] == pools[4] == ["x0", "y0", "x1", "y1"]
    assert [len(g) for g in by.values()] == [4, 2, 1] and all(len(b.batch) == 2 for b in by[2])
    assert all(b.set == BATCH_SET and b.ids == () for g in by.values() for b in g)
    assert [p.id for b in batches(_env(models, batch_sizes=[2], throughput_prompts=3), _prompts())[2]
            for p in b.batch] == ["x0", "y0"]
    with pytest.raises(InputError, match=r"take a multiple of 8 prompts .* 6 pooled test prompts"):
        batches(_env(models, batch_sizes=[8]), _prompts())


def test_batch_runs_count_as_the_batched_decoder_and_render(models):
    target, drafters, head = models
    env = _env(models, batch_sizes=[1, 2])
    plan = [r for r in build_plan(env, _prompts(2)) if r.prompt.set == BATCH_SET]
    records = execute(plan, target, MAX_NEW, MODES, None, "cpu", repeats=2, progress=False)
    # (B=1: 4 batches, B=2: 2) x (AR, K=1, K=3, SpecDec++ per row and lockstep, UCBSpec)
    assert len(records) == len(plan) == (4 + 2) * 6
    prompts = {p.id: p for p in _prompts(2)}
    policies = {"ar": lambda k: None, "fixed": lambda k: FixedK(k),
                "specdecpp": lambda k: SpecDecPP(head.module, head.threshold, head.k_max),
                "specdecpp-lockstep": lambda k: LockstepSpecDecPP(head.module, head.threshold, head.k_max),
                "ucbspec": lambda k: LengthUCB(tuple(range(k + 1)), delta=env.cfg.delta, cost_ratio=env.cost_ratio)}
    for rec in records:
        assert len(rec.times) == 2 and rec.tokens is None
        direct = generate_batch(target, [list(prompts[p].ids) for p in rec.row_prompts], MAX_NEW,
                                drafter=None if rec.key.policy == "ar" else drafters["all"],
                                policy=policies[rec.key.policy](rec.key.k), seed=rec.seed)
        strip = lambda m: {k: v for k, v in dataclasses.asdict(m).items() if not k.startswith("time")}  # noqa: E731
        assert [strip(m) for m in rec.rows] == [strip(d.metrics) for d in direct], rec.key
        assert rec.metrics.n_generated == sum(d.metrics.n_generated for d in direct)
    calib = calibrate(target, drafters, 4, 16, 2, "cpu", 0)
    metrics = summarize(records, calib, Setup(env.cfg, 3, env.own, env.ofa, env.heads, MODES["sampling"], "cpu",
                                              4, 2, env.arms, [], 0, len(plan)))
    assert metrics["rows"] == [] and metrics["runs"] == []  # batch runs make throughput rows only
    t = metrics["throughput"]
    assert t["batch_sizes"] == [1, 2] and t["prompt_ids"] == ["x0", "y0", "x1", "y1"]
    rows = {(r["batch_size"], r["policy"], r["k"]): r for r in t["rows"]}
    assert len(rows) == 12
    for (b, policy, k), r in rows.items():
        runs = [x for x in records if x.key.policy == policy and x.key.k == k and dict(x.key.params)["batch"] == b]
        assert r["batches"] == len(runs) == 4 // b and r["prompts"] == 4
        assert r["N"] == sum(x.metrics.n_generated for x in runs)  # greedy: every method emits AR's tokens
        assert r["N"] == rows[(b, "ar", None)]["N"]
        assert r["MAT"] == pytest.approx(r["N"] / r["N_target"], abs=1e-3)
        assert r["tokens_per_s"] == pytest.approx(r["N"] / sum(x.time for x in runs), rel=1e-3)
        assert r["speedup_lo"] <= r["speedup"] <= r["speedup_hi"]
    assert all(r["speedup"] == 1.0 for r in t["rows"] if r["policy"] == "ar")
    metrics.update(judge(metrics))
    v = metrics["verdicts"]["throughput"]
    assert {m["key"]["policy"] for m in v["methods"]} == {"fixed", "specdecpp", "specdecpp-lockstep", "ucbspec"}
    for m in v["methods"]:
        paying = [c["batch_size"] for c in m["by_b"] if c["verdict"] == "above"]
        assert m["pays_up_to"] == (max(paying) if paying else None)
    text = render(metrics)
    assert "## Throughput by batch size" in text and "all UCBSpec lengths 0..3" in text
    assert "The same 4 test prompts" in text and "adaptive length hold up" in text


def _row(b, policy, k, speedup, lo, hi, batches=3):
    return {"family": "batched", "policy": policy, "drafter": None if policy == "ar" else "ofa", "k": k,
            "params": {"batch": b}, "batch_size": b, "batches": batches, "prompts": b * batches, "N": 30 * b,
            "MAT": 1.0, "tokens_per_s": 100.0, "speedup": speedup, "speedup_lo": lo, "speedup_hi": hi,
            "wall_speedup": speedup, "wall_speedup_lo": lo, "wall_speedup_hi": hi}


def _batch_runs(b, policy, k, seconds):
    return [{"family": "batched", "policy": policy, "drafter": "ofa", "k": k, "params": {"batch": b},
             "batch": f"B={b} #{i}", "N": 10 * b, "time_s": s} for i, s in enumerate(seconds)]


def test_where_fixed_k_stops_paying_and_whether_specdecpp_holds_up():
    """Fixed K pays at B=1 and falls below 1 at B=4; SpecDec++ still pays there and beats the best fixed K on
    the same batches; UCBSpec is within noise of 1 at B=4; K=2 never pays."""
    rows = [_row(1, "ar", None, 1.0, 1.0, 1.0), _row(4, "ar", None, 1.0, 1.0, 1.0),
            _row(1, "fixed", 4, 1.5, 1.3, 1.7), _row(4, "fixed", 4, 0.9, 0.8, 0.95),
            _row(1, "fixed", 2, 1.1, 0.9, 1.2), _row(4, "fixed", 2, 0.7, 0.6, 0.8),
            _row(1, "specdecpp", None, 1.6, 1.4, 1.8), _row(4, "specdecpp", None, 1.2, 1.1, 1.3),
            _row(1, "ucbspec", 4, 1.2, 1.05, 1.3), _row(4, "ucbspec", 4, 1.0, 0.9, 1.1)]
    runs = (_batch_runs(4, "fixed", 4, [1.0, 1.1, 0.9]) + _batch_runs(4, "fixed", 2, [1.3, 1.2, 1.4])
            + _batch_runs(4, "specdecpp", None, [0.8, 0.9, 0.7]) + _batch_runs(4, "ucbspec", 4, [1.2, 1.1, 1.3]))
    metrics = {"throughput": {"batch_sizes": [1, 4], "prompt_ids": list("abcdefghijkl"), "passes_mean": 2.0,
                              "rows": rows, "runs": runs}}
    v = claims_throughput(metrics)
    pays = {(m["key"]["policy"], m["key"]["k"]): m["pays_up_to"] for m in v["methods"]}
    assert pays == {("fixed", 4): 1, ("fixed", 2): None, ("specdecpp", None): 4, ("ucbspec", 4): 1}
    assert v["fixed_falls_at"] == [4] and v["fixed_paid"]
    at = {a["key"]["policy"]: a for a in v["adaptive_where_fixed_falls"]}
    assert at["specdecpp"]["verdict"] == "above" and at["ucbspec"]["verdict"] == "within noise"
    assert at["specdecpp"]["best_fixed_k"] == 4  # the fixed K with the highest speedup at B=4
    # the best fixed K's batch time per token over SpecDec++'s on the same batches: 3.0 / 2.4
    assert at["specdecpp"]["vs_best_fixed"]["ratio"] == pytest.approx(1.25)
    assert at["specdecpp"]["vs_best_fixed"]["verdict"] == "above"
    assert at["ucbspec"]["vs_best_fixed"]["verdict"] in ("below", "within noise")
    text = "\n".join(throughput_section({**metrics, "verdicts": {"throughput": v}}))
    assert "ofa SpecDec++** pays (speedup interval above 1) up to B=4" in text
    assert "ofa K=2** pays (speedup interval above 1) at no batch size" in text
    assert "No fixed K pays at B=4 though one did at a smaller B" in text
    assert "The same 12 test prompts" in text
    # with a fixed K that pays at every batch size, there is nothing to hold up against
    paying = [dict(r, speedup=1.1, speedup_lo=1.05, speedup_hi=1.2) if r["policy"] == "fixed" and r["k"] == 4
              else r for r in rows]
    v = claims_throughput({"throughput": {**metrics["throughput"], "rows": paying}})
    assert v["fixed_falls_at"] == [] and v["adaptive_where_fixed_falls"] == []


def test_batch_aware_rows_decode_in_the_product_loop_and_the_report_sets_predicted_beside_measured(models):
    """With a cost table and the head's prior, the throughput rows add the lockstep batch-aware rule and the
    global verify budget (each equal to generate_batch called directly), and the report puts `specdraft
    predict`'s numbers for the same batch sizes beside the measured tokens/s."""
    from specdraft.decoding.policies.batch_aware import GlobalVerifyBudget, LockstepBatchAwareSpecDec
    from specdraft.decoding.costs.throughput import predict_throughput, summarize_acceptance, summary_prior
    from specdraft.pipelines.evaluate.aggregate import beside_measured
    from tests.decoding.test_batch_decode import cost_table

    target, drafters, head = models
    env = _env(models, batch_sizes=[1, 2])
    env.cost_table, env.prior = cost_table(), 0.7
    plan = [r for r in build_plan(env, _prompts(2)) if r.prompt.set == BATCH_SET]
    assert len(plan) == (4 + 2) * 8
    records = execute(plan, target, MAX_NEW, MODES, None, "cpu", repeats=1, progress=False)
    prompts = {p.id: p for p in _prompts(2)}
    rules = {"batch-aware-lockstep": lambda: LockstepBatchAwareSpecDec(head.module, env.cost_table, 0.7, head.k_max),
             "global-budget": lambda: GlobalVerifyBudget(head.module, env.cost_table, 0.7, env.k)}
    for rec in (r for r in records if r.key.policy in rules):
        direct = generate_batch(target, [list(prompts[p].ids) for p in rec.row_prompts], MAX_NEW,
                                drafter=drafters["all"], policy=rules[rec.key.policy](), seed=rec.seed)
        assert [m.drafted for m in rec.rows] == [d.metrics.drafted for d in direct], rec.key
    calib = calibrate(target, drafters, 4, 16, 2, "cpu", 0)
    metrics = summarize(records, calib, Setup(env.cfg, 3, env.own, env.ofa, env.heads, MODES["sampling"], "cpu",
                                              4, 2, env.arms, [], 0, len(plan)))
    gen = torch.Generator().manual_seed(0)
    accept = [torch.rand(20, generator=gen) for _ in range(4)]
    summary = summarize_acceptance(accept, [a.clamp(0.05, 0.95) for a in accept], head="h", threshold=0.5, k_max=6,
                                   label_transform={"temperature": 0.0, "top_k": 0, "top_p": 1.0})
    metrics["throughput"]["predicted"] = beside_measured(predict_throughput(
        summary, env.cost_table, [1, 2], summary_prior(summary, 1.0), k_max=6, rounds=5, new_tokens=MAX_NEW,
        budget_k=env.k), metrics["throughput"])
    metrics["throughput"]["cost_table"] = env.cost_table.as_dict()
    metrics.update(judge(metrics))
    text = render(metrics)
    assert "all batch-aware SpecDec++ (lockstep)" in text and "all global verify budget K=3" in text
    assert "Predicted before decoding" in text
    predicted = text[text.index("Predicted before decoding"):]
    measured_ar = next(r["tokens_per_s"] for r in metrics["throughput"]["rows"] if r["policy"] == "ar"
                       and r["batch_size"] == 1)
    from specdraft.pipelines.evaluate.cells import fmt
    ar_line = predicted.split("| 1 | AR |")[1].split("\n")[0]  # the measured tokens/s sits beside the predicted
    assert fmt(measured_ar) in ar_line
    budget = next(r for r in metrics["throughput"]["predicted"]["predictions"]
                  if r["method"] == f"global budget K={env.k}" and r["batch"] == 1)
    assert budget["measured_tokens_per_s"] is not None  # the measured budget rows are matched to the prediction
