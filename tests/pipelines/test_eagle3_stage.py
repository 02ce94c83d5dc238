"""train-drafters with train_drafters.eagle.variant: eagle3 (vLLM's layout, a reduced draft vocabulary) on a
tiny run with a 3-layer target, then export: the drafter decodes greedily lossless, export writes the
directory vLLM loads as eagle3 and its speculative config, and an EAGLE export vLLM could not serve, or an
EAGLE config that disagrees with its weights, stops with one line before the bundle is written."""
import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specdraft.core.errors import InputError
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.policies.stopping import FixedK
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.speculators.eagle import EagleSpeculator
from specdraft.decoding.speculators.eagle_model import vllm_layers
from specdraft.decoding.speculators.eagle_model import load_eagle, read_eagle_config
from specdraft.pipelines import vllm_export
from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import fresh_copy, run_template, tiny_config
from tests.pipelines.test_eagle_stage import EAGLE, FAST

EAGLE3 = {"eagle": dict(EAGLE["eagle"], variant="eagle3", ttt_steps=2, drafters=["ofa"], draft_vocab=200)}
TARGET3 = {"tokenizer": {"vocab_size": 300}, "seq_len": 64, "train": {"max_steps": 4, "batch_size": 4, "wandb": {"mode": "disabled"}},
           "model": {"n_layers": 3, "hidden": 64, "n_heads": 2, "intermediate": 128, "max_positions": 256}}


def _config(root, eagle=EAGLE3, **sections):
    drafters = dict(dataclasses.asdict(tiny_config(root).train_drafters), **eagle)
    return tiny_config(root, **FAST, train_drafters=drafters, pretrain_target=TARGET3, **sections)


@pytest.fixture(scope="module")
def _trained(tmp_path_factory):
    root = run_template(tmp_path_factory, "tiny_run3", None, ("prepare-data", "pretrain-target"), pretrain_target=TARGET3)
    cfg = _config(root)
    for stage in ("distill-data", "train-drafters", "acceptance-data", "train-heads"):
        run_stage(cfg, stage)
    return root


@pytest.fixture(scope="module")
def _exported(_trained, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3_export") / "run"
    shutil.copytree(_trained, root)
    run_stage(_config(root), "export")
    return root


def test_eagle3_drafter_is_trained_and_decodes_losslessly(_trained):
    out = _trained / "drafters" / "eagle" / "eagle-ofa"
    meta = read_eagle_config(out)
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(_trained / "target").eval()
    assert meta["variant"] == "eagle3" and meta["feature_layers"] == list(vllm_layers(3)) and meta["steps"] == 3
    assert meta["draft_vocab_size"] == 200 and meta["norm_before_residual"] is False
    assert read_manifest(_trained / "drafters").metrics["eagle"]["drafters"]["eagle-ofa"]["variant"] == "eagle3"
    drafter = load_eagle(out, target=target)
    greedy = SamplingConfig(temperature=0.0)
    result = generate_speculative(target, EagleSpeculator(drafter, FixedK(3)), [5, 6, 7], 16, greedy)
    assert result.tokens == generate_autoregressive(target, [5, 6, 7], 16, greedy).tokens


def test_export_writes_the_vllm_layout_and_speculative_config(_exported):
    bundle = _exported / "bundle"
    d = bundle / "vllm" / "eagle-ofa"
    cfg = json.loads((d / "config.json").read_text())
    target_cfg = json.loads((bundle / "target" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["norm_before_residual"] is False
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2] and cfg["draft_vocab_size"] == 200
    assert cfg["target_hidden_size"] == target_cfg["hidden_size"] == cfg["transformer_layer_config"]["hidden_size"]
    assert cfg["transformer_layer_config"]["vocab_size"] == target_cfg["vocab_size"]
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1
    spec = cfg["speculators_config"]
    k = json.loads((bundle / "bundle.json").read_text())["decoding"]["k"]
    assert spec["proposal_methods"][0]["speculative_tokens"] == k and spec["default_proposal_method"] == "greedy"
    assert spec["verifier"]["name_or_path"] == str((bundle / "target").resolve())
    assert json.loads((d / "speculative_config.json").read_text()) == {
        "method": "eagle3", "model": str(d.resolve()), "num_speculative_tokens": k}
    w = load_file(str(d / "model.safetensors"))
    assert not any(n.startswith(("model.", "body.", "embed_tokens")) for n in w)
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "layers.0.hidden_norm.weight",
            "layers.0.self_attn.q_proj.weight"} <= set(w)
    H = target_cfg["hidden_size"]
    assert w["fc.weight"].shape == (H, 3 * H) and w["layers.0.self_attn.q_proj.weight"].shape[1] == 2 * H
    ids = torch.arange(200) + w["d2t"]
    assert w["d2t"].dtype == torch.int64 and torch.all(ids[1:] > ids[:-1]) and int(ids[-1]) < target_cfg["vocab_size"]
    # the same weights as the drafter the bundle serves
    ours = load_file(str(bundle / "eagle" / "eagle-ofa" / "model.safetensors"))
    assert torch.equal(ours["body.layers.0.self_attn.q_proj.weight"], w["layers.0.self_attn.q_proj.weight"])


def test_a_target_vllm_cannot_serve_stops_export(_trained, tmp_path, monkeypatch):
    root = fresh_copy(_trained, tmp_path)
    monkeypatch.setattr(vllm_export, "EAGLE3_TARGETS", ("Qwen2ForCausalLM",))
    with pytest.raises(InputError, match="vLLM .* serves EAGLE-3 beside Qwen2ForCausalLM") as err:
        run_stage(_config(root), "export")
    assert "\n" not in str(err.value) and not (root / "bundle").exists()


def test_an_eagle_config_disagreeing_with_its_weights_stops_export(_trained, tmp_path):
    root = fresh_copy(_trained, tmp_path)
    path = root / "drafters" / "eagle" / "eagle-ofa" / "eagle_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "n_layers": 2}))
    with pytest.raises(InputError, match="do not match eagle_config.json") as err:
        run_stage(_config(root, run={"root": str(root), "verify_inputs": "off"}), "export")
    assert "\n" not in str(err.value) and not (root / "bundle").exists()


def test_layers_need_an_eagle3_variant(tmp_path):
    with pytest.raises(InputError, match="only with variant: eagle3"):
        _config(tmp_path, {"eagle": dict(EAGLE["eagle"], layers=[1, 2, 3])}).train_drafters.eagle.check()
    with pytest.raises(InputError, match="draft_vocab"):
        _config(tmp_path, {"eagle": dict(EAGLE["eagle"], draft_vocab=100)}).train_drafters.eagle.check()


def test_a_draft_vocabulary_past_the_targets_stops_train_drafters_before_any_drafter_trains(_trained, tmp_path):
    root = fresh_copy(_trained, tmp_path)
    shutil.rmtree(root / "drafters")
    with pytest.raises(InputError, match="draft_vocab is 1000, the target's vocabulary only 300") as err:
        run_stage(_config(root, {"eagle": dict(EAGLE3["eagle"], draft_vocab=1000)}), "train-drafters")
    assert "\n" not in str(err.value) and not (root / "drafters").exists()
    assert not list(root.glob(".work/**/model"))  # checked before the first fit, not after the drafters trained


def test_export_writes_a_draft_model_speculative_config_per_independent_drafter(_exported):
    """At its best fixed K, or, with an acceptance summary, at the K per batch-size range export priced (its
    largest K as num_speculative_tokens); the eagle3 config keeps the bundle's K (no schedule: no summary)."""
    bundle = _exported / "bundle"
    meta = json.loads((bundle / "bundle.json").read_text())
    assert any(entry.get("acceptance") for entry in meta["drafters"].values())
    for name, entry in meta["drafters"].items():
        spec = json.loads((bundle / "vllm" / name / "speculative_config.json").read_text())
        k = entry.get("fixed_k") or meta["decoding"]["k"]
        if entry.get("acceptance"):
            ranges = spec.pop("num_speculative_tokens_per_batch_size")
            vllm_export.check_schedule(ranges, spec["num_speculative_tokens"])
            k = vllm_export.schedule_tokens(ranges)
        assert spec == {"method": "draft_model", "model": str((bundle / "drafters" / name).resolve()),
                        "num_speculative_tokens": k}
    assert "num_speculative_tokens_per_batch_size" not in (bundle / "vllm" / "eagle-ofa" / "speculative_config.json").read_text()


def test_export_paths_points_a_copied_eagle3_export_at_itself(_exported, tmp_path):
    """After a copy, `specdraft export-paths` points the eagle3 speculative config at the copy's vllm/<name>/
    and the speculators config's verifier at the copy's target/; the bundle still verifies."""
    from specdraft.decoding.bundle.directory import load_bundle

    moved = tmp_path / "copy" / "bundle"
    shutil.copytree(_exported / "bundle", moved)
    changed = vllm_export.point_at(moved)
    assert "vllm/eagle-ofa/speculative_config.json" in changed and "vllm/eagle-ofa/config.json" in changed
    d = moved.resolve() / "vllm" / "eagle-ofa"
    spec = json.loads((d / "speculative_config.json").read_text())
    assert spec["model"] == str(d) and spec["method"] == "eagle3"
    verifier = json.loads((d / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"]
    assert verifier == str(moved.resolve() / "target") and (moved / "target" / "config.json").is_file()
    assert not any(str((_exported / "bundle").resolve()) in p.read_text() for p in (moved / "vllm").rglob("*.json"))
    load_bundle(moved)
    assert vllm_export.point_at(moved) == []
