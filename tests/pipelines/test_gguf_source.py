"""GGUF models named by the config (`target.gguf`, `train_drafters.init_from`): a `<package>/<file>` stays inside its
package and a name both here and in a package is refused; a GGUF split over package files is assembled, hash-checked
and converted, and every bad part stops with one line that leaves no file behind; validating a config reads no file;
train-drafters starts its drafters from a GGUF sibling of the target and keeps it untouched as a drafter of its own,
which no later stage mistakes for a specialist or the all-domain drafter. The models are tiny GGUFs written here
(tests/pipelines/gguf_fixtures.py)."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.config import from_dict
from specdraft.pipelines.gguf_file import check_gguf, resolve_gguf
from specdraft.pipelines.schema import RunConfig
from specdraft.pipelines.stage import run_stage
from tests.pipelines.gguf_fixtures import package_parts, sha256, write_tiny_gguf

OFF = {"wandb": {"mode": "disabled"}}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target (2 layers, width 32) and its sibling (1 layer, width 16) sharing one tokenizer, a sibling
    with another tokenizer, each split into parts of a package on sys.path; -> {name: (parts, sha256, file)}."""
    base = tmp_path_factory.mktemp("pair")
    site = base / "site"
    files = {"target": write_tiny_gguf(base / "target.gguf", layers=2, hidden=32, seed=1),
             "sibling": write_tiny_gguf(base / "sibling.gguf", layers=1, hidden=16, seed=2),
             "stranger": write_tiny_gguf(base / "stranger.gguf", layers=1, hidden=16, seed=3, swap=True)}
    parts = {name: package_parts(path, site, f"tinypair_{name}", 3) for name, path in files.items()}
    import sys

    sys.path.insert(0, str(site))
    yield {name: (parts[name], sha256(path), path) for name, path in files.items()}
    sys.path.remove(str(site))


def pair_config(root, pair, **sections) -> RunConfig:
    parts, digest, _ = pair["target"]
    data = {"run": {"root": str(root)},
            "target": {"gguf": {"parts": parts, "sha256": digest}},
            "demo": {"domains": ["math", "translate"], "heldout_domains": ["spell"], "train_per_domain": 4,
                     "dev_per_domain": 2, "test_per_domain": 1},  # the demo world's prompts: built in a second
            "distill_data": {"temperatures": [0.0], "max_new_tokens": 6, "batch_size": 8, "chunk_size": 8},
            "train_drafters": {"general": {"enabled": False},
                               "finetune": {"lr": 1e-3, "max_length": 128,
                                            "train": {"max_epochs": 1, "batch_size": 4, **OFF}},
                               "alignment_batch_size": 8},
            "acceptance_data": {"max_sequences": {"train": 4, "dev": 2}, "batch_size": 8, "max_length": 128},
            "train_heads": {"depths": [0], "w_rejs": [6.0], "epochs": 1, "cost_ratio": 0.15, "lr": 1e-3}}
    for name, value in sections.items():
        data.setdefault(name, {}).update(value)
    return from_dict(RunConfig, data)


def left_behind(root) -> list[str]:
    """Every file under the run root but the stage runner's own bookkeeping (locks, the hash cache)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                  and p.parent.name != ".locks" and p.name != "hash-cache.json") if root.exists() else []


# --------------------------------------------------------------------------- naming a file


@pytest.fixture
def package(tmp_path, monkeypatch):
    """An installed package `pkg_gguf` holding data/model.gguf, and a working directory of its own."""
    site = tmp_path / "site"
    (site / "pkg_gguf" / "data").mkdir(parents=True)
    (site / "pkg_gguf" / "__init__.py").write_text("")
    (site / "pkg_gguf" / "data" / "model.gguf").write_bytes(b"GGUF in the package")
    monkeypatch.syspath_prepend(str(site))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    return site / "pkg_gguf"


def test_a_package_spec_stays_inside_its_package(package, tmp_path):
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(b"GGUF outside")
    assert resolve_gguf("pkg_gguf/data/model.gguf") == (package / "data" / "model.gguf").resolve()
    for spec in (f"pkg_gguf/{outside}", "pkg_gguf/../outside.gguf", "pkg_gguf/data/../../outside.gguf",
                 "pkg_gguf/./data/model.gguf"):
        with pytest.raises(InputError, match="leaves or skips around package 'pkg_gguf'"):
            resolve_gguf(spec)


def test_a_name_both_here_and_in_a_package_is_refused_and_dot_slash_means_here(package):
    (package.parent.parent / "here" / "pkg_gguf" / "data").mkdir(parents=True)
    local = package.parent.parent / "here" / "pkg_gguf" / "data" / "model.gguf"
    local.write_bytes(b"GGUF here")
    with pytest.raises(InputError, match=r"names two files: \./pkg_gguf/data/model\.gguf here and .* in package "
                                         r"'pkg_gguf'; write \./pkg_gguf/data/model\.gguf for the one here"):
        resolve_gguf("pkg_gguf/data/model.gguf")
    assert resolve_gguf("./pkg_gguf/data/model.gguf") == local.resolve()
    assert resolve_gguf(str(package / "data" / "model.gguf")) == (package / "data" / "model.gguf").resolve()


def test_any_failure_of_the_gguf_reader_is_one_line(tmp_path, monkeypatch):
    import gguf

    path = write_tiny_gguf(tmp_path / "m.gguf")

    def broken(*args, **kwargs):
        raise RuntimeError("a parser failure of a kind nobody listed")

    monkeypatch.setattr(gguf, "GGUFReader", broken)
    with pytest.raises(InputError, match="is damaged or truncated .*RuntimeError: a parser failure"):
        check_gguf(path, "the file")


def test_validating_a_config_reads_no_gguf_file(tmp_path, capsys):
    """A config naming a wheel that is not installed validates: only convert-target reads the file."""
    from specdraft.pipelines.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("target: {gguf: {file: no_such_wheel_pkg/model.gguf}}\n"
                   "train_drafters: {init_from: {parts: [no_such_part_pkg/p1.bin], sha256: '" + "0" * 64 + "'}}\n")
    assert main(["validate", str(cfg)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("given, words", [
    ({"file": "a.gguf", "parts": ["b"]}, "both file and parts"),
    ({}, "neither file nor parts"),
    ({"parts": ["a", "b"]}, "needs at least one part and target.gguf.sha256"),
    ({"parts": [], "sha256": "0" * 64}, "needs at least one part"),
    ({"file": "a.gguf", "sha256": "CC32"}, "is not a sha256"),
])
def test_a_gguf_source_of_the_wrong_shape_is_refused_by_the_schema(tmp_path, given, words):
    with pytest.raises(InputError, match=words):
        from_dict(RunConfig, {"run": {"root": str(tmp_path)}, "target": {"gguf": given}})


# --------------------------------------------------------------------------- parts, assembled


def test_split_parts_are_assembled_hash_checked_and_converted(pair, tmp_path):
    root = tmp_path / "run"
    out = run_stage(pair_config(root, pair), "convert-target")
    parts, digest, whole = pair["target"]
    manifest = read_manifest(out, expect_stage="convert-target")
    assert manifest.inputs["gguf"]["content_hash"] == digest
    assert json.loads(manifest.inputs["gguf"]["source"])["parts"] == parts
    assert manifest.metrics["layers"] == 2 and manifest.metrics["gguf_bytes"] == whole.stat().st_size
    assert manifest.metrics["reload_max_abs_diff"] == 0  # the reload's logits are the GGUF-loaded model's
    assert left_behind(root) == sorted([f"target/{f}" for f in manifest.files] + ["target/manifest.json"])
    # the same file named whole gives the same weights
    whole_root = tmp_path / "whole"
    run_stage(pair_config(whole_root, pair, target={"gguf": {"file": str(whole)}}), "convert-target")
    a, b = load_file(out / "model.safetensors"), load_file(whole_root / "target" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_converted_target_pinned_by_sha256_needs_no_file_again(pair, tmp_path):
    """The cache key holds the config's sha256, not the file's: with the part wheels gone, the run goes on."""
    root = tmp_path / "run"
    parts, digest, whole = pair["target"]
    local = [str(shutil.copy(resolve_gguf(p), tmp_path / f"p{i}.bin")) for i, p in enumerate(parts)]
    cfg = pair_config(root, pair, target={"gguf": {"parts": local, "sha256": digest}})
    run_stage(cfg, "convert-target")
    for p in local:
        os.remove(p)
    log = []
    assert run_stage(cfg, "convert-target", log=log.append) == root / "target"
    assert log == [f"[convert-target] cache hit: {root / 'target'} (use --force to redo)"]


def test_without_a_sha256_the_file_keys_the_conversion_and_its_absence_says_how_to_pin_it(pair, tmp_path):
    root = tmp_path / "run"
    local = shutil.copy(pair["target"][2], tmp_path / "model.gguf")
    cfg = pair_config(root, pair, target={"gguf": {"file": str(local)}})
    run_stage(cfg, "convert-target")
    os.remove(local)
    with pytest.raises(InputError, match=r"does not exist; .* \(or give target.gguf.sha256: a run then needs the "
                                         "file only to convert it\)"):
        run_stage(cfg, "convert-target")


def _cli(tmp_path, gguf: dict, capsys) -> tuple[int, list[str]]:
    """`specdraft run` (convert-target only) on a config naming `gguf` -> (exit code, its non-empty stderr lines)."""
    from specdraft.pipelines.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(json.dumps({"run": {"root": str(tmp_path / "run"), "stages": ["convert-target"]},
                               "target": {"gguf": gguf}}))
    capsys.readouterr()
    code = main(["run", str(cfg)])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("case", ["missing part", "first part not first", "parts swapped", "a part twice",
                                  "wrong hash", "truncated part", "file of another hash"])
def test_a_bad_part_stops_with_one_line_and_leaves_nothing(pair, tmp_path, capsys, case):
    parts, digest, whole = pair["target"]
    given = {"parts": list(parts), "sha256": digest}
    if case == "missing part":
        given["parts"][1] = parts[1].replace("part02", "part07")
        words = "holds no 'data/part07.bin'"
    elif case == "first part not first":
        given["parts"] = [parts[1], parts[0], parts[2]]
        words = "part02.bin' does not start as a GGUF file does .*; list the parts in order, the first one first"
    elif case == "parts swapped":
        given["parts"] = [parts[0], parts[2], parts[1]]
        words = "a part is missing, out of order, truncated or of another version"
    elif case == "a part twice":
        given["parts"] = [parts[0], parts[1], parts[1], parts[2]]
        words = "lists .*part02.bin more than once"
    elif case == "wrong hash":
        given["sha256"] = "0" * 64
        words = "hash to .*, not target.gguf.sha256 0000"
    elif case == "truncated part":
        cut = tmp_path / "part02.bin"
        cut.write_bytes(resolve_gguf(parts[1]).read_bytes()[:-100])
        given["parts"][1] = str(cut)
        words = f"the 3 parts of target.gguf \\({whole.stat().st_size - 100:,} bytes in all\\) hash to"
    else:
        given = {"file": str(whole), "sha256": "f" * 64}
        words = "hashes to .*, not target.gguf.sha256 ffff"
    code, err = _cli(tmp_path, given, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("specdraft: error:"), err
    assert __import__("re").search(words, err[0]), err[0]
    assert left_behind(tmp_path / "run") == []  # not a byte: no half-assembled GGUF in the work dir either


# --------------------------------------------------------------------------- the sibling as every drafter's start


@pytest.fixture(scope="module")
def distilled(pair, tmp_path_factory):
    """The tiny target converted from its parts, prompts, and its distilled answers."""
    root = tmp_path_factory.mktemp("sibling") / "run"
    cfg = pair_config(root, pair)
    for stage in ("convert-target", "prepare-data", "distill-data"):
        run_stage(cfg, stage)
    return root


def init_config(root, pair, name: str = "sibling", **sections) -> RunConfig:
    parts, digest, _ = pair[name]
    tcfg = {"init_from": {"parts": parts, "sha256": digest}, "init_drafter": "sibling", **sections}
    return pair_config(root, pair, train_drafters=tcfg)


def test_every_drafter_starts_from_the_gguf_sibling_kept_untouched_beside_them(pair, distilled, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(distilled, root)
    cfg = init_config(root, pair)
    out = run_stage(cfg, "train-drafters")
    names = ("math", "translate", "ofa", "sibling", "base")
    info = {n: json.loads((out / n / "drafter.json").read_text()) for n in names}
    assert info["sibling"]["domains"] == [] and info["sibling"]["phase"] == "init"
    sibling = load_file(out / "sibling" / "model.safetensors")
    assert json.loads((out / "math" / "config.json").read_text())["hidden_size"] == 16  # the sibling's, not model's
    assert all(torch.equal(sibling[k], t) for k, t in load_file(out / "base" / "model.safetensors").items())
    trained = load_file(out / "ofa" / "model.safetensors")
    assert trained.keys() == sibling.keys() and any(not torch.equal(trained[k], sibling[k]) for k in sibling)
    alignment = json.loads((out / "alignment.json").read_text())
    assert alignment["sibling"] == alignment["base"] and set(alignment["sibling"]) >= {"math", "translate"}
    # the later stages: the sibling gets acceptance data and heads of every domain, and the bundle serves it as
    # neither a specialist nor the all-domain drafter
    for stage in ("acceptance-data", "train-heads", "export"):
        assert run_stage(cfg, stage) is not None
    acc = read_manifest(root / "acceptance_data", expect_stage="acceptance-data").metrics["drafters"]
    sequences = {n: [c["train"]["sequences"] for c in acc[n].values()] for n in ("sibling", "ofa")}
    assert sequences["sibling"] == sequences["ofa"] and min(sequences["sibling"]) > 0  # every domain's rows
    from specdraft.decoding.bundle.directory import load_bundle
    from specdraft.drafters.roles import drafter_roles

    bundle = load_bundle(root / "bundle")
    assert sorted(bundle.drafters) == ["math", "ofa", "sibling", "translate"]
    assert bundle.drafters["sibling"].domains == []
    assert bundle.general_drafter() == "ofa"
    roles = drafter_roles({d.name: d.domains for d in bundle.drafters.values()})
    assert roles.ofa == "ofa" and roles.own == {"math": "math", "translate": "translate"}
    assert "sibling" not in roles.general + roles.special


def test_an_init_with_another_tokenizer_is_refused(pair, distilled, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(distilled, root)
    with pytest.raises(InputError, match=r"the init_from model \(the 3 parts of train_drafters.init_from\) uses a "
                                         "different tokenizer from the target's"):
        run_stage(init_config(root, pair, "stranger"), "train-drafters")
    assert not (root / "drafters").exists()


def test_init_drafter_needs_init_from_and_a_name_of_its_own(pair, distilled, tmp_path):
    with pytest.raises(InputError, match="init_drafter 'sibling' keeps the init_from model as a drafter: it needs "
                                         "init_from"):
        pair_config(tmp_path, pair, train_drafters={"init_drafter": "sibling"})
    root = tmp_path / "run"
    shutil.copytree(distilled, root)
    with pytest.raises(InputError, match="init_drafter 'ofa' is also the name of a trained drafter"):
        run_stage(init_config(root, pair, init_drafter="ofa"), "train-drafters")
