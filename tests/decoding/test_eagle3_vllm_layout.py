"""vLLM's Llama EAGLE-3 drafter (variant eagle3): its layer computes vLLM's formula, it decodes losslessly
(chain and tree) with a reduced draft vocabulary that it never leaves, and a checkpoint whose config and
weights disagree stops with one line."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdraft.core.errors import InputError
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.policies.stopping import FixedK
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.eagle import EagleSpeculator, TreeShape
from specdraft.decoding.speculators.eagle_model import Eagle3Drafter, vllm_layers
from specdraft.decoding.speculators.eagle_model import (EAGLE_CONFIG, EAGLE_WEIGHTS, load_eagle, new_eagle_drafter,
                                                        read_eagle_config, save_eagle)
from tests.decoding.eagle_fixtures import mimic_drafter, tiny_target, trained_eagle3

GREEDY = SamplingConfig(temperature=0.0)
PROMPTS = [[3, 5, 7, 11], [40, 2, 2, 9, 60, 14, 8]]
DRAFT_IDS = list(range(0, 96, 2)) + [1, 3, 5, 7]  # half the vocabulary (with every odd id the prompts hold)


@pytest.fixture(scope="module")
def pair():
    target = tiny_target("llama", 0, layers=3)
    return target, trained_eagle3(target, steps=100, draft_ids=DRAFT_IDS)


def rms(x, w, eps):
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_one_position_is_vllms_formula(norm_before_residual):
    """At the first position attention sees only itself (softmax = 1, RoPE cancels): the layer is then
    plain algebra, written here from vllm/model_executor/models/llama_eagle3.py."""
    target = tiny_target("llama", 1, layers=3)
    torch.manual_seed(0)
    d = new_eagle_drafter(target.config, variant="eagle3", draft_ids=DRAFT_IDS,
                          norm_before_residual=norm_before_residual).attach_target(target).init_from_target(target)
    for p in d.parameters():  # norms away from 1, so a misplaced norm shows
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    layer, eps = d.body.layers[0], target.config.rms_norm_eps
    feats, token = torch.randn(1, 1, 3 * 32), torch.tensor([[9]])
    with torch.no_grad():
        got = d(feats, token)[0, 0]
        h = feats[0, 0] @ d.fc.weight.T
        emb = target.model.embed_tokens.weight[9]
        normed = rms(h, layer.hidden_norm.weight, eps)
        residual = normed if norm_before_residual else h
        x = torch.cat([rms(emb, layer.input_layernorm.weight, eps), normed])
        attn = layer.self_attn
        v = (x @ attn.v_proj.weight.T).view(2, 8).repeat_interleave(2, dim=0).reshape(-1)  # 2 kv heads for 4
        residual = residual + v @ attn.o_proj.weight.T
        m = layer.mlp
        y = rms(residual, layer.post_attention_layernorm.weight, eps)
        want = residual + (torch.nn.functional.silu(y @ m.gate_proj.weight.T) * (y @ m.up_proj.weight.T)) @ m.down_proj.weight.T
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        logits = d.lm_logits(got)
        draft = rms(want, d.norm.weight, eps) @ d.lm_head.weight.T
        ids = torch.tensor(sorted(DRAFT_IDS))
        torch.testing.assert_close(logits[ids], draft, atol=1e-5, rtol=1e-5)
        assert logits.isinf().sum() == 96 - len(DRAFT_IDS)  # target id = i + d2t[i]; nothing else drafted
        assert torch.equal(d.d2t + torch.arange(len(DRAFT_IDS)), ids)


@pytest.mark.parametrize("tree", [None, TreeShape(depth=3, top_k=3, nodes=8)], ids=["chain", "tree"])
def test_greedy_equals_autoregressive_and_drafts_stay_in_the_draft_vocabulary(pair, tree):
    target, drafter = pair
    accepted, drafted = 0, set()
    for prompt in PROMPTS:
        speculator = EagleSpeculator(drafter, FixedK(3), tree)
        propose = speculator.propose

        def spy(*args, **kwargs):
            draft = propose(*args, **kwargs)
            drafted.update(draft.tokens)
            return draft

        speculator.propose = spy
        result = generate_speculative(target, speculator, prompt, 30, GREEDY)
        assert result.tokens == generate_autoregressive(target, prompt, 30, GREEDY).tokens
        accepted += sum(result.metrics.accepted)
    assert drafted and drafted <= set(DRAFT_IDS)
    assert accepted > 0


def test_checkpoint_round_trip_and_disagreeing_weights(pair, tmp_path):
    target, drafter = pair
    out = save_eagle(drafter, tmp_path / "e3")
    meta = read_eagle_config(out)
    assert (meta["variant"], meta["draft_vocab_size"], meta["norm_before_residual"]) == ("eagle3", 52, False)
    loaded = load_eagle(out, target=target)
    assert isinstance(loaded, Eagle3Drafter) and loaded.feature_layers == vllm_layers(3) == (0, 1, 2)
    a = generate_speculative(target, EagleSpeculator(drafter, FixedK(3)), PROMPTS[0], 20, GREEDY)
    b = generate_speculative(target, EagleSpeculator(loaded, FixedK(3)), PROMPTS[0], 20, GREEDY)
    assert a.tokens == b.tokens and a.metrics.accepted == b.metrics.accepted
    # the config says another draft vocabulary than the weights hold
    state = load_file(str(out / EAGLE_WEIGHTS))
    save_file({k: v for k, v in state.items() if k != "d2t"}, str(out / EAGLE_WEIGHTS))
    with pytest.raises(InputError, match="do not match"):
        load_eagle(out, target=target)
    save_file({**state, "lm_head.weight": state["lm_head.weight"][:10]}, str(out / EAGLE_WEIGHTS))
    with pytest.raises(InputError, match=r"shapes \['lm_head.weight \(10, 32\)"):
        load_eagle(out, target=target)


def test_a_drafter_written_before_this_layout_loads_as_eagle3_proj(tmp_path):
    target = tiny_target("llama", 0)
    out = save_eagle(mimic_drafter(target, 0.1, seed=1, variant="eagle3-proj", feature_layers=(0, 0, 1)), tmp_path / "old")
    meta = json.loads((out / EAGLE_CONFIG).read_text())
    (out / EAGLE_CONFIG).write_text(json.dumps({**meta, "format": "specdraft-eagle/1", "variant": "eagle3"}))
    assert load_eagle(out, target=target).variant == "eagle3-proj"


def test_bad_layer_ids_and_targets():
    cfg = tiny_target("llama", 0, layers=4).config
    assert vllm_layers(32) == (2, 16, 29) and vllm_layers(4) == (0, 2, 3)
    for layers in ([0, 1], [1, 1, 2], [2, 1, 3], [0, 1, 4]):  # vLLM gathers each id once, in layer order, below L
        with pytest.raises(InputError, match="3 increasing target layer ids"):
            new_eagle_drafter(cfg, variant="eagle3", feature_layers=layers)
    with pytest.raises(InputError, match="3 distinct target layers"):
        new_eagle_drafter(tiny_target("llama", 0, layers=2).config, variant="eagle3")
    with pytest.raises(InputError, match="draft vocabulary"):
        new_eagle_drafter(cfg, variant="eagle3", draft_ids=[0, 0, 1])
    with pytest.raises(InputError, match="reduced draft vocabulary"):
        new_eagle_drafter(cfg, variant="eagle1", draft_ids=[0, 1])
