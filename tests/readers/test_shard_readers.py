"""Shard specs (--shard, SPECDRAFT_SHARD, Slurm array and torchrun variables) and the finished pieces a
merge reads back (distill-data chunk files, evaluate unit files; pipelines/shards.py read_piece): valid
ones round-trip, damaged ones are refused with one line naming the variable or file and the fix."""
import json
import shutil

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


# ---- evaluate unit files, read back by the merge (pipelines/evaluate/units.py read_back) ------------------

from tests.pipelines.test_evaluate_plan import MODES, env, prompts  # noqa: E402,F401  (tiny models, a small plan)


@pytest.fixture(scope="module")
def unit_store(env, tmp_path_factory):  # noqa: F811
    from specdraft.pipelines.evaluate.plan import build_plan
    from specdraft.pipelines.evaluate.run import execute
    from specdraft.pipelines.evaluate.units import run_units, units

    plan = [r for r in build_plan(env, prompts()) if r.key.family in ("ar", "fixed")]
    store = tmp_path_factory.mktemp("units")
    pieces = units(plan)
    run_units(pieces, store, lambda runs: execute(runs, env.target, 4, MODES, None, "cpu", 1, progress=False),
              lambda: {"target": {}, "drafters": {}, "passes": 0})
    return plan, pieces, store


def _read_back_copy(unit_store, tmp_path, edit):
    from specdraft.pipelines.evaluate.units import read_back

    plan, pieces, store = unit_store
    copy = tmp_path / "units"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(store, copy)
    target = pieces[0].path(copy)
    edit(target)
    return target, (lambda: read_back(plan, pieces, copy))


@given(ops=edits)
def test_damaged_unit_files_read_back_or_are_refused(unit_store, tmp_path, ops):
    TRIED["distill chunk + evaluate unit files"] += 1
    path, read = _read_back_copy(unit_store, tmp_path, lambda p: p.write_bytes(damage(p.read_bytes(), ops)))
    try:
        records, samples = read()
    except InputError as e:
        check_refusal(e, path)
    else:
        assert len(samples) == len(unit_store[1])


@given(where=st.sampled_from(["unit", "records", "calibration", "record key", "record metrics", "record field"]),
       value=json_values)
def test_wrong_unit_contents_are_refused(unit_store, tmp_path, where, value):
    TRIED["distill chunk + evaluate unit files"] += 1

    def edit(p):
        stored = json.loads(p.read_text())
        if where in ("unit", "records", "calibration"):
            if where == "unit" and value == stored["unit"] or where == "calibration" and isinstance(value, dict):
                stored[where] = 0  # keep it wrong: another unit's name is refused too, a mapping is valid
            else:
                stored[where] = value if value != stored[where] else 0
        elif where == "record key":
            stored["records"][0]["key"] = {"family": "nope"} if isinstance(value, dict) else value
        elif where == "record metrics":
            stored["records"][0]["metrics"] = {**stored["records"][0]["metrics"], "nope": value}
        else:
            del stored["records"][0]["times"]
        p.write_text(json.dumps(stored))

    path, read = _read_back_copy(unit_store, tmp_path, edit)
    with pytest.raises(InputError) as e:
        read()
    check_refusal(e.value, path)
