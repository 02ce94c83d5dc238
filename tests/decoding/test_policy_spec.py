"""One policy constructor: a frozen PolicySpec checked once, `build_policy` the only code that makes a
stopping policy outside the policies' own modules."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specdraft.core.errors import InputError
from specdraft.decoding.policies.batch_aware import (BatchAwareSpecDec, GlobalVerifyBudget, KPerBatchSize,
                                                     LockstepBatchAwareSpecDec, Prior)
from specdraft.decoding.policies.batch_length_ucb import LengthUCB
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.policies.stopping import FixedK, HindsightOracle, LockstepSpecDecPP, SpecDecPP
from tests.decoding.test_batch_aware import table as cost_table

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("core", "data", "decoding", "drafters", "heads", "pipelines", "routers", "training")
POLICIES = {"FixedK", "SpecDecPP", "LockstepSpecDecPP", "BatchAwareSpecDec", "LockstepBatchAwareSpecDec",
            "GlobalVerifyBudget", "KPerBatchSize", "LengthUCB", "HindsightOracle"}
# where the policies are defined, and the constructor itself
OWN = {"decoding/policies/stopping.py", "decoding/policies/batch_aware.py", "decoding/policies/batch_length_ucb.py",
       "decoding/policies/spec.py"}


def constructions(path: Path, root: Path = REPO) -> list[str]:
    """`Name(...)` calls of a policy class in one file (an import alias or an attribute call counts too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in POLICIES:
                found.append(f"{path.relative_to(root)}:{node.lineno} {name}(...)")
    return found


def test_no_product_module_constructs_a_policy_but_the_constructor():
    """The generate command, generate_text, evaluate's plan, predict's simulator, the profiler and the
    speculators all describe a policy as a PolicySpec and call `build_policy`."""
    found = [hit for package in PRODUCT for path in sorted((REPO / package).rglob("*.py"))
             if str(path.relative_to(REPO)) not in OWN for hit in constructions(path)]
    assert found == []


def test_the_check_sees_a_construction_by_name_and_by_attribute(tmp_path):
    path = tmp_path / "plan.py"
    path.write_text("import x\np = x.FixedK(4)\nq = SpecDecPP(None, 0.7, 8)\nr = build_policy(spec)\n"
                    "s = 'FixedK(4) in a string'\n")
    assert constructions(path, tmp_path) == ["plan.py:2 FixedK(...)", "plan.py:3 SpecDecPP(...)"]


def test_each_kind_builds_its_rule():
    table = cost_table(lambda b, w: 1.0 + 0.1 * w, lambda b: 0.1)
    prior = Prior((0.8,) * table.max_drafts)
    runtime = dict(table=table, prior=prior)
    assert type(build_policy(PolicySpec("fixed", k=3))) is FixedK
    per_row = build_policy(PolicySpec("specdecpp", threshold=0.6, k_max=5))
    assert type(per_row) is SpecDecPP and (per_row.threshold, per_row.max_tokens) == (0.6, 5)
    assert type(build_policy(PolicySpec("specdecpp", threshold=0.6, k_max=5, lockstep=True))) is LockstepSpecDecPP
    assert type(build_policy(PolicySpec("batch-aware", k_max=2), **runtime)) is BatchAwareSpecDec
    assert type(build_policy(PolicySpec("batch-aware", k_max=2, lockstep=True), **runtime)) is LockstepBatchAwareSpecDec
    assert build_policy(PolicySpec("global-budget", k=2), **runtime).max_tokens == 2
    assert type(build_policy(PolicySpec("global-budget", k=2), **runtime)) is GlobalVerifyBudget
    ucb = build_policy(PolicySpec("length-ucb", k=3, delta=0.5, cost_ratio=0.1))
    assert type(ucb) is LengthUCB and ucb.lengths == (0, 1, 2, 3)
    ks = build_policy(PolicySpec("k-per-batch-size", ks=((1, 4), (8, 0))))
    assert type(ks) is KPerBatchSize and (ks.k_for(1), ks.k_for(9)) == (4, 0)
    assert type(build_policy(PolicySpec("oracle"), reference=[1, 2, 3])) is HindsightOracle


@pytest.mark.parametrize("make, words", [
    (lambda: PolicySpec("fixed", k=4, threshold=0.7), "SpecDec++'s h does not apply to fixed"),
    (lambda: PolicySpec("specdecpp", k=4, threshold=0.7, k_max=8), "a fixed draft length K does not apply to specdecpp"),
    (lambda: PolicySpec("fixed", k=4, lockstep=True), "the batch stopping together does not apply to fixed"),
    (lambda: PolicySpec("batch-aware", k_max=4, threshold=0.7), "SpecDec++'s h does not apply to batch-aware"),
    (lambda: PolicySpec("specdecpp", k_max=8), "specdecpp drafting needs SpecDec++'s h"),
    (lambda: PolicySpec("specdecpp", threshold=1.0, k_max=8), "threshold h must be in (0, 1)"),
    (lambda: PolicySpec("fixed", k=0), "K"),
    (lambda: PolicySpec("greedy-ish"), "unknown stopping policy 'greedy-ish'"),
    (lambda: PolicySpec("length-ucb", k=3, delta=1.5, cost_ratio=0.1), "delta"),
    (lambda: PolicySpec("k-per-batch-size", ks=((0, 4),)), "(batch size >= 1, K >= 0) pairs"),
    (lambda: build_policy(PolicySpec("batch-aware", k_max=4)), "cost table and a prior"),
    (lambda: build_policy(PolicySpec("oracle")), "needs its reference"),
])
def test_a_combination_that_cannot_mean_one_thing_is_one_line(make, words):
    with pytest.raises(InputError) as e:
        make()
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_spec_is_frozen_and_hashable():
    spec = PolicySpec("specdecpp", threshold=0.7, k_max=8)
    with pytest.raises(AttributeError):
        spec.threshold = 0.5  # type: ignore[misc]
    assert {spec: 1}[PolicySpec("specdecpp", threshold=0.7, k_max=8)] == 1
