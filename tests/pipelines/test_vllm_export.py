"""What export checks and writes for vLLM's eagle3 method, without vLLM: a target or drafter vLLM could not
serve stops with one line naming it; the config is speculators' with every field vLLM reads written out."""
import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.speculators.eagle_model import new_eagle_drafter
from specdraft.pipelines.vllm_export import check_servable, speculators_config, vllm_weights
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
