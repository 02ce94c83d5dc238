import json

import pytest

import specdraft.pipelines.prepare_data as prepare_data
from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import read_manifest, verify_files
from specdraft.pipelines.config import from_dict
from specdraft.pipelines.schema import RunConfig
from specdraft.pipelines.stage import run_stage

TINY_DEMO = {"domains": ["math", "translate"], "heldout_domains": ["spell"], "corpus_per_domain": 8,
             "train_per_domain": 4, "dev_per_domain": 2, "test_per_domain": 2}


def tiny_cfg(root, **demo):
    return from_dict(RunConfig, {"run": {"root": str(root)}, "demo": {**TINY_DEMO, **demo}})


def test_manifest_fields_and_cache_hit(tmp_path):
    cfg = tiny_cfg(tmp_path)
    logs = []
    out = run_stage(cfg, "prepare-data", log=logs.append)
    m = read_manifest(out, expect_stage="prepare-data")
    for key in ("stage", "config", "inputs", "package_version", "git_commit", "metrics", "wall_time_s", "content_hash"):
        assert key in json.loads((out / "manifest.json").read_text())
    assert m.config["demo"]["train_per_domain"] == 4 and m.metrics["prompts"]["train"]["math"] == 4
    # the stage's CPU seconds beside its wall time: building the world is work, so more than nothing
    assert 0 < m.cpu_time_s and "CPU s)" in logs[-1]
    verify_files(out)
    # a manifest written before cpu_time_s was recorded still reads (and is still a cache hit)
    data = json.loads((out / "manifest.json").read_text())
    del data["cpu_time_s"]
    (out / "manifest.json").write_text(json.dumps(data))
    assert read_manifest(out).cpu_time_s is None
    stamp = (out / "manifest.json").stat().st_mtime_ns
    run_stage(cfg, "prepare-data", log=logs.append)
    assert "cache hit" in logs[-1] and (out / "manifest.json").stat().st_mtime_ns == stamp
    run_stage(cfg, "prepare-data", force=True, log=logs.append)
    assert (out / "manifest.json").stat().st_mtime_ns != stamp
    run_stage(tiny_cfg(tmp_path, train_per_domain=5), "prepare-data", log=logs.append)
    assert "rebuilding" in logs[-2]
    assert read_manifest(out).metrics["prompts"]["train"]["math"] == 5


def test_interrupted_stage_leaves_nothing_finished(tmp_path, monkeypatch):
    cfg = tiny_cfg(tmp_path)

    def boom(*a, **k):
        raise RuntimeError("killed midway")

    monkeypatch.setattr(prepare_data, "demo_corpus", boom)
    with pytest.raises(RuntimeError):
        run_stage(cfg, "prepare-data")
    assert not (tmp_path / "prompts").exists()
    assert not list(tmp_path.glob(".tmp-*"))
    monkeypatch.undo()
    out = run_stage(cfg, "prepare-data")
    verify_files(out)


def test_missing_and_corrupt_inputs(tmp_path):
    cfg = tiny_cfg(tmp_path)
    with pytest.raises(InputError, match="stage 'prepare-data' has not finished; run `specdraft prepare-data"):
        run_stage(cfg, "pretrain-target")
    out = run_stage(cfg, "prepare-data")
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="corrupt"):
        run_stage(cfg, "pretrain-target")


def test_verify_files_catches_a_flipped_byte(tmp_path):
    out = run_stage(tiny_cfg(tmp_path), "prepare-data")
    victim = next(p for p in sorted(out.rglob("*.arrow")))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(InputError, match="does not match its hash"):
        verify_files(out)


def test_logging_settings_do_not_invalidate_the_cache(tmp_path):
    from specdraft.pipelines.stage import _cache_key, get_spec

    spec = get_spec("pretrain-target")
    a = from_dict(RunConfig, {"run": {"root": str(tmp_path)}})
    b = from_dict(RunConfig, {"run": {"root": str(tmp_path)},
                              "pretrain_target": {"train": {"wandb": {"mode": "online"}, "log_every_n_steps": 1}}})
    c = from_dict(RunConfig, {"run": {"root": str(tmp_path)}, "pretrain_target": {"train": {"max_steps": 7}}})
    assert _cache_key(a, spec, {}) == _cache_key(b, spec, {}) != _cache_key(c, spec, {})


def test_slurm_context_names_job_array_task_rank_and_restart(monkeypatch):
    from specdraft.pipelines.stage import slurm_context

    for k in ("SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "RANK", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(k, raising=False)
    assert slurm_context() is None
    for k, v in dict(SLURM_JOB_ID="12", SLURM_ARRAY_JOB_ID="11", SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_COUNT="3",
                     SLURM_NTASKS="2", SLURM_PROCID="1", SLURMD_NODENAME="n2", SLURM_RESTART_COUNT="1").items():
        monkeypatch.setenv(k, v)
    assert slurm_context() == "slurm job 12, array task 11_1 of 3, rank 1 of 2, node n2, restart 1 (requeued)"
