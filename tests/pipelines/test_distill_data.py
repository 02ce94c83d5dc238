import os
import subprocess
import sys

import pytest
import yaml

import specdraft.pipelines.distill_data as dd
from specdraft.core.errors import InputError
from specdraft.data.prompts import fit_prompt
from specdraft.pipelines.readers import load_distill_data
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import tiny_config


def _rows(root):
    ds = load_distill_data(root / "distill_data")
    return {s: [(r["id"], tuple(r["response_ids"]), r["finish_reason"]) for r in ds[s]] for s in ds}


def test_every_prompt_at_every_temperature_once(tiny_run):
    cfg = tiny_config(tiny_run)
    out = run_stage(cfg, "distill-data")
    ds = load_distill_data(out)
    assert len(ds["train"]) == 2 * 6 * 2 and len(ds["dev"]) == 2 * 3 * 2
    ids = list(ds["train"]["id"])
    assert len(set(ids)) == len(ids)
    for r in ds["train"]:
        assert 1 <= len(r["response_ids"]) <= 8
        assert (r["finish_reason"] == "eos") == (r["response_ids"][-1] == 2)
        assert r["prompt_ids"][0] == 1  # BOS


def test_kill_midway_then_resume_is_exactly_once_and_identical(tiny_run, tmp_path, monkeypatch):
    reference_root = tmp_path / "ref"
    import shutil

    shutil.copytree(tiny_run, reference_root)
    run_stage(tiny_config(reference_root), "distill-data")

    cfg = tiny_config(tiny_run)
    real_run_chunk, calls = dd.run_chunk, {"n": 0}

    def dies_on_third_chunk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # killed in the middle of a chunk
        return real_run_chunk(*args, **kwargs)

    monkeypatch.setattr(dd, "run_chunk", dies_on_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        run_stage(cfg, "distill-data")
    assert not (tiny_run / "distill_data").exists()
    work = next((tiny_run / ".work").glob("distill_data-*"))
    assert len(list((work / "chunks").glob("*.json"))) == 2  # finished chunks survive the kill
    monkeypatch.setattr(dd, "run_chunk", real_run_chunk)
    run_stage(cfg, "distill-data")
    assert _rows(tiny_run) == _rows(reference_root)


@pytest.mark.slow  # two interpreters load the target (~45 s); the processes-started-here test below proves the same split
def test_two_processes_share_the_work(tiny_run):
    cfg_file = tiny_run / "cfg.yaml"
    cfg = tiny_config(tiny_run)
    from specdraft.pipelines.config import to_dict

    cfg_file.write_text(yaml.safe_dump(to_dict(cfg)))
    procs = [subprocess.Popen([sys.executable, "-m", "specdraft.pipelines.distill_data", "--config", str(cfg_file)],
                              env={**os.environ, "SPECDRAFT_SHARD": f"{i}/2"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    if not (tiny_run / "distill_data").exists():  # both finished together; a rerun merges
        run_stage(cfg, "distill-data")
    rows = _rows(tiny_run)
    assert len(rows["train"]) == 24 and len({r[0] for r in rows["train"]}) == 24
    assert any("shard 0/2" in o for o in outs) and any("shard 1/2" in o for o in outs)


def test_processes_started_here_write_the_rows_of_one_process(tiny_run, tmp_path, capsys):
    """distill_data.processes = 2: this process starts `distill-data --shard 1/2` beside its own share, waits for
    it and merges: the rows of one process (each batch is seeded by its chunk, not by who runs it), the work dir
    committed away."""
    import shutil

    reference_root = tmp_path / "ref"
    shutil.copytree(tiny_run, reference_root)
    run_stage(tiny_config(reference_root), "distill-data")
    run_stage(tiny_config(tiny_run, distill_data={"processes": 2}), "distill-data")
    printed = capsys.readouterr().out
    assert "2 processes share the work" in printed and "shard 0/2" in printed
    assert _rows(tiny_run) == _rows(reference_root)
    assert not list((tiny_run / ".work").glob("distill_data-*"))


def test_processes_are_refused_where_they_cannot_mean_one_thing(tmp_path):
    with pytest.raises(InputError, match="distill_data.processes must be >= 1, got 0"):
        tiny_config(tmp_path, distill_data={"processes": 0}).distill_data.check()
    with pytest.raises(InputError, match="one vLLM server per process"):
        tiny_config(tmp_path, distill_data={"processes": 2, "backend": "vllm"}).distill_data.check()


def test_long_prompts_truncate_or_refuse():
    ids = [1] + list(range(10, 30))
    kept, dropped = fit_prompt(ids, 8, "truncate", "x")
    assert kept == [1] + list(range(23, 30)) and dropped == 13
    with pytest.raises(InputError, match="prompt p7 has 21 tokens > distill_data.max_prompt_tokens=8"):
        fit_prompt(ids, 8, "refuse", "p7")


@pytest.mark.parametrize("quantization", ["int8", "nf4"])
def test_quantized_target_generates(tiny_run, quantization):
    pytest.importorskip("bitsandbytes")
    cfg = tiny_config(tiny_run, target={"quantization": quantization}, distill_data={"splits": ["dev"]})
    out = run_stage(cfg, "distill-data")
    assert len(load_distill_data(out)["dev"]) == 12


def test_exactly_one_shard_claims_the_merge(tmp_path):
    from specdraft.pipelines.shards import claim_merge as _claim_merge

    assert [_claim_merge(tmp_path, s) for s in (1, 0, 2)] == [True, False, False]
    assert not _claim_merge(tmp_path / "removed-by-the-commit", 0)  # the merging shard already committed
