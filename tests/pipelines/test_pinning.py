"""A user's target is pinned in every dependent cache key: a local dir by its files' content hash, a
hub id by the commit its revision resolves to."""
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import HashCache, read_manifest
from specdraft.pipelines.pinning import pin_target
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import tiny_config


def test_new_weights_at_the_same_path_rebuild_distill_data(tiny_run, tmp_path):
    target = tmp_path / "my-target"
    shutil.copytree(tiny_run / "target", target)
    cfg = tiny_config(tiny_run, target={"name_or_path": str(target)}, distill_data={"temperatures": [0.0]})
    out = run_stage(cfg, "distill-data")
    recorded = read_manifest(out).inputs["target"]
    assert recorded["path"] == str(target.resolve()) and len(recorded["content_hash"]) == 64
    logs = []
    assert run_stage(cfg, "distill-data", log=logs.append) == out and "cache hit" in logs[-1]
    model = AutoModelForCausalLM.from_pretrained(target)
    with torch.no_grad():
        model.lm_head.weight.add_(0.5)
    model.save_pretrained(target)  # same path, new weights
    logs = []
    run_stage(cfg, "distill-data", log=logs.append)
    assert any("rebuilding" in m for m in logs)
    assert read_manifest(out).inputs["target"]["content_hash"] != recorded["content_hash"]


def _fake_hub_cache(root, repo, commit, files):
    """The layout huggingface_hub's cache uses: refs/<branch> -> commit, snapshots/<commit>/files."""
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)
    return snap


def test_hub_id_pins_the_cached_commit(tmp_path, monkeypatch):
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path / "hub"))
    commit = "a" * 40
    snap = _fake_hub_cache(tmp_path / "hub", "org/model", commit, {"config.json": "{}"})
    pin = pin_target("org/model", None, HashCache(None))
    assert pin.load_path == str(snap) and pin.record == {"path": "org/model", "revision": commit, "content_hash": commit}
    assert pin_target("org/model", commit, HashCache(None)).record["revision"] == commit
    with pytest.raises(InputError, match="cannot resolve hub target 'org/other'"):
        pin_target("org/other", None, HashCache(None))  # offline in tests: not cached is one line


def test_revision_on_a_local_dir_is_refused(tmp_path):
    with pytest.raises(InputError, match="target.revision is for hub ids"):
        pin_target(str(tmp_path), "main", HashCache(None))
