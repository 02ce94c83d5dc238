"""Stage teacher-data on a tiny run with a 3-layer target: it stores the target's top-k and EAGLE-3's features over
the distilled rows (and the prompt world's reference answers as extra rows), sharded and resumable like
distill-data, and train-drafters then trains the fkl drafters and the EAGLE-3 drafter from it without the target."""
import dataclasses
import json

import pytest

from specdraft.core.errors import InputError
from specdraft.decoding.speculators.eagle_model import read_eagle_config, vllm_layers
from specdraft.pipelines import teacher_data
from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.readers import load_distill_data, load_teacher_data
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import fresh_copy, run_template, tiny_config
from tests.pipelines.test_eagle3_stage import TARGET3
from tests.pipelines.test_eagle_stage import EAGLE, FAST

EAGLE3 = dict(EAGLE["eagle"], variant="eagle3", ttt_steps=2, drafters=["ofa"], draft_vocab=200, eval_every_n_steps=2)
STORED = {"top_k": 8, "chunk_size": 5, "extra": ["reference"], "extra_per_domain": 4}


def _sections(eagle=EAGLE3, loss="fkl", stored=STORED) -> dict:
    drafters = dataclasses.asdict(tiny_config("unused").train_drafters)
    drafters["eagle"] = eagle
    drafters["finetune"]["loss"] = loss
    return dict(**FAST, train_drafters=drafters, pretrain_target=TARGET3, teacher_data=stored)


def _config(root, eagle=EAGLE3, loss="fkl", stored=STORED, **sections):
    return tiny_config(root, **_sections(eagle, loss, stored), **sections)


@pytest.fixture(scope="module")
def _distilled(tmp_path_factory):
    return run_template(tmp_path_factory, "teacher_run", None, ("prepare-data", "pretrain-target", "distill-data"),
                        **_sections())


@pytest.fixture(scope="module")
def _stored(_distilled, tmp_path_factory):
    return run_template(tmp_path_factory, "stored", _distilled, ("teacher-data",), **_sections())


def test_the_stage_stores_topk_and_features_of_every_row_and_reference_answers(_stored):
    stored = load_teacher_data(_stored / "teacher_data")
    distill = load_distill_data(_stored / "distill_data")
    fmt = stored.format
    assert fmt.top_k == 8 and fmt.feature_layers == tuple(vllm_layers(3)) and fmt.max_length == 64
    assert fmt.hidden_dtype == "bfloat16" and fmt.feature_width == 3 * 64
    train = stored.splits["train"]
    assert sorted(r for r, s in zip(train["id"], train["source"]) if s == "distilled") == sorted(distill["train"]["id"])
    assert sorted(stored.splits["dev"]["id"]) == sorted(distill["dev"]["id"])
    refs = [r for r in train if r["source"] == "reference"]
    assert len(refs) == 8 and {r["domain"] for r in refs} == {"math", "translate"}  # 4 per domain
    assert all(r["id"] == f"reference:{r['prompt_id']}" for r in refs)
    metrics = read_manifest(_stored / "teacher_data").metrics
    assert {k: v["rows"] for k, v in metrics["rows"]["train"].items()} == {"distilled": len(distill["train"]),
                                                                          "reference": 8}
    assert metrics["tokens"] == sum(v["tokens"] for split in metrics["rows"].values() for v in split.values())
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for s in stored.splits.values() for r in s)
    assert metrics["tokens"] == tokens and metrics["bytes"] > tokens * 3 * 64 * 2  # bf16 features at every token
    assert sum(len(b) for s in stored.splits.values() for b in s["features"]) == tokens * 3 * 64 * 2


def test_train_drafters_trains_from_the_stored_signal_without_the_target(_stored, tmp_path, capsys):
    root = fresh_copy(_stored, tmp_path)
    run_stage(_config(root), "train-drafters")
    out = capsys.readouterr().out
    assert "ofa: finetuning on" in out and "from the target's stored signal" in out
    assert "EAGLE drafter on" in out and "no stored target signal" not in out
    train = load_teacher_data(root / "teacher_data").splits["train"]
    meta = read_eagle_config(root / "drafters" / "eagle" / "eagle-ofa")
    assert meta["examples"] == len(train)  # distilled and reference rows
    assert [p["step"] for p in meta["dev_curve"]] == [2, 3] and 0 <= meta["dev_curve"][-1]["agreement"] <= 1
    ofa = json.loads((root / "drafters" / "ofa" / "drafter.json").read_text())
    assert ofa["finetune"]["examples"] == len(train) and ofa["loss"] == "fkl"
    manifest = read_manifest(root / "drafters")
    assert "teacher-data" in manifest.inputs
    assert manifest.metrics["eagle"]["drafters"]["eagle-ofa"]["dev_curve"] == meta["dev_curve"]


def test_shards_split_the_chunks_and_a_killed_run_redoes_only_its_unfinished_chunk(_distilled, _stored, tmp_path,
                                                                                monkeypatch):
    root = fresh_copy(_distilled, tmp_path)
    cfg = _config(root)
    calls, killed = [], []
    real = teacher_data.score_rows

    def dies_on_the_third(*args, **kwargs):
        calls.append(len(args[1]))
        if len(calls) == 3 and not killed:
            killed.append(True)
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(teacher_data, "score_rows", dies_on_the_third)
    monkeypatch.setenv("SPECDRAFT_SHARD", "0/2")
    with pytest.raises(RuntimeError, match="killed"):
        run_stage(cfg, "teacher-data")
    work = next((root / ".work").glob("teacher_data-*"))
    done = sorted(p.name for p in (work / "chunks").iterdir() if p.is_dir() and ".tmp" not in p.name)
    assert len(done) == 2  # shard 0's first two chunks, whole
    calls.clear()
    assert run_stage(cfg, "teacher-data") is None  # shard 0 finishes; shard 1's chunks remain
    resumed = len(calls)
    monkeypatch.setenv("SPECDRAFT_SHARD", "1/2")
    assert run_stage(cfg, "teacher-data") is not None  # the last shard merges
    names = [c for chunks in json.loads((root / "teacher_data" / "info.json").read_text())["chunks"].values()
             for c in chunks]
    assert resumed == len(names[0::2]) - 2 and len(calls) == len(names) - 2  # nothing scored twice
    ours, ref = load_teacher_data(root / "teacher_data"), load_teacher_data(_stored / "teacher_data")
    for split in ref.splits:
        assert ours.splits[split].to_dict() == ref.splits[split].to_dict(), split  # the bytes of one process


def test_the_stage_is_skipped_where_no_training_reads_it(_distilled, tmp_path, capsys):
    root = fresh_copy(_distilled, tmp_path)
    off = _config(root, eagle=dict(EAGLE3, enabled=False), loss="ce", stored={"extra": []})
    assert run_stage(off, "teacher-data") is None
    assert "no drafter's training reads it" in capsys.readouterr().out
    assert run_stage(_config(root, stored={"enabled": False}), "teacher-data") is None
    assert "teacher_data.enabled is false" in capsys.readouterr().out


def test_readers_at_two_lengths_and_a_stale_signal_are_refused(_stored, tmp_path):
    with pytest.raises(InputError, match="max_length .* differ"):
        _config(tmp_path, eagle=dict(EAGLE3, max_length=32))
    root = fresh_copy(_stored, tmp_path)
    info = root / "teacher_data" / "info.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "distill_data": "0" * 64}))
    with pytest.raises(InputError, match="another distill-data output"):
        run_stage(_config(root, run={"root": str(root), "verify_inputs": "off"}), "train-drafters")
