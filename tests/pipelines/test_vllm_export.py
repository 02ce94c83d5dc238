"""What export checks and writes for vLLM, without vLLM: a target or drafter vLLM could not serve stops with
one line naming it; the eagle3 config is speculators' with every field vLLM reads written out; a K per batch
size becomes vLLM's batch-size schedule, which serves every batch size at the K specdraft's decoder would."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.core.errors import InputError
from specdraft.decoding.policies.batch_aware import KPerBatchSize
from specdraft.decoding.speculators.eagle_model import new_eagle_drafter
from specdraft.pipelines.vllm_export import (check_schedule, check_servable, schedule_ranges, schedule_tokens,
                                             speculators_config, vllm_weights)
from tests.decoding.eagle_fixtures import tiny_target

TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "hidden_size": 32, "vocab_size": 96}
META = {"variant": "eagle3", "feature_layers": [0, 2, 3], "hidden_size": 32, "vocab_size": 96}


def test_a_servable_pair_passes():
    check_servable("eagle-ofa", META, TARGET)
    check_servable("eagle-ofa", META, {**TARGET, "architectures": ["Qwen2ForCausalLM"]})


@pytest.mark.parametrize("meta, target, message", [
    (META, {**TARGET, "architectures": ["GPT2LMHeadModel"]}, "serves EAGLE-3 beside"),
    (META, {**TARGET, "architectures": None}, "of no declared architecture"),
    ({**META, "feature_layers": [0, 2, 4]}, TARGET, "3 increasing ids below the target's 4 layers"),
    ({**META, "feature_layers": [2, 2, 3]}, TARGET, "3 increasing ids"),
    ({**META, "feature_layers": [3, 2, 0]}, TARGET, "3 increasing ids"),
    ({**META, "hidden_size": 64}, TARGET, "64 wide over 96 tokens, the target 32 over 96"),
    ({**META, "vocab_size": 100}, TARGET, "rerun train-drafters for this target"),
])
def test_what_vllm_cannot_serve_stops_in_one_line(meta, target, message):
    with pytest.raises(InputError, match=message) as err:
        check_servable("eagle-ofa", meta, target)
    assert "eagle-ofa" in str(err.value) and "\n" not in str(err.value)


def test_config_and_weight_names_are_vllms():
    target = tiny_target("llama", 0, layers=4)
    drafter = new_eagle_drafter(target.config, variant="eagle3", draft_ids=list(range(40)), n_layers=2)
    cfg = speculators_config(drafter, 5, "/models/target")
    assert cfg["norm_before_residual"] is False and "norm_before_residual" in cfg  # vLLM assumes true when absent
    assert (cfg["draft_vocab_size"], cfg["target_hidden_size"], cfg["eagle_aux_hidden_state_layer_ids"]) == (40, 32, [0, 2, 3])
    layer = cfg["transformer_layer_config"]
    assert (layer["model_type"], layer["vocab_size"], layer["num_hidden_layers"], layer["tie_word_embeddings"]) == (
        "llama", 96, 2, False)
    spec = cfg["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["proposal_methods"][0]["speculative_tokens"] == 5
    assert spec["verifier"]["name_or_path"] == "/models/target"
    w = vllm_weights(drafter)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "layers.0.hidden_norm.weight",
            "layers.1.input_layernorm.weight"} <= set(w)
    assert w["d2t"].dtype == torch.int64 and w["lm_head.weight"].shape == (40, 32)
    assert "layers.1.hidden_norm.weight" not in w  # only the first layer reads [embedding ; hidden]
    assert "d2t" not in vllm_weights(new_eagle_drafter(target.config, variant="eagle3"))  # full vocabulary: none


def vllm_k(ranges, batch: int, num_tokens: int) -> int:
    """The K vLLM runs a batch of `batch` rows at under a schedule (vllm/v1/spec_decode/dynamic/utils.py,
    build_dynamic_sd_schedule_lookup, read for this test): the range holding it, else (a gap, or past the
    last range up to max_num_seqs) the K of the last range before it, clamped to num_speculative_tokens."""
    k = None
    for start, end, range_k in sorted(ranges):
        if start <= batch:
            k = range_k
    return min(num_tokens, k)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(1, 300), st.integers(0, 12), min_size=1, max_size=12))
def test_ranges_cover_the_profiled_sizes_and_serve_the_decoders_k(ks):
    """From 1 to the largest profiled size without gaps, a profiled size's K until just before the next one,
    no two neighbours with one K; vLLM's rules hold at num_speculative_tokens = the largest K; and at every
    batch size, past the profile too, vLLM runs the K specdraft's KPerBatchSize runs (the profiled sizes' own
    K at each of them)."""
    ranges = schedule_ranges(ks)
    n = schedule_tokens(ranges)
    check_schedule(ranges, n)
    assert n == max(1, max(ks.values()))
    assert ranges[0][0] == 1 and ranges[-1][1] == max(ks)
    assert all(b[0] == a[1] + 1 and a[2] != b[2] for a, b in zip(ranges, ranges[1:]))
    for b, k in ks.items():
        assert [r[2] for r in ranges if r[0] <= b <= r[1]] == [k]
    policy = KPerBatchSize(dict(ks))
    for b in range(1, max(ks) + 20):
        assert vllm_k(ranges, b, n) == policy.k_for(b)


def test_ranges_by_hand():
    assert schedule_ranges({1: 4, 2: 2, 4: 2, 8: 1, 16: 1, 32: 0, 64: 0}) == [[1, 1, 4], [2, 7, 2], [8, 31, 1], [32, 64, 0]]
    assert schedule_ranges({4: 3, 8: 3}) == [[1, 8, 3]]  # below the smallest profiled size: its K
    assert schedule_ranges({1: 0, 64: 0}) == [[1, 64, 0]] and schedule_tokens([[1, 64, 0]]) == 1  # vLLM needs > 0


@pytest.mark.parametrize("ranges, n", [
    ([], 2),
    ([[2, 4, 1]], 2),  # not from 1
    ([[1, 4, 1], [4, 8, 1]], 2),  # overlapping
    ([[1, 4, 1], [9, 16, 2], [5, 8, 1]], 2),  # unsorted
    ([[1, 4, 3]], 2),  # K above num_speculative_tokens
    ([[1, 4, -1]], 2),
    ([[1, 0, 1]], 2),  # end before start
    ([[1, 4]], 2),
    ([[1, 4, 1.5]], 2),
    ([[1, 4, 0]], 0),  # vLLM needs num_speculative_tokens > 0
])
def test_a_schedule_vllm_would_refuse_is_one_line(ranges, n):
    with pytest.raises(InputError, match="is not vLLM's") as err:
        check_schedule(ranges, n)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("ks", [{}, {0: 1}, {1: -1}, {1: True}, {"1": 2}])
def test_a_bad_k_per_batch_size_is_one_line(ks):
    with pytest.raises(InputError, match="K per batch size") as err:
        schedule_ranges(ks)
    assert "\n" not in str(err.value)
