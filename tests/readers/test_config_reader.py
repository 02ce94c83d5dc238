"""Config YAML and dotted overrides (pipelines/config.py, the one reader of both): generated valid values
round-trip through a file and through overrides; damaged files and overrides, wrong types, unknown keys and
contradictory values are refused with one ConfigError line naming the file (or the override) and the fix."""
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from specdraft.core.errors import InputError
from specdraft.pipelines.config import ConfigError, load_config, to_dict
from specdraft.pipelines.schema import RunConfig
from tests.readers.fuzz import TRIED, check_refusal, damage, edits, fewer, json_values
from tests.readers.test_bundle_reader import decoding_sections

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo.yaml"

# values a user sets often, each with the values it may take
VALID = {
    "run.seed": st.integers(0, 2**31),
    "run.root": st.text("abc/_-", min_size=1, max_size=10).filter(lambda s: s.strip("/")),
    "evaluate.ks": st.lists(st.integers(1, 20), min_size=1, max_size=4),
    "evaluate.k": st.one_of(st.none(), st.integers(1, 20)),
    "evaluate.repeats": st.integers(1, 2),  # demo.yaml sets repeats 1 (repeats_max: = repeats)
    "distill_data.temperatures": st.lists(st.floats(0, 2), min_size=1, max_size=3),
    "distill_data.top_p": st.floats(0.01, 1.0),
    "train_heads.thresholds": st.lists(st.floats(0.01, 0.99), min_size=1, max_size=3),
    "decoding": decoding_sections(),
}


def get(cfg, dotted):
    node = to_dict(cfg)
    for part in dotted.split("."):
        node = node[part]
    return node


@fewer(4)
@given(values=st.fixed_dictionaries({}, optional=VALID), via=st.sampled_from(["file", "overrides"]))
def test_valid_values_round_trip_through_a_file_and_through_overrides(tmp_path, values, via):
    TRIED["config yaml + overrides"] += 1
    path = tmp_path / "c.yaml"
    if via == "file":
        data: dict = {"base": str(DEMO)}
        for dotted, v in values.items():
            node = data
            *parents, last = dotted.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = v
        path.write_text(yaml.safe_dump(data))
        cfg = load_config(RunConfig, path)
    else:
        path.write_text(DEMO.read_text())
        cfg = load_config(RunConfig, path, [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                                            for k, v in values.items()])
    for dotted, v in values.items():
        assert get(cfg, dotted) == v, dotted
    # what a stage's manifest records reads back to the same config
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    assert load_config(RunConfig, path) == cfg


@given(ops=edits)
def test_damaged_files_load_or_name_the_file(tmp_path, ops):
    TRIED["config yaml + overrides"] += 1
    path = tmp_path / "c.yaml"
    path.write_bytes(damage(DEMO.read_bytes(), ops))
    try:
        load_config(RunConfig, path)
    except InputError as e:
        assert isinstance(e, ConfigError)
        check_refusal(e, path)


override_text = st.text(st.sampled_from(list("run.sedxk=[]{}:,'\"- 0123\\n\t!&*|>%@`#")), max_size=16)


@given(items=st.lists(override_text, min_size=1, max_size=3))
def test_any_override_text_is_applied_or_refused_in_one_line(tmp_path, items):
    TRIED["config yaml + overrides"] += 1
    try:
        load_config(RunConfig, None, items)
    except InputError as e:
        assert isinstance(e, ConfigError)
        check_refusal(e)


# each must be refused: a wrong type, an unknown key, a value out of range, or values that contradict
REFUSED = [
    ("run.seed", json_values.filter(lambda v: isinstance(v, bool) or not isinstance(v, int))),
    ("run.verify_inputs", st.text(max_size=5).filter(lambda v: v not in ("cached", "full", "off"))),
    ("evaluate.ks", st.one_of(st.just([]), st.lists(st.integers(-3, 0), min_size=1, max_size=2))),
    ("evaluate.repeats_max", st.integers(-3, 0)),  # below repeats (1): contradictory
    ("distill_data.top_p", st.one_of(st.floats(max_value=0), st.floats(min_value=1.001, allow_infinity=False))),
    ("train_heads.thresholds", st.lists(st.one_of(st.floats(max_value=0), st.floats(min_value=1, allow_infinity=False)), min_size=1, max_size=2)),
    ("decoding.k", st.integers(21, 10**4)),  # above k_max (20): contradictory
    ("decoding.k_max", st.integers(1, 3)),  # below k (4)
    ("decoding.threshold", st.one_of(st.floats(max_value=0), st.floats(min_value=1))),
    ("decoding.selector", st.text("xyz", max_size=4)),
    ("decoding.draft_weights", st.sampled_from(["int4", "bf16", "none"])),
    ("pretrain_target.seq_len", st.integers(10**5, 10**6)),  # above model.max_positions
    ("evaluate.nope", st.integers()),
    ("nope", st.integers()),
]


@fewer(2)
@given(case=st.sampled_from(REFUSED), data=st.data(), via=st.sampled_from(["file", "overrides"]))
def test_wrong_and_contradictory_values_are_refused(tmp_path, case, data, via):
    TRIED["config yaml + overrides"] += 1
    dotted, values = case
    value = data.draw(values, label=dotted)
    path = tmp_path / "c.yaml"
    text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
    if via == "file":
        *parents, last = dotted.split(".")
        node = data_ = {"base": str(DEMO)}
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        path.write_text(yaml.safe_dump(data_))
        overrides = []
    else:
        path.write_text(DEMO.read_text())
        overrides = [f"{dotted}={text}"]
    with pytest.raises(ConfigError) as e:
        load_config(RunConfig, path, overrides)
    check_refusal(e.value, path)


@pytest.mark.parametrize("override, says", [
    ("run.seed=[", "override 'run.seed=[': the value is not valid YAML"),
    ("run..seed=1", "has an empty key"),
    ("evaluate={a: 1, a: 2}", "given twice"),
])
def test_override_damage_names_the_override(override, says):
    with pytest.raises(ConfigError, match=says.replace("[", r"\[")) as e:
        load_config(RunConfig, None, [override])
    check_refusal(e.value)
