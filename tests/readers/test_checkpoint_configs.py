"""The configs beside saved weights: acceptance heads (head_config.json) and routers (router_config.json),
both read through decoding/checkpoint.py's CheckpointFormat, and EAGLE drafters (eagle_config.json).
A saved one loads back; damaged bytes, missing and wrong-typed keys are refused with one line naming the
fix, never built into a module of another shape."""
import json
import shutil

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specdraft.core.errors import InputError
from specdraft.decoding.policies.acceptance_head import CONFIG_NAME, AcceptanceHead, load_head, save_head
from specdraft.decoding.speculators.eagle_model import EAGLE_CONFIG, EagleDrafter, load_eagle, save_eagle
from specdraft.routers.router import CONFIG_NAME as ROUTER_CONFIG
from specdraft.routers.router import CentroidRouter, PromptClassifierRouter, load_router, save_router
from tests.decoding.eagle_fixtures import tiny_target
from tests.readers.fuzz import TRIED, check_refusal, damage, edits, fewer, json_values

EMBED = torch.randn(32, 8)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One saved directory of each kind, built once."""
    root = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    return {"head": save_head(AcceptanceHead(8, depth=2), root / "head", {"drafter": "d", "w_rej": 6.0, "threshold": 0.7}),
            "classifier": save_router(PromptClassifierRouter(8, ["a", "b"], 4), root / "classifier"),
            "centroid": save_router(CentroidRouter(8, ["math", "code"], ["a", "b"]), root / "centroid"),
            "eagle": save_eagle(EagleDrafter(tiny_target("llama", 0).config), root / "eagle")}


CONFIG = {"head": CONFIG_NAME, "classifier": ROUTER_CONFIG, "centroid": ROUTER_CONFIG, "eagle": EAGLE_CONFIG}
LOAD = {"head": lambda d: load_head(d)[0], "classifier": lambda d: load_router(d, EMBED),
        "centroid": lambda d: load_router(d, EMBED), "eagle": load_eagle}
READER = {"head": "head config", "classifier": "router config", "centroid": "router config", "eagle": "EAGLE config"}
# the architecture keys each reads; a missing or wrong one must be refused
KEYS = {"head": ["hidden_size", "depth", "tie_blocks", "format"],
        "classifier": ["kind", "embed_dim", "drafters", "hidden", "format"],
        "centroid": ["kind", "embed_dim", "drafters", "domains", "domain_drafters", "format"],
        "eagle": ["format", "n_layers", "target_config"]}


def with_config(saved, tmp_path, kind, data: bytes):
    d = tmp_path / kind
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(saved[kind], d)
    (d / CONFIG[kind]).write_bytes(data)
    return d


def other_valid(kind, key, value, config) -> bool:
    """Other names, as many, where names are free: a different valid module, not damage."""
    if not (isinstance(value, list) and isinstance(config[key], list) and all(isinstance(v, str) for v in value)
            and len(value) == len(config[key])):
        return False
    distinct = len(set(value)) == len(value)
    return ((key == "drafters" and kind == "classifier" and distinct) or (key == "domains" and distinct)
            or (key == "domain_drafters" and sorted(set(value)) == config["drafters"]))


@pytest.mark.parametrize("kind", sorted(CONFIG))
@fewer(2)  # an EAGLE load builds its decoder layer
@given(ops=edits)
def test_damaged_configs_load_or_are_refused(saved, tmp_path, kind, ops):
    TRIED[READER[kind]] += 1
    d = with_config(saved, tmp_path, kind, damage((saved[kind] / CONFIG[kind]).read_bytes(), ops))
    try:
        module = LOAD[kind](d)
    except InputError as e:
        check_refusal(e)
    else:  # the only shape its weights fit
        assert getattr(module, "hidden_size", None) == 8 or getattr(module, "embed_dim", None) == 8 or kind == "eagle"


@pytest.mark.parametrize("kind", sorted(CONFIG))
@given(data=st.data(), value=json_values, drop=st.booleans())
def test_missing_and_wrong_keys_are_refused(saved, tmp_path, kind, data, value, drop):
    TRIED[READER[kind]] += 1
    config = json.loads((saved[kind] / CONFIG[kind]).read_text())
    key = data.draw(st.sampled_from(KEYS[kind]))
    if drop:
        del config[key]
    elif (value == config[key] and type(value) is type(config[key])) or other_valid(kind, key, value, config):
        return
    else:
        config[key] = value
    d = with_config(saved, tmp_path, kind, json.dumps(config).encode())
    with pytest.raises(InputError) as e:
        LOAD[kind](d)
    check_refusal(e.value)
