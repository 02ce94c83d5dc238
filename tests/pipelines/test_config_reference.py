"""The config reference is generated from the schema and stays in step with it; the shipped configs list
only what they change."""
import dataclasses
from pathlib import Path

import pytest
import yaml

from specdraft.pipelines.cli import main
from specdraft.pipelines.config import from_dict, load_config, load_yaml, to_dict
from specdraft.pipelines.config_reference import defaults_reference, field_docs, iter_fields
from specdraft.pipelines.schema import RunConfig

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "configs").glob("*.yaml"))


def test_every_field_is_documented_beside_its_definition():
    keys = list(iter_fields(RunConfig))
    assert len(keys) > 150  # nested sections and list items (drafters, label_transforms) are walked
    undocumented = [key for key, cls, name in keys if not field_docs(cls).get(name)]
    assert undocumented == []


def test_field_docs_reads_the_comment_beside_and_above_a_field():
    @dataclasses.dataclass
    class Section:
        # two lines
        # above
        a: int = 1  # and beside
        b: str = "x"
        c: list = dataclasses.field(default_factory=list)  # only beside

    assert field_docs(Section) == {"a": "two lines above and beside", "b": "", "c": "only beside"}


def test_config_defaults_prints_a_reference_that_loads_back_to_the_defaults(capsys):
    assert main(["config", "--defaults"]) == 0
    text = capsys.readouterr().out
    assert text == defaults_reference(RunConfig)
    assert to_dict(from_dict(RunConfig, yaml.safe_load(text))) == to_dict(RunConfig())
    assert "  # local HF dir or hub id; null: the demo target from pretrain-target\n" in text
    assert "  name_or_path: null  # str | null\n" in text
    assert "    # name (str): the drafter's directory name" in text  # a list of sections documents its items


def _leaves(data: dict, section: dict, prefix: str = ""):
    """(dotted key, resolved value, default value) for every leaf a YAML file sets."""
    for key, value in data.items():
        if isinstance(value, dict) and isinstance(section["resolved"].get(key), dict) \
                and isinstance(section["default"].get(key), dict) \
                and key not in ("max_sequences", "device_map", "cascade"):  # a section null by default: one leaf
            sub = {"resolved": section["resolved"][key], "default": section["default"][key]}
            yield from _leaves(value, sub, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", section["resolved"][key], section["default"][key]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_list_only_what_differs_from_the_defaults(path):
    """...or, for a config with `base: OTHER.yaml`, only what differs from OTHER."""
    data = load_yaml(path)
    base = data.pop("base", None)
    resolved = to_dict(load_config(RunConfig, path))
    default = to_dict(load_config(RunConfig, path.parent / base) if base else RunConfig())
    same = [key for key, got, want in _leaves(data, {"resolved": resolved, "default": default}) if got == want]
    assert same == [], f"{path.name} sets keys to the values it starts from: {same}"
