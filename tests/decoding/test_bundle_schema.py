"""decoding/bundle/schema.py: bundle.json read through the dataclasses refuses every missing, unknown or
mistyped field and every escaping path with one line that names the field (the hand-built bundle of
test_bundle.py; the round trip of an exported bundle is in tests/pipelines/test_export.py)."""
import json
import shutil

import pytest

from specdraft.core.errors import InputError
from specdraft.decoding.bundle.directory import BUNDLE_JSON, load_bundle, write_bundle
from specdraft.decoding.bundle.schema import BundleSpec
from tests.decoding.test_bundle import template  # noqa: F401  (the hand-built bundle fixture)


def _drafter(m):
    return m["drafters"]["d"]


def _head(m):
    return m["heads"]["d"]["D1_w6"]


EDITS = {  # edit of bundle.json -> what the one-line error must say
    "missing": (lambda m: _drafter(m).pop("parameters"), "drafters['d'] lacks 'parameters'"),
    "unknown": (lambda m: _head(m).update(colour="red"), "heads['d']['D1_w6'] has unknown field 'colour'"),
    "unknown top-level": (lambda m: m.update(extras={}), "the bundle has unknown field 'extras'"),
    "str for int": (lambda m: _drafter(m).update(parameters="many"), "drafters['d'].parameters is 'many' (str), not an integer"),
    "bool for int": (lambda m: m["decoding"].update(k=True), "decoding.k is 'True' (bool), not an integer"),
    "str for float": (lambda m: _head(m).update(w_rej="6"), "heads['d']['D1_w6'].w_rej is '6' (str), not a number"),
    "list for object": (lambda m: m.update(decoding=[]), "decoding lacks 'temperature'"),
    "bad list item": (lambda m: _drafter(m).update(domains=["math", 3]), "drafters['d'].domains[1] is '3' (int), not a string"),
    "escaping path": (lambda m: _head(m).update(path="../x"), "heads['d']['D1_w6'].path path '../x' is absolute or leaves the bundle"),
    "both targets": (lambda m: m["target"].update(reference="org/model"), "exactly one of 'path'"),
    # a bundle from before the decoding defaults carried the measured cost ratio
    "no cost ratio": (lambda m: m["decoding"].pop("cost_ratio"), "decoding lacks 'cost_ratio'"),
    "null cost ratio": (lambda m: m["decoding"].update(cost_ratio=None), "decoding has no cost_ratio"),
    "unknown compile mode": (lambda m: m["decoding"].update(compile="max"), "decoding.compile is 'max' (str), not one of"),
    "impossible K": (lambda m: m["decoding"].update(k=0), "bundle.json: decoding.k must be an integer >= 1"),
    "str for fixed K": (lambda m: _drafter(m).update(fixed_k="3"), "drafters['d'].fixed_k is '3' (str), not an integer"),
}


@pytest.mark.parametrize("edit", EDITS)
def test_malformed_fields_are_named_in_one_line(template, tmp_path, edit):  # noqa: F811
    root = tmp_path / "bundle"
    shutil.copytree(template, root)
    meta = json.loads((root / BUNDLE_JSON).read_text())
    change, message = EDITS[edit]
    change(meta)
    (root / BUNDLE_JSON).write_text(json.dumps(meta))
    with pytest.raises(InputError) as e:
        load_bundle(root)
    assert message in str(e.value) and "\n" not in str(e.value) and "re-export" in str(e.value)


def test_read_write_read_is_stable(template, tmp_path):  # noqa: F811
    """Defaults filled in on reading (content hashes, drafts) are written back and read unchanged."""
    root = tmp_path / "bundle"
    shutil.copytree(template, root)
    first = load_bundle(root).spec
    write_bundle(root, first)
    again = BundleSpec.from_json(json.loads((root / BUNDLE_JSON).read_text()), root)
    assert again == load_bundle(root).spec == first
    assert again.drafters["d"].path == (root / "drafters" / "d").resolve() and again.decoding.drafts == 1
