"""Every input verified, every failure one line.

Damaged inputs (a flipped byte in a drafter, a truncated Arrow file, a malformed manifest, duplicate
YAML keys, an empty config) stop a stage before it does any work, with one line and exit code 2; a
second writer of the same stage output is refused; a process killed in the middle of replacing a
finished directory never loses it. The kill -9 / SIGTERM schedules over whole stages are in
test_fault_injection.py.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import (MANIFEST, HashCache, StageLock, StageOutput, load_dataset_dir, read_manifest,
                                 tidy_stage_dir, verify_files)
from specdraft.pipelines.cli import main
from specdraft.pipelines.config import ConfigError, load_yaml
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import FAST, tiny_config


# --------------------------------------------------------------------------- config files


def test_duplicate_yaml_keys_are_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("run:\n  root: a\n  seed: 1\nrun:\n  root: b\n")
    with pytest.raises(ConfigError, match=r"'run' is given twice \(lines 1 and 4\)"):
        load_yaml(path)
    path.write_text("run:\n  seed: 1\n  seed: 2\n")
    with pytest.raises(ConfigError, match="'seed' is given twice"):
        load_yaml(path)


@pytest.mark.parametrize("text", ["", "   \n\n", "\t\n"])
def test_empty_config_is_refused_with_its_own_message(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="is empty"):
        load_yaml(path)


def test_config_that_is_not_a_mapping_or_not_text(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping at the top level, got list"):
        load_yaml(path)
    path.write_bytes(b"run:\n  root: \xff\xfe\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_yaml(path)
    with pytest.raises(ConfigError, match="is a directory"):
        load_yaml(tmp_path)


def test_cli_prints_one_line_and_exits_2_for_a_duplicate_key(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("run: {}\nrun: {}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specdraft: error:") and "given twice" in err[0]


# --------------------------------------------------------------------------- manifests


def _finished(tmp_path: Path) -> Path:
    final = tmp_path / "stage"
    with StageOutput(final) as out:
        (out.tmp / "a.txt").write_text("a")
        out.commit(stage="prepare-data", config={}, cache_key="k", inputs={}, metrics={}, wall_time_s=0.1)
    return final


@pytest.mark.parametrize("damage, message", [
    (lambda m: m.pop("files"), "missing 'files'"),
    (lambda m: m.update(extra=1), "unknown 'extra'"),
    (lambda m: m.update(files=["a.txt"]), "field 'files' has the wrong type"),
    (lambda m: m.update(wall_time_s="1"), "field 'wall_time_s' has the wrong type"),
    (lambda m: m.update(format_version=True), "field 'format_version' has the wrong type"),
    (lambda m: m.update(files={"../x": "0" * 64}), "bad file entry"),
    (lambda m: m.update(files={"a.txt": 3}), "bad file entry"),
    (lambda m: m.update(inputs={"x": [1]}), "input 'x' is malformed"),
    (lambda m: m.update(format_version=99), "manifest format 99"),
])
def test_manifest_schema_violations_are_one_line(tmp_path, damage, message):
    final = _finished(tmp_path)
    data = json.loads((final / MANIFEST).read_text())
    damage(data)
    (final / MANIFEST).write_text(json.dumps(data))
    with pytest.raises(InputError, match=message) as e:
        read_manifest(final)
    assert "\n" not in str(e.value)


def test_manifest_that_is_not_an_object_or_truncated(tmp_path):
    final = _finished(tmp_path)
    text = (final / MANIFEST).read_text()
    (final / MANIFEST).write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match="damaged"):
        read_manifest(final)
    (final / MANIFEST).write_text("[1, 2]")
    with pytest.raises(InputError, match="not a manifest"):
        read_manifest(final)


def test_hash_cache_rehashes_only_changed_files(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(b"x" * 100)
    cache = HashCache(tmp_path / "cache.json")
    first = cache.sha256(f)
    cache.save()
    cache2 = HashCache(tmp_path / "cache.json")
    key = str(f.resolve())
    cache2.entries[key][2] = "poisoned"  # an unchanged file is served from the cache...
    assert cache2.sha256(f) == "poisoned"
    f.write_bytes(b"y" * 100)  # ...and a changed one (new mtime) is hashed again
    os.utime(f, ns=(1, 1))
    assert cache2.sha256(f) not in ("poisoned", first)


# --------------------------------------------------------------------------- damaged stage inputs


def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_byte_in_a_drafter_stops_the_next_stage_before_any_work(drafted_run):
    cfg = tiny_config(drafted_run, **FAST)
    weights = next((drafted_run / "drafters").glob("*/model.safetensors"))
    _flip_byte(weights)
    with pytest.raises(InputError) as e:
        run_stage(cfg, "acceptance-data")
    msg = str(e.value)
    assert weights.name in msg and weights.parent.name in msg and "train-drafters" in msg and "\n" not in msg
    assert not (drafted_run / "acceptance_data").exists()
    assert not list(drafted_run.glob(".tmp-acceptance_data-*"))


def test_truncated_arrow_file_is_one_line_with_and_without_hash_checks(drafted_run):
    arrow = sorted((drafted_run / "distill_data").rglob("*.arrow"))[0]
    arrow.write_bytes(arrow.read_bytes()[:64])
    cfg = tiny_config(drafted_run, **FAST)
    with pytest.raises(InputError, match="distill-data"):
        run_stage(cfg, "acceptance-data")
    # with hashing off, the reader itself turns the damage into one line
    with pytest.raises(InputError, match=r"not a readable dataset .*rerun stage 'distill-data'"):
        load_dataset_dir(drafted_run / "distill_data" / "data", "distill-data")
    cfg_off = tiny_config(drafted_run, run={"root": str(drafted_run), "verify_inputs": "off"}, **FAST)
    with pytest.raises(InputError, match="distill-data"):
        run_stage(cfg_off, "acceptance-data")


def test_verification_mode_is_recorded_in_the_manifest(tiny_run):
    cfg = tiny_config(tiny_run, run={"root": str(tiny_run), "verify_inputs": "full"})
    run_stage(cfg, "distill-data")
    inputs = read_manifest(tiny_run / "distill_data").inputs
    assert {v["verified"] for v in inputs.values()} == {"full"}


def test_cli_exit_2_and_one_line_for_a_tampered_input(tiny_run, tmp_path, capsys):
    cfg_path = tmp_path / "c.yaml"
    from specdraft.pipelines.config import to_dict

    cfg_path.write_text(yaml.safe_dump(to_dict(tiny_config(tiny_run))))
    tok = next((tiny_run / "target").glob("tokenizer*.json"))
    _flip_byte(tok)
    assert main(["distill-data", "--config", str(cfg_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pretrain-target" in err[0] and tok.name in err[0]


def test_unclassified_failure_is_one_line_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    import specdraft.pipelines.cli as cli

    def boom(args):
        raise RuntimeError("kaput\nsecond line")

    monkeypatch.setattr(cli, "_validate", boom)
    path = tmp_path / "c.yaml"
    path.write_text("run: {}\n")
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error: RuntimeError: kaput" in err[0] and "--debug" in err[0]
    with pytest.raises(RuntimeError):
        main(["validate", str(path), "--debug"])


# --------------------------------------------------------------------------- one writer, no lost output


def test_second_writer_is_refused_naming_the_holder(tiny_run):
    cfg = tiny_config(tiny_run)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = tiny_run / ".locks" / "distill_data.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text(json.dumps({"host": os.uname().nodename, "pid": holder.pid, "since": "then"}))
        with pytest.raises(InputError, match=f"already running \\(pid {holder.pid} on"):
            run_stage(cfg, "distill-data")
        assert not (tiny_run / "distill_data").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its lock is stale and taken over
    assert run_stage(cfg, "distill-data") == tiny_run / "distill_data"
    assert not lock.exists()


def test_lock_of_another_host_is_reported_not_broken(tmp_path):
    lock_path = tmp_path / ".locks" / "x.lock"
    lock_path.parent.mkdir(parents=True)
    lock_path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "since": "then"}))
    with pytest.raises(InputError, match="pid 1 on elsewhere"):
        with StageLock(tmp_path, "x"):
            pass
    assert lock_path.exists()


def test_kill_between_the_two_renames_never_loses_the_finished_directory(tmp_path):
    final = _finished(tmp_path)
    before = read_manifest(final).files
    old = tmp_path / ".old-stage-deadbeef"
    os.replace(final, old)  # what commit() does first; a kill here leaves no `final`
    tidy_stage_dir(final)
    assert read_manifest(final).files == before and not old.exists()
    verify_files(final)
