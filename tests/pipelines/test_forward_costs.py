"""measure_forward_costs: the drafter/target cost ratio c and the verify cost v the report prints."""
import pytest

from drafters.model import CausalLMConfig, build_causal_lm
from pipelines.forward_costs import forward_cost_lines, measure_forward_costs


def _lm(layers):
    return build_causal_lm(CausalLMConfig(layers, 16, 2, 32, 64), vocab_size=40).eval()


def test_costs_are_ratios_of_the_measured_medians():
    costs = measure_forward_costs(_lm(4), _lm(1), k=3, context=8, reps=5)
    assert costs["k"] == 3 and costs["threads"] >= 1
    assert costs["c"] == pytest.approx(costs["t_draft_ms"] / costs["t_target_ms"], rel=1e-2)
    assert costs["v"] == pytest.approx(costs["t_verify_ms"] / costs["t_target_ms"], rel=1e-2)
    for name, (lo, hi) in costs["iqr_ms"].items():
        assert 0 < lo <= hi
    text = "\n".join(forward_cost_lines(costs))
    assert f"c = t_draft / t_target = {costs['c']:.3f}" in text and "K+1 = 4 tokens" in text


def test_no_costs_no_paragraph_and_bad_arguments_refused():
    assert forward_cost_lines(None) == []
    with pytest.raises(ValueError, match="k >= 1"):
        measure_forward_costs(_lm(1), _lm(1), k=0)
