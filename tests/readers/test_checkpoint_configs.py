"""Acceptance-head configs (head_config.json, read by decoding/bundle/checkpoint.py and load_head):
a saved head loads back; damaged bytes and wrong-typed architecture keys are refused with one line naming
the file and the stage to rerun, never built into a head of another shape."""
import json
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.core.errors import InputError
from specdraft.decoding.policies.acceptance_head import CONFIG_NAME, AcceptanceHead, load_head, save_head
from tests.readers.fuzz import TRIED, check_refusal, damage, edits, json_values


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    return save_head(AcceptanceHead(8, depth=2), tmp_path_factory.mktemp("head") / "h",
                     {"drafter": "d", "w_rej": 6.0, "threshold": 0.7})


def _copy(saved, tmp_path):
    d = tmp_path / "h"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(saved, d)
    return d


@given(ops=edits)
def test_damaged_head_configs_load_or_are_refused(saved, tmp_path, ops):
    TRIED["head config"] += 1
    d = _copy(saved, tmp_path)
    (d / CONFIG_NAME).write_bytes(damage((saved / CONFIG_NAME).read_bytes(), ops))
    try:
        head, config = load_head(d)
    except InputError as e:
        check_refusal(e, CONFIG_NAME)
    else:
        assert (head.hidden_size, head.depth) == (8, 2)  # the only architecture its weights fit


@given(key=st.sampled_from(["hidden_size", "depth", "tie_blocks", "format"]), value=json_values, drop=st.booleans())
def test_wrong_architecture_keys_are_refused(saved, tmp_path, key, value, drop):
    TRIED["head config"] += 1
    d = _copy(saved, tmp_path)
    config = json.loads((saved / CONFIG_NAME).read_text())
    if drop:
        del config[key]
    elif value == config[key] and type(value) is type(config[key]):
        return  # the same value: nothing damaged
    else:
        config[key] = value
    (d / CONFIG_NAME).write_text(json.dumps(config))
    with pytest.raises(InputError) as e:
        load_head(d)
    check_refusal(e.value)
