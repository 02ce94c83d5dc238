"""Property-based damage (hypothesis): random byte-level damage to a config file, a stage manifest or
a bundle.json gives either a valid object or one InputError line, never another exception or a hang."""
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from specdraft.decoding.bundle.directory import BUNDLE_JSON, load_bundle
from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import MANIFEST, StageOutput, read_manifest
from specdraft.pipelines.config import load_config
from specdraft.pipelines.schema import RunConfig
from tests.decoding.test_bundle import template  # noqa: F401  (the hand-built bundle fixture)
from tests.readers.fuzz import damage, edits  # the byte damage every reader's property tests share

REPO = Path(__file__).resolve().parents[2]
DEMO = (REPO / "configs" / "demo.yaml").read_bytes()
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
                    derandomize=True)

def assert_one_line(e: InputError) -> None:
    assert str(e) and "\n" not in str(e)


@PROPERTY
@given(ops=edits)
def test_damaged_config_is_valid_or_one_line(tmp_path, ops):
    path = tmp_path / "c.yaml"
    path.write_bytes(damage(DEMO, ops))
    try:
        load_config(RunConfig, path)
    except InputError as e:
        assert_one_line(e)


@pytest.fixture(scope="module")
def finished_stage(tmp_path_factory) -> Path:
    final = tmp_path_factory.mktemp("manifest") / "stage"
    with StageOutput(final) as out:
        (out.tmp / "a.txt").write_text("a")
        out.commit(stage="prepare-data", config={"run": {"seed": 0}}, cache_key="k", inputs={},
                   metrics={"n": 1}, wall_time_s=0.1)
    return final


@PROPERTY
@given(ops=edits)
def test_damaged_manifest_is_valid_or_one_line(finished_stage, tmp_path, ops):
    copy = tmp_path / "stage"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(finished_stage, copy)
    (copy / MANIFEST).write_bytes(damage((finished_stage / MANIFEST).read_bytes(), ops))
    try:
        read_manifest(copy, expect_stage="prepare-data")
    except InputError as e:
        assert_one_line(e)


@PROPERTY
@given(ops=edits)
def test_damaged_bundle_json_is_valid_or_one_line(template, tmp_path, ops):  # noqa: F811
    copy = tmp_path / "bundle"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(template, copy)
    (copy / BUNDLE_JSON).write_bytes(damage((template / BUNDLE_JSON).read_bytes(), ops))
    try:
        load_bundle(copy)
    except InputError as e:
        assert_one_line(e)


def test_the_damage_strategy_can_break_json(finished_stage):
    """Power check: the edits do produce invalid manifests (else the properties above test nothing)."""
    raw = (finished_stage / MANIFEST).read_bytes()
    broken = damage(raw, [("truncate", 0.5, b"x")])
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)
