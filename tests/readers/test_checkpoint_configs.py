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
from tests.readers.fuzz import TRIED, check_refusal, damage, edits, fewer, json_values


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


# ---- router configs (router_config.json, heads/router.py load_router through the same CheckpointFormat) ----

from specdraft.heads.router import CONFIG_NAME as ROUTER_CONFIG  # noqa: E402
from specdraft.heads.router import CentroidRouter, PromptClassifierRouter, load_router, save_router  # noqa: E402

EMBED = torch.randn(32, 8)


@pytest.fixture(scope="module")
def routers(tmp_path_factory):
    root = tmp_path_factory.mktemp("routers")
    return {"classifier": save_router(PromptClassifierRouter(8, ["a", "b"], 4), root / "classifier"),
            "centroid": save_router(CentroidRouter(8, ["math", "code"], ["a", "b"]), root / "centroid")}


@given(kind=st.sampled_from(["classifier", "centroid"]), ops=edits)
def test_damaged_router_configs_load_or_are_refused(routers, tmp_path, kind, ops):
    TRIED["router config"] += 1
    d = _copy(routers[kind], tmp_path)
    (d / ROUTER_CONFIG).write_bytes(damage((routers[kind] / ROUTER_CONFIG).read_bytes(), ops))
    try:
        router = load_router(d, EMBED)
    except InputError as e:
        check_refusal(e)
    else:
        assert router.kind == kind and router.embed_dim == 8


@given(kind=st.sampled_from(["classifier", "centroid"]), data=st.data(), value=json_values, drop=st.booleans())
def test_wrong_router_keys_are_refused(routers, tmp_path, kind, data, value, drop):
    TRIED["router config"] += 1
    d = _copy(routers[kind], tmp_path)
    config = json.loads((routers[kind] / ROUTER_CONFIG).read_text())
    keys = {"classifier": ["kind", "embed_dim", "drafters", "hidden", "format"],
            "centroid": ["kind", "embed_dim", "drafters", "domains", "domain_drafters", "format"]}[kind]
    key = data.draw(st.sampled_from(keys))
    if drop:
        del config[key]
    elif value == config[key] and type(value) is type(config[key]):
        return
    elif isinstance(value, list) and all(isinstance(v, str) for v in value) and len(value) == len(config.get(key) or []) \
            and ((key == "drafters" and kind == "classifier" and len(set(value)) == len(value))
                 or (key == "domains" and len(set(value)) == len(value))
                 or (key == "domain_drafters" and sorted(set(value)) == config["drafters"])):
        return  # other names, as many: a different valid router, not damage
    else:
        config[key] = value
    (d / ROUTER_CONFIG).write_text(json.dumps(config))
    with pytest.raises(InputError) as e:
        load_router(d, EMBED)
    check_refusal(e.value)


# ---- EAGLE drafter configs (eagle_config.json, decoding/speculators/eagle_model.py read_eagle_config) --------

from specdraft.decoding.speculators.eagle_model import EAGLE_CONFIG, EagleDrafter, load_eagle, save_eagle  # noqa: E402
from tests.decoding.eagle_fixtures import tiny_target  # noqa: E402


@pytest.fixture(scope="module")
def eagle_dir(tmp_path_factory):
    target = tiny_target("llama", 0)
    return save_eagle(EagleDrafter(target.config), tmp_path_factory.mktemp("eagle") / "e")


@fewer(2)  # each load builds the drafter's layer
@given(ops=edits)
def test_damaged_eagle_configs_load_or_are_refused(eagle_dir, tmp_path, ops):
    TRIED["EAGLE config"] += 1
    d = _copy(eagle_dir, tmp_path)
    (d / EAGLE_CONFIG).write_bytes(damage((eagle_dir / EAGLE_CONFIG).read_bytes(), ops))
    try:
        drafter = load_eagle(d)
    except InputError as e:
        check_refusal(e)
    else:
        assert drafter.config.hidden_size == 32


@fewer(2)
@given(key=st.sampled_from(["format", "n_layers", "variant", "target_config"]), value=json_values, drop=st.booleans())
def test_wrong_eagle_keys_are_refused(eagle_dir, tmp_path, key, value, drop):
    TRIED["EAGLE config"] += 1
    d = _copy(eagle_dir, tmp_path)
    config = json.loads((eagle_dir / EAGLE_CONFIG).read_text())
    if drop and key != "variant":  # no variant: an EAGLE-1 drafter from before EAGLE-3, as this one is
        del config[key]
    elif value == config[key] and type(value) is type(config[key]):
        return
    else:
        config[key] = value
    (d / EAGLE_CONFIG).write_text(json.dumps(config))
    with pytest.raises(InputError) as e:
        load_eagle(d)
    check_refusal(e.value)
