"""benchmarks/engines/bench_speculators.py's pure parts on tiny models (no speculators install, no run directory): the
key mapping from speculators' / vLLM's eagle3 layout to specdraft's, its decoder adapter, the hidden-state file
writer, the rows both trainers see, the vocabulary files and the pooled acceptance length."""
import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdraft.decoding.speculators.eagle_model import new_eagle_drafter
from specdraft.pipelines.vllm_export import vllm_weights
from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_speculators")


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).eval()


def tiny_drafter(target, seed: int = 1, norm_before_residual: bool = False):
    torch.manual_seed(seed)
    drafter = new_eagle_drafter(target.config, variant="eagle3", feature_layers=[0, 1, 3], draft_ids=list(range(0, 64, 2)),
                                norm_before_residual=norm_before_residual)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape) * 0.1)  # norms away from ones: a dropped or swapped key shows
    return drafter


def test_speculators_keys_map_back_onto_our_drafter(bench, target):
    drafter = tiny_drafter(target)
    exported = vllm_weights(drafter)  # the layout vLLM and speculators share: layers.0.*, fc, norm, lm_head, d2t
    assert any(k.startswith("layers.0.") for k in exported) and not any(k.startswith("body.") for k in exported)
    peer = dict(exported, **{"embed_tokens.weight": torch.zeros(64, 32), "t2d": torch.zeros(64, dtype=torch.bool),
                             "verifier_norm.weight": torch.ones(32)})  # what a speculators checkpoint adds
    mapped = bench.specdraft_state(peer)
    want = drafter.state_dict()
    assert set(mapped) == set(want)
    assert all(torch.equal(mapped[k], want[k]) for k in want)


def write_peer_checkpoint(tmp_path, drafter, target, norm_before_fc=False, norm_output=False, extra=None):
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in vllm_weights(drafter).items()}
    state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    if norm_before_fc:
        state["input_norm.weight"] = torch.rand(96) + 0.5
    state.update(extra or {})
    save_file(state, str(tmp_path / "model.safetensors"))
    cfg = {"speculators_model_type": "eagle3", "transformer_layer_config": {"num_hidden_layers": 1},
           "eagle_aux_hidden_state_layer_ids": [0, 1, 3], "norm_before_residual": drafter.norm_before_residual,
           "norm_before_fc": norm_before_fc, "norm_output": norm_output}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return {"target_config": target.config.to_dict(), "target_hash": None}


def test_a_peer_checkpoint_without_extras_decodes_as_our_drafter(bench, target, tmp_path):
    drafter = tiny_drafter(target, norm_before_residual=True).attach_target(target).eval()
    # speculators saves in bf16: its embedding copy is the target's rounded, which is still the target's
    bf16 = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().to(torch.bfloat16)}
    meta = write_peer_checkpoint(tmp_path, drafter, target, extra=bf16)
    peer = bench.load_peer(tmp_path, meta, target)
    assert peer.norm_before_residual and peer.input_norm is None and not peer.norm_output
    feats, ids = torch.randn(1, 5, 96), torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(peer.lm_logits(peer(feats, ids)), drafter.lm_logits(drafter(feats, ids)))


def test_the_adapter_applies_speculators_input_norm_and_normed_output(bench, target, tmp_path):
    drafter = tiny_drafter(target).attach_target(target).eval()
    meta = write_peer_checkpoint(tmp_path, drafter, target, norm_before_fc=True, norm_output=True)
    peer = bench.load_peer(tmp_path, meta, target)
    feats, ids = torch.randn(1, 5, 96), torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        out = peer(feats, ids)
        # speculators: fc(input_norm(features)); the layer's output normed once, fed on and read by lm_head
        emb = target.get_input_embeddings()(ids)
        h = drafter.body(inputs_embeds=torch.cat([emb, drafter.fc(peer.input_norm(feats))], -1)).last_hidden_state
        torch.testing.assert_close(out, drafter.norm(h))
        torch.testing.assert_close(peer.draft_logits(out), drafter.lm_head(drafter.norm(h)))
        assert not torch.allclose(peer.draft_logits(out), drafter.draft_logits(drafter(feats, ids)))


def test_a_trained_embedding_or_fc_norm_is_refused_in_one_line(bench, target, tmp_path):
    drafter = tiny_drafter(target)
    meta = write_peer_checkpoint(tmp_path, drafter, target, extra={"embed_tokens.weight": torch.zeros(64, 32)})
    with pytest.raises(bench.InputError, match="embedding differs"):
        bench.load_peer(tmp_path, meta, target)
    meta = write_peer_checkpoint(tmp_path, drafter, target)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "fc_norm": True}))
    with pytest.raises(bench.InputError, match="fc_norm"):
        bench.load_peer(tmp_path, meta, target)


def test_hidden_state_files_hold_three_layer_inputs_and_the_pre_norm_last_layer(bench, target, tmp_path):
    from safetensors.torch import load_file

    ids = [3, 9, 27, 5, 11, 2]
    hs = bench.hidden_state_stack(target, ids, [0, 1, 3])
    assert hs.shape == (6, 4, 32) and hs.dtype == torch.float32
    with torch.no_grad():
        out = target(input_ids=torch.tensor([ids]), output_hidden_states=True)
    torch.testing.assert_close(hs[:, 1], out.hidden_states[1][0])
    # the last entry is before the final norm: the norm of it is what the head reads
    torch.testing.assert_close(target.model.norm(hs[:, 3]), out.hidden_states[-1][0])
    assert not torch.allclose(hs[:, 3], out.hidden_states[-1][0])
    target.save_pretrained(tmp_path / "target")
    assert bench.extract_all(tmp_path / "target", {7: {"input_ids": ids}}, [0, 1, 3], tmp_path / "cache") == 1
    saved = load_file(str(tmp_path / "cache" / "hs_7.safetensors"))
    assert saved["hidden_states"].shape == (6, 4, 32) and saved["token_ids"].tolist() == ids
    bench.link_hidden_states(tmp_path / "cache", [7, 7], tmp_path / "data")
    assert sorted(p.name for p in (tmp_path / "data" / "hidden_states").iterdir()) == ["hs_0.safetensors", "hs_1.safetensors"]


def test_rows_carry_our_collators_loss_mask_and_our_sampler_order(bench):
    from types import SimpleNamespace

    from specdraft.drafters.data import CausalLMCollator

    row = bench.prepared_row({"prompt_ids": [5, 6, 7], "response_ids": [8, 9]}, CausalLMCollator(pad_token_id=0))
    # position i predicts token i + 1: positions 2 and 3 predict the response tokens 8 and 9
    assert row == {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 0], "seq_len": 5}
    ecfg = SimpleNamespace(train=SimpleNamespace(batch_size=4, max_steps=5, max_epochs=3))
    batches = bench.our_batches(12, ecfg, seed=0)
    assert [len(b) for b in batches] == [4] * 5  # 3 batches an epoch: epoch 2 supplies the last two
    assert sorted(i for b in batches[:3] for i in b) == list(range(12))
    assert batches != bench.our_batches(12, ecfg, seed=1)


def test_vocab_files_are_speculators_offsets_and_mask(bench, tmp_path):
    d2t_path, t2d_path = bench.vocab_files([9, 2, 4], 12, tmp_path)
    d2t, t2d = np.load(d2t_path), np.load(t2d_path)
    assert (np.arange(3) + d2t).tolist() == [2, 4, 9] and t2d.dtype == bool and np.flatnonzero(t2d).tolist() == [2, 4, 9]


def test_pooled_mal_pools_before_dividing(bench):
    point, lo, hi = bench.pooled_mal([10, 30], [10, 10])
    assert point == 2.0 and 1.0 <= lo <= point <= hi <= 3.0
    diff, _, _ = bench.paired_difference({"tokens": [10, 30], "calls": [10, 10]}, {"tokens": [10, 10], "calls": [10, 10]})
    assert diff == pytest.approx(1.0)


def test_a_rerun_keeps_only_seeds_finished_with_the_same_settings(bench, tmp_path):
    import argparse

    rows = {"1": {"tokens": [4], "calls": [2], "equal": [True]}}
    saved = {"trained": {"0": {"steps": 3}, "1": {"steps": 3}},
             "results": {"speculators s0": rows, "specdraft s0": rows, "speculators s1": rows},  # seed 1 undecoded
             "facts": {"prompts": 1}, "args": {"prompts_per_domain": 3, "tokens": 48, "k_list": [1], "peer_flag": []}}
    (tmp_path / "results.json").write_text(json.dumps(saved))
    args = argparse.Namespace(prompts_per_domain=3, tokens=48, k_list=[1], peer_flag=[], seed_list=[0, 1, 2])
    trained, results, facts = bench.finished_seeds(tmp_path, args)
    assert list(trained) == [0] and set(results) == {"speculators s0", "specdraft s0"}
    assert results["specdraft s0"][1]["tokens"] == [4] and facts == {"prompts": 1}
    args.tokens = 64  # other settings: nothing is kept
    assert bench.finished_seeds(tmp_path, args) == ({}, {}, {})


def test_the_all_seeds_row_sums_each_prompt_over_seeds(bench):
    run = lambda t: {4: {"tokens": t, "calls": [2, 2], "equal": [True, True]}}
    results = {"specdraft s0": run([4, 6]), "speculators s0": run([2, 4]),
               "specdraft s1": run([6, 4]), "speculators s1": run([4, 2])}
    summed = bench.seed_sum([results["specdraft s0"], results["specdraft s1"]], [4])
    assert summed == {4: {"tokens": [10, 10], "calls": [4, 4]}}
    rows = bench.difference_table(results, [0, 1], [4])
    assert len(rows) == 5 and rows[-1].startswith("| all") and "+1.000" in rows[-1]  # 20/8 - 12/8
