"""The JSON a stage reads from another's output beside the weights: drafter.json (train-drafters, read by
acceptance-data and train-router) and an acceptance-data set's info.json (read by train-heads), through
pipelines/readers.py. Valid ones round-trip; damaged or wrong ones are one line naming the file and the
stage to rerun (a KeyError deep in a stage's work otherwise, when verify_inputs is off)."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdraft.core.errors import InputError
from specdraft.pipelines.readers import read_acceptance_info, read_drafter_info
from tests.readers.fuzz import TRIED, check_refusal, damage, edits, json_values

names = st.lists(st.text("abcxyz", min_size=1, max_size=5), max_size=3)
drafter_infos = st.fixed_dictionaries({"name": st.text("abc", min_size=1, max_size=4), "domains": names,
                                       "parameters": st.integers(1, 10**9), "phase": st.sampled_from(["general", "finetune"])})
acceptance_infos = st.fixed_dictionaries({
    "drafter": st.just("d"), "drafter_hash": st.text("0123456789abcdef", min_size=8, max_size=16),
    "hidden_size": st.integers(1, 8192), "max_length": st.integers(2, 4096),
    "label_transform": st.fixed_dictionaries({"temperature": st.sampled_from([0.0, 0.7, 1.0]), "top_k": st.integers(0, 50),
                                              "top_p": st.floats(0.05, 1.0)}),
    "transform_tag": st.just("T1"), "counts": st.just({})})


def write(tmp_path, kind, data: bytes):
    d = tmp_path / "d" / "T1" if kind == "acceptance" else tmp_path / "d"
    d.mkdir(parents=True, exist_ok=True)
    (d / ("info.json" if kind == "acceptance" else "drafter.json")).write_bytes(data)
    return d


READ = {"drafter": read_drafter_info, "acceptance": read_acceptance_info}
READER = {"drafter": "drafter.json", "acceptance": "acceptance-data info.json"}


@pytest.mark.parametrize("kind", sorted(READ))
@given(data=st.data(), ops=st.one_of(st.none(), edits))
def test_infos_round_trip_or_their_damage_is_refused(tmp_path, kind, data, ops):
    TRIED[READER[kind]] += 1
    info = data.draw(drafter_infos if kind == "drafter" else acceptance_infos)
    raw = json.dumps(info).encode()
    d = write(tmp_path, kind, raw if ops is None else damage(raw, ops))
    try:
        got = READ[kind](d)
    except InputError as e:
        assert ops is not None, e  # only damage is refused
        check_refusal(e, "info.json" if kind == "acceptance" else "drafter.json")
    else:
        if ops is None:
            assert got == info


KEYS = {"drafter": ["domains", "parameters"],
        "acceptance": ["drafter", "drafter_hash", "hidden_size", "max_length", "label_transform"]}


@pytest.mark.parametrize("kind", sorted(READ))
@given(data=st.data(), value=json_values, drop=st.booleans())
def test_missing_and_wrong_keys_are_refused(tmp_path, kind, data, value, drop):
    TRIED[READER[kind]] += 1
    info = data.draw(drafter_infos if kind == "drafter" else acceptance_infos)
    key = data.draw(st.sampled_from(KEYS[kind]))
    if drop:
        del info[key]
    elif key == "domains" and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return  # other domains: a different valid drafter
    elif key == "drafter_hash" and isinstance(value, str) and value:
        return  # another hash: checked against the drafter's files by the heads, not here
    elif key in ("hidden_size", "max_length", "parameters") and isinstance(value, int) and not isinstance(value, bool) \
            and value >= 1:
        return  # another size: a different valid value
    else:
        info[key] = value
    d = write(tmp_path, kind, json.dumps(info).encode())
    with pytest.raises(InputError) as e:
        READ[kind](d)
    check_refusal(e.value)
