"""bundle.json (decoding/bundle/schema.py BundleSpec, the one reader of it): generated decoding sections
round-trip; wrong types, missing and extra keys, out-of-range and contradictory values are refused with
one line naming bundle.json and the fix, by every reader (from_json, load_bundle, inspect-bundle,
generate) and before anything is written."""
import copy
import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdraft.core.errors import InputError
from specdraft.decoding.bundle.directory import BUNDLE_JSON, load_bundle
from specdraft.decoding.bundle.schema import BundleSpec
from specdraft.pipelines.cli import main
from tests.decoding.test_bundle import template  # noqa: F401  (the hand-built bundle fixture)
from tests.readers.fuzz import TRIED, check_refusal, damage, edits, json_values


def meta_of(root) -> dict:
    return json.loads((root / BUNDLE_JSON).read_text())


@st.composite
def decoding_sections(draw):
    k_max = draw(st.integers(1, 64))
    return {"temperature": draw(st.sampled_from([0.0, 0.5, 1.0, 2])), "top_k": draw(st.integers(0, 50)),
            "top_p": draw(st.floats(0.01, 1.0)), "k": draw(st.integers(1, k_max)), "k_max": k_max,
            "threshold": draw(st.one_of(st.none(), st.floats(0.01, 0.99))),
            "cost_ratio": draw(st.floats(0, 10)), "selector": draw(st.sampled_from(["ucb", "exp3", "ucbspec"])),
            "max_new_tokens": draw(st.integers(1, 4096)), "drafts": draw(st.integers(1, 8)),
            "cascade": draw(st.sampled_from([None, {"rule": "token", "alpha": 0.3}, {"rule": "opt", "alpha": 1}])),
            "compile": draw(st.sampled_from(["none", "default", "reduce-overhead"])),
            "draft_weights": draw(st.sampled_from(["auto", "int8", "dtype"]))}


@given(section=decoding_sections())
def test_valid_decoding_sections_round_trip(template, section):  # noqa: F811
    TRIED["bundle.json"] += 1
    meta = meta_of(template)
    meta["decoding"] = section
    spec = BundleSpec.from_json(meta, template)
    assert {k: getattr(spec.decoding, k) for k in section} == section
    assert spec.to_json(template) == meta


def _set(path):
    def edit(meta, value):
        node = meta
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    return edit


def _drop(path):
    def edit(meta, _):
        node = meta
        for p in path[:-1]:
            node = node[p]
        del node[path[-1]]
    return edit


HEAD = ("heads", "d", "D1_w6")
# (name, edit, values that must be refused): each a value alone, or a relation between values
DAMAGE = [
    ("k above k_max", _set(("decoding", "k")), st.integers(21, 10**6)),
    ("k_max below k", _set(("decoding", "k_max")), st.integers(1, 3)),
    ("k not a count", _set(("decoding", "k")), st.one_of(st.integers(-5, 0), st.booleans(), st.floats(), st.text())),
    ("threshold out of (0, 1)", _set(("decoding", "threshold")),
     st.one_of(st.floats(max_value=0), st.floats(min_value=1, allow_infinity=False))),
    ("negative cost ratio", _set(("decoding", "cost_ratio")), st.floats(max_value=-1e-9, allow_infinity=False)),
    ("top_p out of (0, 1]", _set(("decoding", "top_p")), st.one_of(st.floats(max_value=0), st.floats(min_value=1.0001, allow_infinity=False))),
    ("negative temperature", _set(("decoding", "temperature")), st.floats(max_value=-1e-9, allow_infinity=False)),
    ("unknown selector", _set(("decoding", "selector")), st.text(max_size=6).filter(
        lambda s: s not in ("ucb", "exp3", "sh", "ucbspec", "exp3spec", "fixed", "random", "oracle", "one-pass-oracle"))),
    ("bad cascade", _set(("decoding", "cascade")), st.one_of(st.just({"rule": "nope", "alpha": 1}),
                                                                st.just({"rule": "token", "alpha": "0.3"}),
                                                                st.just({"rule": "token"}), st.lists(st.integers(), min_size=1))),
    ("wrong type anywhere in decoding", lambda meta, kv: meta["decoding"].__setitem__(*kv),
     st.tuples(st.sampled_from(["k", "k_max", "top_k", "max_new_tokens", "drafts"]),
               json_values.filter(lambda v: not (isinstance(v, int) and not isinstance(v, bool) and v >= 1)))),
    ("missing decoding key", lambda meta, key: meta["decoding"].pop(key),
     st.sampled_from(["temperature", "top_k", "top_p", "k", "k_max", "selector", "max_new_tokens", "cost_ratio"])),
    ("extra key", lambda meta, where: (meta if where == "" else meta[where]).__setitem__("kk", 1),
     st.sampled_from(["", "decoding", "target"])),
    ("head of a drafter the bundle lacks", lambda meta, name: meta["heads"].__setitem__(
        name, {**meta["heads"]["d"]}), st.text("xyz", min_size=1, max_size=3)),
    ("head's drafter field disagrees", _set((*HEAD, "drafter")), st.text("xyz", min_size=1, max_size=3)),
    ("drafter's default head missing", _set(("drafters", "d", "head")), st.text("xyz", min_size=1, max_size=3)),
    ("head threshold out of (0, 1)", _set((*HEAD, "threshold")), st.one_of(st.floats(max_value=0), st.floats(min_value=1, allow_infinity=False))),
    ("head w_rej not positive", _set((*HEAD, "w_rej")), st.floats(max_value=0, allow_infinity=False)),
    ("head label transform broken", _set((*HEAD, "label_transform")),
     st.one_of(st.just({}), st.just({"temperature": -1, "top_k": 0, "top_p": 1.0}),
               st.just({"temperature": 1.0, "top_k": 0, "top_p": 0}))),
    ("fixed K above k_max", _set(("drafters", "d", "fixed_k")), st.one_of(st.integers(21, 1000), st.integers(-3, 0))),
    ("drafter sizes not positive", lambda meta, kv: meta["drafters"]["d"].__setitem__(*kv),
     st.tuples(st.sampled_from(["parameters", "hidden_size", "vocab_size"]), st.integers(-3, 0))),
    ("missing target", _drop(("target",)), st.none()),
    ("wrong JSON type for a section", lambda meta, kv: meta.__setitem__(*kv),
     st.tuples(st.sampled_from(["target", "drafters", "heads", "decoding", "routers", "files"]),
               st.one_of(st.none(), st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2)))),
]


@given(case=st.sampled_from(DAMAGE), data=st.data())
def test_wrong_and_contradictory_values_are_refused(template, case, data):  # noqa: F811
    TRIED["bundle.json"] += 1
    name, edit, values = case
    meta = copy.deepcopy(meta_of(template))
    edit(meta, data.draw(values, label=name))
    with pytest.raises(InputError) as e:
        BundleSpec.from_json(meta, template)
    check_refusal(e.value, BUNDLE_JSON)


@given(ops=edits)
def test_damaged_bytes_load_or_are_refused(template, tmp_path, ops):  # noqa: F811
    TRIED["bundle.json"] += 1
    root = tmp_path / "b"
    if not root.exists():
        shutil.copytree(template, root)
    (root / BUNDLE_JSON).write_bytes(damage((template / BUNDLE_JSON).read_bytes(), ops))
    try:
        load_bundle(root, verify=False)
    except InputError as e:
        check_refusal(e)


# ---- the named bug: a K above K_max in bundle.json, refused by every reader of it ---------------------------


@pytest.mark.parametrize("k, k_max", [(21, 20), (5, 4), (64, 1)])
def test_generate_refuses_a_bundle_whose_k_exceeds_k_max(template, tmp_path, capsys, k, k_max):  # noqa: F811
    root = tmp_path / "bundle"
    shutil.copytree(template, root)
    meta = meta_of(root)
    meta["decoding"].update(k=k, k_max=k_max)
    (root / BUNDLE_JSON).write_text(json.dumps(meta))  # bundle.json lists no hash of itself: a hand edit
    out = tmp_path / "out.jsonl"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n')
    for argv in (["generate", str(root), "--prompt", "w1", "--output", str(out)],
                 ["generate", str(root), "--prompts", str(prompts), "--output", str(out), "--k", "2"],
                 ["inspect-bundle", str(root)]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("specdraft: error:") and "\n" not in err, err
        assert f"bundle.json: decoding.k ({k}) exceeds its k_max ({k_max})" in err and "re-export" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "p.jsonl"]  # nothing written
    with pytest.raises(InputError, match="exceeds"):
        load_bundle(root, verify=False)
