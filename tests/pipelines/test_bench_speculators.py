"""benchmarks/engines/bench_speculators.py's pure parts on tiny models (no speculators install, no run directory): the
key mapping from speculators' / vLLM's eagle3 layout to specdraft's, its decoder adapter (speculators_peer.py), the
hidden-state file writer and the rows both trainers see (speculators_data.py), the vocabulary files, the pooled
acceptance length (acceptance.py), every cache keyed on its run, and the steps speculators ran, from its log."""
import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdraft.decoding.speculators.eagle_model import new_eagle_drafter
from specdraft.pipelines.vllm_export import vllm_weights
from tests.conftest import import_benchmark

bench = import_benchmark("bench_speculators")
data = import_benchmark("speculators_data")
speculators_peer = import_benchmark("speculators_peer")
report = import_benchmark("speculators_report")
acceptance = import_benchmark("acceptance")


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


def test_speculators_keys_map_back_onto_our_drafter(target):
    drafter = tiny_drafter(target)
    exported = vllm_weights(drafter)  # the layout vLLM and speculators share: layers.0.*, fc, norm, lm_head, d2t
    assert any(k.startswith("layers.0.") for k in exported) and not any(k.startswith("body.") for k in exported)
    peer_state = dict(exported, **{"embed_tokens.weight": torch.zeros(64, 32), "t2d": torch.zeros(64, dtype=torch.bool),
                             "verifier_norm.weight": torch.ones(32)})  # what a speculators checkpoint adds
    mapped = speculators_peer.specdraft_state(peer_state)
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


def test_a_peer_checkpoint_without_extras_decodes_as_our_drafter(target, tmp_path):
    drafter = tiny_drafter(target, norm_before_residual=True).attach_target(target).eval()
    # speculators saves in bf16: its embedding copy is the target's rounded, which is still the target's
    bf16 = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().to(torch.bfloat16)}
    meta = write_peer_checkpoint(tmp_path, drafter, target, extra=bf16)
    peer = speculators_peer.load_peer(tmp_path, meta, target)
    assert peer.norm_before_residual and peer.input_norm is None and not peer.norm_output
    feats, ids = torch.randn(1, 5, 96), torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(peer.lm_logits(peer(feats, ids)), drafter.lm_logits(drafter(feats, ids)))


def test_the_adapter_applies_speculators_input_norm_and_normed_output(target, tmp_path):
    drafter = tiny_drafter(target).attach_target(target).eval()
    meta = write_peer_checkpoint(tmp_path, drafter, target, norm_before_fc=True, norm_output=True)
    peer = speculators_peer.load_peer(tmp_path, meta, target)
    feats, ids = torch.randn(1, 5, 96), torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        out = peer(feats, ids)
        # speculators: fc(input_norm(features)); the layer's output normed once, fed on and read by lm_head
        emb = target.get_input_embeddings()(ids)
        h = drafter.body(inputs_embeds=torch.cat([emb, drafter.fc(peer.input_norm(feats))], -1)).last_hidden_state
        torch.testing.assert_close(out, drafter.norm(h))
        torch.testing.assert_close(peer.draft_logits(out), drafter.lm_head(drafter.norm(h)))
        assert not torch.allclose(peer.draft_logits(out), drafter.draft_logits(drafter(feats, ids)))


def test_a_trained_embedding_or_fc_norm_is_refused_in_one_line(target, tmp_path):
    drafter = tiny_drafter(target)
    meta = write_peer_checkpoint(tmp_path, drafter, target, extra={"embed_tokens.weight": torch.zeros(64, 32)})
    with pytest.raises(speculators_peer.InputError, match="embedding differs"):
        speculators_peer.load_peer(tmp_path, meta, target)
    meta = write_peer_checkpoint(tmp_path, drafter, target)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "fc_norm": True}))
    with pytest.raises(speculators_peer.InputError, match="fc_norm"):
        speculators_peer.load_peer(tmp_path, meta, target)


def test_hidden_state_files_hold_three_layer_inputs_and_the_pre_norm_last_layer(target, tmp_path):
    from safetensors.torch import load_file

    ids = [3, 9, 27, 5, 11, 2]
    hs = data.hidden_state_stack(target, ids, [0, 1, 3])
    assert hs.shape == (6, 4, 32) and hs.dtype == torch.float32
    with torch.no_grad():
        out = target(input_ids=torch.tensor([ids]), output_hidden_states=True)
    torch.testing.assert_close(hs[:, 1], out.hidden_states[1][0])
    # the last entry is before the final norm: the norm of it is what the head reads
    torch.testing.assert_close(target.model.norm(hs[:, 3]), out.hidden_states[-1][0])
    assert not torch.allclose(hs[:, 3], out.hidden_states[-1][0])
    target.save_pretrained(tmp_path / "target")
    assert data.extract_all(tmp_path / "target", {7: {"input_ids": ids}}, [0, 1, 3], tmp_path / "cache") == 1
    saved = load_file(str(tmp_path / "cache" / "hs_7.safetensors"))
    assert saved["hidden_states"].shape == (6, 4, 32) and saved["token_ids"].tolist() == ids
    data.link_hidden_states(tmp_path / "cache", [7, 7], tmp_path / "data")
    assert sorted(p.name for p in (tmp_path / "data" / "hidden_states").iterdir()) == ["hs_0.safetensors", "hs_1.safetensors"]


def test_rows_carry_our_collators_loss_mask_and_our_sampler_order():
    from types import SimpleNamespace

    from specdraft.drafters.data import CausalLMCollator

    row = data.prepared_row({"prompt_ids": [5, 6, 7], "response_ids": [8, 9]}, CausalLMCollator(pad_token_id=0))
    # position i predicts token i + 1: positions 2 and 3 predict the response tokens 8 and 9
    assert row == {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 0], "seq_len": 5}
    ecfg = SimpleNamespace(train=SimpleNamespace(batch_size=4, max_steps=5, max_epochs=3))
    batches = data.our_batches(12, ecfg, seed=0)
    assert [len(b) for b in batches] == [4] * 5  # 3 batches an epoch: epoch 2 supplies the last two
    assert sorted(i for b in batches[:3] for i in b) == list(range(12))
    assert batches != data.our_batches(12, ecfg, seed=1)


def test_vocab_files_are_speculators_offsets_and_mask(tmp_path):
    d2t_path, t2d_path = data.vocab_files([9, 2, 4], 12, tmp_path)
    d2t, t2d = np.load(d2t_path), np.load(t2d_path)
    assert (np.arange(3) + d2t).tolist() == [2, 4, 9] and t2d.dtype == bool and np.flatnonzero(t2d).tolist() == [2, 4, 9]


def test_pooled_mal_pools_before_dividing():
    point, lo, hi = acceptance.pooled_mal([10, 30], [10, 10])
    assert point == 2.0 and 1.0 <= lo <= point <= hi <= 3.0
    a, b = {"tokens": [10, 30, 20], "calls": [10, 10, 5]}, {"tokens": [10, 10, 6], "calls": [10, 10, 4]}
    diff, d_lo, d_hi = acceptance.paired_difference(a, b)
    ratio, r_lo, r_hi = acceptance.paired_ratio(a, b)
    assert diff == pytest.approx(60 / 25 - 26 / 24) and ratio == pytest.approx((60 / 25) / (26 / 24))
    assert d_lo <= diff <= d_hi and r_lo <= ratio <= r_hi
    # the same prompts resampled for both statistics: a bound of one is the other's on the same resample
    assert (d_lo > 0) == (r_lo > 1)


def test_a_rerun_keeps_only_seeds_finished_with_the_same_settings(tmp_path):
    import argparse

    rows = {"1": {"tokens": [4], "calls": [2], "equal": [True]}}
    key = {"run": "target-and-data", "prompts": "prompt-ids"}
    saved = {"trained": {"0": {"steps": 3}, "1": {"steps": 3}},
             "results": {"speculators s0": rows, "specdraft s0": rows, "speculators s1": rows},  # seed 1 undecoded
             "facts": {"prompts": 1},
             "args": {"key": key, "prompts_per_domain": 3, "tokens": 48, "k_list": [1], "peer_flag": []}}
    (tmp_path / "results.json").write_text(json.dumps(saved))
    args = argparse.Namespace(key=dict(key), prompts_per_domain=3, tokens=48, k_list=[1], peer_flag=[],
                              seed_list=[0, 1, 2])
    trained, results, facts = bench.finished_seeds(tmp_path, args)
    assert list(trained) == [0] and set(results) == {"speculators s0", "specdraft s0"}
    assert results["specdraft s0"][1]["tokens"] == [4] and facts == {"prompts": 1}
    args.tokens = 64  # other settings: nothing is kept
    assert bench.finished_seeds(tmp_path, args) == ({}, {}, {})
    args.tokens = 48
    for other in ({**key, "run": "a rerun of make real"}, {**key, "prompts": "other prompt ids"}):
        args.key = other  # the same settings on another run's target or data, or on other prompts: nothing is kept
        assert bench.finished_seeds(tmp_path, args) == ({}, {}, {})


def test_the_all_seeds_row_sums_each_prompt_over_seeds():
    run = lambda t: {4: {"tokens": t, "calls": [2, 2], "equal": [True, True]}}
    results = {"specdraft s0": run([4, 6]), "speculators s0": run([2, 4]),
               "specdraft s1": run([6, 4]), "speculators s1": run([4, 2])}
    summed = report.seed_sum([results["specdraft s0"], results["specdraft s1"]], [4])
    assert summed == {4: {"tokens": [10, 10], "calls": [4, 4]}}
    rows = report.difference_table(results, [0, 1], [4])
    assert len(rows) == 5 and rows[-1].startswith("| all") and "+1.000" in rows[-1]  # 20/8 - 12/8


def write_stage_manifest(directory, stage: str, content: str) -> None:
    """A stage output's manifest.json as the pipeline writes it, its content hash standing for `content`."""
    import dataclasses
    import hashlib

    from specdraft.pipelines.artifacts import MANIFEST, Manifest

    directory.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(stage=stage, config={}, cache_key="-", inputs={}, metrics={}, wall_time_s=1.0,
                        content_hash=hashlib.sha256(content.encode()).hexdigest(), files={})
    (directory / MANIFEST).write_text(json.dumps(dataclasses.asdict(manifest)))


def test_the_run_key_follows_the_target_and_the_distilled_data(tmp_path):
    write_stage_manifest(tmp_path / "target", "convert-target", "weights 1")
    write_stage_manifest(tmp_path / "distill_data", "distill-data", "answers 1")
    first = acceptance.run_key(tmp_path)
    assert acceptance.run_key(tmp_path) == first
    write_stage_manifest(tmp_path / "distill_data", "distill-data", "answers 2")  # make real again: other answers
    second = acceptance.run_key(tmp_path)
    write_stage_manifest(tmp_path / "target", "convert-target", "weights 2")
    assert len({first, second, acceptance.run_key(tmp_path)}) == 3


def test_a_cached_hidden_state_of_other_token_ids_is_computed_again(target, tmp_path):
    """A cache file left by another run's rows (same index, other tokens) is not trained on."""
    from safetensors.torch import load_file, save_file

    target.save_pretrained(tmp_path / "target")
    cache = tmp_path / "cache"
    cache.mkdir()
    stale = {"hidden_states": torch.zeros(3, 4, 32), "token_ids": torch.tensor([1, 2, 3])}
    save_file(stale, str(cache / "hs_7.safetensors"))
    ids = [3, 9, 27, 5]
    assert data.extract_all(tmp_path / "target", {7: {"input_ids": ids}}, [0, 1, 3], cache) == 1
    saved = load_file(str(cache / "hs_7.safetensors"))
    assert saved["token_ids"].tolist() == ids
    torch.testing.assert_close(saved["hidden_states"], data.hidden_state_stack(target, ids, [0, 1, 3]))
    # the same ids again: kept, nothing computed
    assert data.extract_all(tmp_path / "target", {7: {"input_ids": ids}}, [0, 1, 3], cache) == 0
    # each run's states lie apart: another run's key or other layers are another folder
    assert len({data.hs_cache(tmp_path, "a", [0, 1, 3]), data.hs_cache(tmp_path, "b", [0, 1, 3]),
                data.hs_cache(tmp_path, "a", [0, 1, 2])}) == 3


def test_a_seeds_dataset_is_rebuilt_for_another_run_or_other_rows(tmp_path):
    from types import SimpleNamespace

    from datasets import load_from_disk

    ecfg = SimpleNamespace(train=SimpleNamespace(batch_size=2, max_steps=2, max_epochs=1))
    row = lambda i: {"input_ids": [i, i + 1, i + 2], "loss_mask": [0, 1, 1], "seq_len": 3}
    prepared, dev = [row(i) for i in range(4)], [row(10)]
    cache = tmp_path / "cache"
    cache.mkdir()
    for j in range(5):
        (cache / f"hs_{j}.safetensors").write_bytes(b"states of row %d" % j)
    out, n_train, steps = data.prepare_seed(tmp_path, cache, "run-a", 0, ecfg, prepared, dev)
    first = [r["input_ids"].tolist() for r in load_from_disk(str(out))]
    assert (n_train, steps) == (4, 2) and sorted(first[:4]) == [row(i)["input_ids"] for i in range(4)]
    # the same run's rows changed (a rerun of make real distilled other answers): rebuilt, not read
    prepared = [{**r, "input_ids": [x + 100 for x in r["input_ids"]]} for r in prepared]
    out, _, _ = data.prepare_seed(tmp_path, cache, "run-a", 0, ecfg, prepared, dev)
    assert all(r["input_ids"].tolist()[0] >= 100 for r in list(load_from_disk(str(out)))[:4])
    stamp = json.loads((out / data.STAMP).read_text())
    data.prepare_seed(tmp_path, cache, "run-b", 0, ecfg, prepared, dev)  # another run, the same rows: its own stamp
    assert json.loads((out / data.STAMP).read_text()) == {**stamp, "run": "run-b"}
    # every row's hidden states are the cache's file of its source row
    order = [i for b in data.our_batches(4, ecfg, 0) for i in b] + [4]
    assert [(out / "hidden_states" / f"hs_{i}.safetensors").read_bytes() for i in range(5)] == \
        [b"states of row %d" % j for j in order]


def test_the_speculators_row_prints_the_steps_its_log_says_it_ran(tmp_path):
    """speculators packs the rows into at most the steps asked for: 24 asked, 22 packed, 22 run."""
    log = tmp_path / "speculators_train.log"
    log.write_text("loading\n[speculators_launch] --total-seq-len 4096: 22 packed batches an epoch\nEpoch 0: 22/22\n")
    assert speculators_peer.steps_run(log) == 22
    trained = {0: {"steps": 24, "tokens": 1000, "speculators": {"seconds": 1.0, "peak_rss_mib": 10, "steps": 22},
                   "specdraft": {"seconds": 2.0, "peak_rss_mib": 20}}}
    rows = report.cost_table(trained, {"computed": 1, "rows": 2, "seconds": 3.0, "peak_rss_mib": 30})
    assert "| 0 | speculators | 22 | 1,000 |" in "\n".join(rows) and "| 0 | specdraft | 24 | 1,000 |" in "\n".join(rows)
    assert not any("stored signal" in r for r in rows)
    rows = report.cost_table(trained, {"computed": 1, "rows": 2, "seconds": 3.0, "peak_rss_mib": 30}, {"seconds": 4.0})
    assert any("stored signal" in r and "| 4.0 |" in r for r in rows)  # teacher-data's time beside the extraction's
    log.write_text("no launcher line\n")
    with pytest.raises(RuntimeError, match="packed"):
        speculators_peer.steps_run(log)


def test_decode_counts_give_both_definitions_and_the_target_as_its_own_drafter_accepts_every_draft():
    """The counts both engines' benchmarks read: tokens per target forward (the decoder's acceptance length) and
    drafts / accepted (vLLM's, 1 + accepted / drafts), from one decode."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    target = LlamaForCausalLM(cfg).eval()
    prompts = [("math", [3, 4, 5]), ("code", [7, 8, 9, 10])]
    reference = acceptance.greedy_reference(target, prompts, 8, [])
    counts = acceptance.decode_counts(target, target, prompts, [2, 3], 8, [], reference)
    for k, rows in counts.items():
        assert rows["equal"] == [True, True] and rows["outputs"] == reference
        # every draft accepted: rounds of K + 1 tokens, the last one cut at 8 tokens
        assert rows["calls"] == [-(-8 // (k + 1))] * 2 and rows["tokens"] == [8, 8]
        assert rows["drafts"] == rows["calls"] and rows["accepted"] == [8 - c for c in rows["calls"]]
    assert all("near_tie" not in rows for rows in counts.values())  # fp32: equality is exact, nothing to judge


def test_equal_wall_time_gives_speculators_the_batches_its_rate_fits_in_specdraft_s_time():
    """--ablation NAME --equal-time: speculators trains on the rows of specdraft's first n batches, n its seed-0
    batches scaled by the two wall times; past one pass (the same rows again, in specdraft's next epochs) when
    speculators was the faster."""
    import dataclasses
    from types import SimpleNamespace

    from specdraft.training.trainer import TrainerConfig

    def seed0(ours: float, peer: float) -> dict:
        return {"steps": 12, "specdraft": {"seconds": ours}, "speculators": {"seconds": peer}}

    assert bench.equal_time_steps(seed0(30.0, 90.0)) == 4
    assert bench.equal_time_steps(seed0(30.0, 15.0)) == 24
    assert bench.equal_time_steps(seed0(1.0, 1000.0)) == 1
    ecfg = SimpleNamespace(train=TrainerConfig(batch_size=4, max_epochs=2))  # 24 rows: 6 batches a pass, 12 in all
    full = data.our_batches(24, ecfg, seed=0)
    cut = lambda n: data.our_batches(24, SimpleNamespace(train=dataclasses.replace(ecfg.train, max_steps=n)), seed=0)
    assert len(full) == 12 and cut(4) == full[:4]
    assert len(cut(24)) == 24 and cut(24)[:12] == full
    assert sorted(i for b in cut(24)[18:] for i in b) == list(range(24))  # the fourth pass: every row once more


def test_specdraft_trains_on_the_run_s_stored_signal_and_refuses_a_missing_or_stale_one(tmp_path):
    """When the config's EAGLE drafters read teacher-data (make real's), the child trains on the run's stored
    features as the stage does; a run without them, or with them scored from other answers, is refused in one line."""
    from specdraft.core.errors import InputError
    from specdraft.drafters.teacher_signal import SignalFormat
    from specdraft.pipelines.schema import RunConfig

    cfg = RunConfig()
    cfg.train_drafters.eagle.enabled = True
    write_stage_manifest(tmp_path / "distill_data", "distill-data", "answers 1")
    with pytest.raises(InputError, match="teacher_data is missing"):
        bench.stored_signal(tmp_path, cfg)
    info = {"format": SignalFormat(4, 10, 16, (0,), 8).to_json(), "chunks": {"train": []},
            "distill_data": __import__("hashlib").sha256(b"answers 2").hexdigest()}
    write_stage_manifest(tmp_path / "teacher_data", "teacher-data", "signal")
    (tmp_path / "teacher_data" / "info.json").write_text(json.dumps(info))
    with pytest.raises(InputError, match="another distill-data"):
        bench.stored_signal(tmp_path, cfg)
    write_stage_manifest(tmp_path / "distill_data", "distill-data", "answers 2")
    assert bench.stored_signal(tmp_path, cfg).format.top_k == 4
    assert bench.stored_cost(tmp_path, cfg) == {"seconds": 1.0}
    cfg.train_drafters.eagle.enabled = False  # nothing reads it: the trainer runs the target, no stored row
    assert bench.stored_signal(tmp_path, cfg) is None and bench.stored_cost(tmp_path, cfg) is None


def test_below_fp32_a_divergence_is_judged_a_near_tie_or_not():
    """A bf16 target's decodes get each divergence judged at its first differing token: an output equal to the
    reference is not judged, one that took the target's least likely token there is no near-tie."""
    import copy

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    target = copy.deepcopy(LlamaForCausalLM(cfg).eval()).to(torch.bfloat16)
    prompts = [("math", [3, 4, 5]), ("code", [7, 8, 9, 10])]
    reference = acceptance.greedy_reference(target, prompts, 6, [])
    with torch.inference_mode():
        worst = int(target(torch.tensor([prompts[1][1] + reference[1][:2]])).logits[0, -1].float().argmin())
    wrong = reference[1][:2] + [worst] + reference[1][3:]
    by_k = {2: {"outputs": [reference[0], wrong]}}
    acceptance.judge_divergences(target, prompts, by_k, reference)
    assert by_k[2]["near_tie"] == [None, False]
    counts = acceptance.decode_counts(target, target, prompts, [2], 6, [], reference)
    assert "near_tie" in counts[2] and len(counts[2]["near_tie"]) == 2
    rows = report.mal_table({"x": {2: {**counts[2], **by_k[2], "equal": [True, False]}}}, [2])
    assert "1/2 (0 near-ties, 1 other)" in "\n".join(rows)
