"""Shard specs (--shard, SPECDRAFT_SHARD, Slurm array and torchrun variables) and the finished pieces a
merge reads back (distill-data chunk files, evaluate unit files; pipelines/shards.py read_piece): valid
ones round-trip, damaged ones are refused with one line naming the variable or file and the fix."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdraft.core.errors import InputError
from specdraft.pipelines.distill_data import check_chunk
from specdraft.pipelines.shards import parse_shard, read_piece, shard_from_env
from tests.readers.fuzz import TRIED, check_refusal, damage, edits, json_values

VARS = ("SPECDRAFT_SHARD", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN", "RANK", "WORLD_SIZE")


@given(n=st.integers(1, 10**6), data=st.data())
def test_valid_shard_specs_round_trip(n, data):
    TRIED["shard specs"] += 1
    i = data.draw(st.integers(0, n - 1))
    assert parse_shard(f"{i}/{n}") == (i, n)


@given(text=st.text(st.sampled_from(list("0123456789/-+ _x.")), max_size=8))
def test_any_shard_text_parses_to_a_valid_share_or_is_refused(text):
    TRIED["shard specs"] += 1
    try:
        i, n = parse_shard(text, "--shard")
    except InputError as e:
        check_refusal(e)
        assert "--shard" in str(e) or "shard index" in str(e)
    else:
        assert 0 <= i < n


@given(env=st.dictionaries(st.sampled_from(VARS), st.one_of(st.integers(-3, 9).map(str), st.text("0123x/ ", max_size=4)),
                           max_size=4))
def test_any_shard_environment_gives_a_valid_share_or_one_line(monkeypatch, env):
    TRIED["shard specs"] += 1
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        i, n = shard_from_env()
    except InputError as e:
        check_refusal(e)
    else:
        assert 0 <= i < n


def rows(draw_ids):
    return [{"id": f"p{k}@t0", "prompt_id": f"p{k}", "domain": "math", "temperature": 0.0, "prompt_ids": ids,
             "response_ids": ids[::-1], "finish_reason": "eos", "prompt_truncated": 0} for k, ids in enumerate(draw_ids)]


chunks = st.lists(st.lists(st.integers(0, 50000), max_size=6), max_size=4).map(rows)


@given(chunk=chunks)
def test_valid_chunk_files_round_trip(tmp_path, chunk):
    TRIED["distill chunk + evaluate unit files"] += 1
    path = tmp_path / "c0.json"
    path.write_text(json.dumps(chunk))
    assert read_piece(path, "distill-data chunk", check_chunk) == chunk


@given(chunk=chunks.filter(bool), ops=edits)
def test_damaged_chunk_files_load_or_are_refused(tmp_path, chunk, ops):
    TRIED["distill chunk + evaluate unit files"] += 1
    path = tmp_path / "c0.json"
    path.write_bytes(damage(json.dumps(chunk).encode(), ops))
    try:
        got = read_piece(path, "distill-data chunk", check_chunk)
    except InputError as e:
        check_refusal(e, path)
    else:
        check_chunk(got)  # whatever loads has the shape the merge needs


@given(chunk=chunks.filter(bool), key=st.sampled_from(["prompt_ids", "response_ids", "id", "finish_reason"]),
       value=json_values, drop=st.booleans())
def test_wrong_rows_are_refused(tmp_path, chunk, key, value, drop):
    TRIED["distill chunk + evaluate unit files"] += 1
    if drop:
        del chunk[0][key]
    elif key.endswith("_ids"):
        if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            value = [value, "x"]  # keep it wrong
        chunk[0][key] = value
    else:
        return  # free-form fields: any JSON value is the writer's own
    path = tmp_path / "c0.json"
    path.write_text(json.dumps(chunk))
    with pytest.raises(InputError) as e:
        read_piece(path, "distill-data chunk", check_chunk)
    check_refusal(e.value, path)


def test_a_missing_piece_names_the_rerun(tmp_path):
    with pytest.raises(InputError, match="is missing"):
        read_piece(tmp_path / "unit-00000.json", "evaluate unit", lambda obj: None)
