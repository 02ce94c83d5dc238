"""The export stage on a tiny run: layout, bundle.json against its inputs, relocation, damage."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specdraft.decoding.bundle.directory import BUNDLE_JSON, bundle_files, drafter_hash, load_bundle, subdir_files
from specdraft.core.hashing import content_hash
from specdraft.pipelines.cli import main as cli_main
from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import StageOutput, read_manifest
from specdraft.core.hashing import content_hash as artifacts_content_hash
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import fresh_copy, run_template, tiny_config

FAST = {"train_heads": {"depths": [0, 1], "w_rejs": [1.0, 6.0], "epochs": 1, "cost_ratio": 0.2},
        "acceptance_data": {"max_sequences": {"train": 8, "dev": 4}}}


def _config(root, **sections):
    return tiny_config(root, **FAST, **sections)


@pytest.fixture(scope="module")
def _headed_template(_tiny_run_template, tmp_path_factory):
    """A run root with every stage up to train-heads finished (built once for this module)."""
    return run_template(tmp_path_factory, "export", _tiny_run_template,
                        ("distill-data", "train-drafters", "acceptance-data", "train-heads"), **FAST)


@pytest.fixture
def run_root(_headed_template, tmp_path):
    return fresh_copy(_headed_template, tmp_path)


def _fake_router(root: Path, weights_name: str = "router.safetensors") -> None:
    """A finished train-router output (the real stage is tested in test_train_router.py): one
    subdirectory per router with weights + router_config.json."""
    with StageOutput(root / "router") as out:
        (out.tmp / "classifier").mkdir()
        save_file({"w": torch.zeros(2, 3)}, str(out.tmp / "classifier" / weights_name))
        (out.tmp / "classifier" / "router_config.json").write_text(
            json.dumps({"kind": "mlp", "drafters": ["math", "translate"]}))
        out.commit(stage="train-router", config={}, cache_key="x", inputs={}, metrics={}, wall_time_s=0.0)


def test_bundle_matches_its_inputs_and_loads_after_move(run_root, tmp_path, capsys):
    out = run_stage(_config(run_root), "export")
    meta = json.loads((out / BUNDLE_JSON).read_text())
    assert meta["files"] == bundle_files(out)  # every file but bundle.json and the manifest, hashed
    assert sorted(meta["drafters"]) == ["math", "ofa", "translate"] and not (out / "drafters" / "base").exists()
    drafters_manifest = read_manifest(run_root / "drafters")
    sweep = json.loads((run_root / "heads" / "sweep.json").read_text())
    alignment = json.loads((run_root / "drafters" / "alignment.json").read_text())
    for name, d in meta["drafters"].items():
        info = json.loads((run_root / "drafters" / name / "drafter.json").read_text())
        assert d["domains"] == info["domains"] and d["parameters"] == info["parameters"]
        assert d["alignment"] == alignment[name]
        # what the heads' drafter_hash means: the drafter's files, serving defaults aside
        assert d["content_hash"] == drafter_hash(subdir_files(drafters_manifest.files, name))
        assert d["head"] == "T1/" + sweep[name]["T1"]["best_head"] and list(meta["heads"][name]) == [d["head"]]
        head = meta["heads"][name][d["head"]]
        head_cfg = json.loads((run_root / "heads" / name / d["head"] / "head_config.json").read_text())
        assert (head["depth"], head["w_rej"], head["threshold"]) == (head_cfg["depth"], head_cfg["w_rej"],
                                                                     head_cfg["threshold"])
    assert meta["target"]["path"] == "target" and meta["routers"] == {}
    assert meta["decoding"]["selector"] == "ucb" and meta["decoding"]["k"] == 4
    # c is the number train-heads chose its heads with (pinned here by train_heads.cost_ratio)
    assert meta["decoding"]["cost_ratio"] == FAST["train_heads"]["cost_ratio"] == sweep["math"]["T1"]["cost"]["cost_ratio"]

    moved = tmp_path / "copied" / "bundle"
    moved.parent.mkdir()
    shutil.move(out, moved)
    b = load_bundle(moved)
    tok = b.load_tokenizer()
    target = b.load_target(device="cpu")
    ids = torch.tensor([tok("x = 1 + 2")["input_ids"]])
    for name in b.drafters:
        drafter = b.load_drafter(name, device="cpu", dtype="float32", target=target)
        head, _ = b.load_head(name)
        with torch.no_grad():
            h = drafter(ids, output_hidden_states=True)
            assert h.logits.shape == target(ids).logits.shape
            sigma = torch.sigmoid(head(h.hidden_states[-1]))
        assert sigma.shape == ids.shape and ((sigma > 0) & (sigma < 1)).all()

    capsys.readouterr()
    assert cli_main(["inspect-bundle", str(moved)]) == 0
    assert f"all {len(meta['files'])} files verified" in capsys.readouterr().out
    weights = moved / "drafters" / "math" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x80
    weights.write_bytes(bytes(data))
    assert cli_main(["inspect-bundle", str(moved)]) == 2
    err = capsys.readouterr().err.strip()
    assert "'drafters/math/model.safetensors' does not match its sha256" in err and "\n" not in err


def test_reference_target_all_heads_and_router(run_root):
    _fake_router(run_root)
    out = run_stage(_config(run_root, export={"target": "reference", "heads": "all"}), "export")
    b = load_bundle(out)
    assert not b.target_in_bundle and not (out / "target").exists()
    assert b.target_path == str((run_root / "target").resolve())
    assert all(len(heads) == 4 for heads in b.heads.values())
    assert sum(h.best for heads in b.heads.values() for h in heads.values()) == 3
    assert b.routers["classifier"].kind == "mlp" and (b.routers["classifier"].path / "router.safetensors").is_file()
    assert b.load_target(device="cpu").config.vocab_size == b.meta["target"]["vocab_size"]
    assert read_manifest(out).inputs["train-router"]["content_hash"] == read_manifest(run_root / "router").content_hash


def test_pickle_weights_and_changed_inputs_are_refused(run_root):
    _fake_router(run_root, weights_name="router.pt")
    with pytest.raises(InputError, match="safetensors only"):
        run_stage(_config(run_root), "export")
    shutil.rmtree(run_root / "router")
    weights = run_root / "drafters" / "ofa" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    # caught before any work by the input verification every stage runs...
    with pytest.raises(InputError, match="does not match its hash .*rerun stage 'train-drafters'"):
        run_stage(_config(run_root), "export")
    # ...and, with that turned off, by export's own check of what it copies into the bundle
    with pytest.raises(InputError, match="changed since stage 'train-drafters' finished"):
        run_stage(_config(run_root, run={"root": str(run_root), "verify_inputs": "off"}), "export")
    assert not (run_root / "bundle").exists()


def test_bad_decoding_defaults_fail_before_copying(run_root):
    with pytest.raises(InputError, match="selector 'nope'"):
        run_stage(_config(run_root, decoding={"selector": "nope"}), "export")
    for bad, match in (({"k": 0}, "decoding.k must be an integer >= 1"),
                       ({"threshold": 1.5}, r"decoding.threshold must be in \(0, 1\)"),
                       ({"cost_ratio": -1.0}, "decoding.cost_ratio"), ({"top_p": 0.0}, "top_p")):
        with pytest.raises(InputError, match=match):
            run_stage(_config(run_root, decoding=bad), "export")
    assert not (run_root / "bundle").exists()


def test_a_pinned_serving_cost_ratio_is_written_instead_of_the_measured_one(run_root):
    b = load_bundle(run_stage(_config(run_root, decoding={"cost_ratio": 0.05, "threshold": 0.4}), "export"))
    assert b.defaults.cost_ratio == 0.05 and b.defaults.threshold == 0.4


def test_content_hash_is_the_artifact_store_definition():
    files = {"b.json": "12", "a/model.safetensors": "34"}
    assert content_hash(files) == artifacts_content_hash(files)


def test_datastore_is_shipped_and_optional(run_root):
    """export builds the REST / suffix datastore from distill-data's train responses (safetensors + JSON),
    records its size and build time in the manifest; without it the bundle loads and names what is missing."""
    from datasets import load_from_disk

    from specdraft.decoding.speculators.datastore import SEPARATOR

    out = run_stage(_config(run_root), "export")
    ds_meta = read_manifest(out).metrics["datastore"]
    responses = load_from_disk(str(run_root / "distill_data" / "data"))["train"]["response_ids"]
    assert ds_meta["sequences"] == len(responses) and ds_meta["tokens"] == sum(map(len, responses))
    assert ds_meta["bytes"] > 0 and ds_meta["build_seconds"] >= 0
    b = load_bundle(out)
    assert sorted(p.name for p in b.datastore.iterdir()) == ["datastore.json", "datastore.safetensors"]
    index = b.load_datastore()
    assert index.tokens.tolist()[: len(responses[0]) + 1] == list(responses[0]) + [SEPARATOR]
    assert b.unavailable_arms() == {} and "datastore:" in inspect_bundle_text(out)
    from specdraft.decoding.speculators.arms import ArmResources, build_arms

    arms = build_arms(["rest", "suffix"], ArmResources.from_bundle(b, {}), n_max=4)
    assert arms[0].speculator.index.n_sequences == len(responses)

    bare = run_stage(_config(run_root, export={"datastore": False}), "export", force=True)
    b = load_bundle(bare)
    assert b.datastore is None and b.load_datastore() is None and "datastore" not in b.meta
    assert "rest" in b.unavailable_arms() and "rest" in inspect_bundle_text(bare)


def inspect_bundle_text(path) -> str:
    from specdraft.decoding.bundle.directory import inspect_bundle

    return inspect_bundle(path)


def test_drafters_serve_as_transformers_assistant_models(run_root):
    """Each exported drafter is a plain HF dir: `generate(assistant_model=drafter)` with its target gives
    the target's own greedy output, and its generation_config carries the best fixed K of train-heads."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from specdraft.data.chat import row_messages
    from specdraft.data.prompts import load_prompt_sets
    from specdraft.decoding.bundle.chat import format_prompt

    out = run_stage(_config(run_root), "export")
    meta = json.loads((out / BUNDLE_JSON).read_text())
    assert meta["chat"]["plain"] is False and meta["chat"]["template"] is None  # the tokenizer's own template
    sweep = json.loads((run_root / "heads" / "sweep.json").read_text())
    tok = AutoTokenizer.from_pretrained(out / "target")
    target = AutoModelForCausalLM.from_pretrained(out / "target").eval()
    rows = list(load_prompt_sets(run_root / "prompts")["test"])[:2]
    for name in meta["drafters"]:
        gc = GenerationConfig.from_pretrained(out / "drafters" / name)
        best = sweep[name]["T1"]["best_fixed_k_greedy"]  # served greedy (the decoding default)
        # the best fixed K travels as a number: train-heads' simulation -> bundle.json -> generation_config
        assert best["policy"] == f"fixed K={sweep[name]['T1']['best_k_greedy']}"
        assert meta["drafters"][name]["fixed_k"] == sweep[name]["T1"]["best_k_greedy"] == gc.num_assistant_tokens
        assert gc.num_assistant_tokens_schedule == "constant"
        drafter = AutoModelForCausalLM.from_pretrained(out / "drafters" / name).eval()
        for row in rows:
            ids = torch.tensor([format_prompt(tok, row_messages(row))])
            kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            plain = target.generate(ids, **kw)
            assisted = target.generate(ids, assistant_model=drafter, **kw)
            assert assisted.tolist() == plain.tolist()


def test_bundle_json_round_trips_through_the_schema(run_root):
    """export writes decoding/bundle/schema.py's BundleSpec; reading it back and writing it again gives the
    same bytes (target, drafters, heads, router, datastore and chat format all present)."""
    from specdraft.decoding.bundle.directory import write_bundle

    _fake_router(run_root)
    out = run_stage(_config(run_root), "export")
    written = (out / BUNDLE_JSON).read_text()
    b = load_bundle(out)
    assert b.routers and b.datastore is not None and b.spec.chat is not None
    assert b.spec.to_json(out) == json.loads(written)
    write_bundle(out, b.spec)
    assert (out / BUNDLE_JSON).read_text() == written


def _dev_unconditional_rates(summary: dict, k: int) -> list[float]:
    """P(the first j + 1 drafts all accepted) over round starts at every dev position, past a sequence's end
    nothing accepted: written out from the definition, not from the exporter's code."""
    sums, starts = [0.0] * k, 0
    for s in summary["sequences"]:
        p = s["accept"]
        for start in range(len(p)):
            starts += 1
            reach = 1.0
            for j in range(k):
                reach *= p[start + j] if start + j < len(p) else 0.0
                sums[j] += reach
    return [x / starts for x in sums]


def test_each_drafter_ships_its_acceptance_profile_for_vllm_synthetic_sampling(run_root):
    """vllm/<name>/synthetic_speculative_config.json: the speculative config plus vLLM's synthetic rejection
    sampling at the drafter's dev acceptance (unconditional per-position rates: non-increasing, length K),
    listed and hashed like the other vllm/ files."""
    out = run_stage(_config(run_root), "export")
    meta = json.loads((out / BUNDLE_JSON).read_text())
    manifest = read_manifest(out)
    for name in meta["drafters"]:
        spec = json.loads((out / "vllm" / name / "speculative_config.json").read_text())
        synthetic = json.loads((out / "vllm" / name / "synthetic_speculative_config.json").read_text())
        rates = synthetic.pop("synthetic_acceptance_rates")
        assert synthetic == {**spec, "rejection_sample_method": "synthetic"}
        k = spec["num_speculative_tokens"]
        assert len(rates) == k and all(0.0 <= r <= 1.0 for r in rates)
        assert all(b <= a for a, b in zip(rates, rates[1:]))
        summary = json.loads((out / "acceptance" / name / "acceptance_summary.json").read_text())
        assert rates == pytest.approx(_dev_unconditional_rates(summary, k), abs=2e-6)
        rel = f"vllm/{name}/synthetic_speculative_config.json"
        assert rel in meta["files"] and meta["files"][rel] == manifest.files[rel]


def test_each_drafter_ships_the_k_per_batch_size_predict_recommends(run_root, tmp_path, capsys):
    """vllm/<name>/: both speculative configs carry vLLM's batch-size schedule, valid by vLLM's rules, with
    num_speculative_tokens its largest K; engine_schedule.json beside them names the device and holds the cost
    table export timed, and the schedule is a function of that table: `specdraft predict --cost-table` with
    it writes the same configs byte for byte. Listed and hashed like every file (bundle.json, the manifest)."""
    from specdraft.decoding.costs.model import CostTable
    from specdraft.decoding.costs.throughput import AcceptanceSummary
    from specdraft.pipelines.artifacts import verify_files
    from specdraft.pipelines.vllm_export import (SCHEDULE_BATCH_SIZES, SCHEDULE_THREADS, check_schedule, schedule_ks,
                                                 schedule_ranges, schedule_tokens)

    out = run_stage(_config(run_root), "export")
    meta, manifest = json.loads((out / BUNDLE_JSON).read_text()), read_manifest(out)
    # the tiny drafters share one shape, so one table (none when an earlier export this session cached it)
    assert manifest.metrics["engine_schedule"]["tables_profiled"] <= 1
    for name in meta["drafters"]:
        d = out / "vllm" / name
        spec = json.loads((d / "speculative_config.json").read_text())
        record = json.loads((d / "engine_schedule.json").read_text())
        ranges, n = spec["num_speculative_tokens_per_batch_size"], spec["num_speculative_tokens"]
        check_schedule(ranges, n)
        assert n == schedule_tokens(ranges) and ranges[-1][1] == SCHEDULE_BATCH_SIZES[-1]
        assert record["device"].startswith("cpu: ") and record["device"].endswith(f"torch threads {SCHEDULE_THREADS}")
        assert record["written_by"] == "export" and record["num_speculative_tokens_per_batch_size"] == ranges
        table = CostTable.from_dict(record["cost_table"])
        summary = AcceptanceSummary.load(out / "acceptance" / name / "acceptance_summary.json")
        k_max = min(meta["decoding"]["k_max"], summary.k_max)
        assert ranges == schedule_ranges(schedule_ks(summary, table, SCHEDULE_BATCH_SIZES, k_max))
        for rel in ("speculative_config.json", "synthetic_speculative_config.json", "engine_schedule.json"):
            assert meta["files"][f"vllm/{name}/{rel}"] == manifest.files[f"vllm/{name}/{rel}"]
    load_bundle(out)
    verify_files(out)

    name = "math"
    (tmp_path / "t.json").write_text(json.dumps(json.loads((out / "vllm" / name / "engine_schedule.json").read_text())["cost_table"]))
    configs = {p: p.read_bytes() for p in (out / "vllm" / name).glob("*speculative_config.json")}
    assert cli_main(["predict", str(out), "--drafter", name, "--batch-sizes", ",".join(map(str, SCHEDULE_BATCH_SIZES)),
                     "--cost-table", str(tmp_path / "t.json"), "--rounds", "3", "--write-engine-config"]) == 0
    assert f"rewrote vllm/{name}/engine_schedule.json" in capsys.readouterr().out  # only who wrote it changed
    assert {p: p.read_bytes() for p in configs} == configs
    load_bundle(out)
    verify_files(out)


def test_a_target_too_big_to_price_here_leaves_the_schedule_to_predict(run_root, tmp_path, monkeypatch, capsys):
    """Where export's cost table would take minutes (a target of more than SCHEDULE_CPU_PARAMETERS on a CPU), the
    configs keep the best fixed K and engine_schedule.json says why and what to run, decided without timing
    anything (nothing is timed on this path: a stage's output follows from its inputs, not the clock); `specdraft
    predict --write-engine-config` then writes the schedule into the verified bundle."""
    import dataclasses

    import specdraft.decoding.timing as timing
    from specdraft.pipelines import vllm_export
    from specdraft.pipelines.artifacts import verify_files
    from tests.decoding.test_batch_aware import table

    monkeypatch.setattr(vllm_export, "SCHEDULE_CPU_PARAMETERS", 0)
    monkeypatch.setattr(timing, "timed_call", lambda *a, **k: pytest.fail("export timed something to decide"))
    out = run_stage(_config(run_root), "export")
    assert "not priced at export" in capsys.readouterr().out
    meta = json.loads((out / BUNDLE_JSON).read_text())
    metrics = read_manifest(out).metrics["engine_schedule"]
    assert metrics["ranges"] is None and "M-parameter target's cost table on a CPU" in metrics["unpriced"]
    for name, entry in meta["drafters"].items():
        spec = json.loads((out / "vllm" / name / "speculative_config.json").read_text())
        assert spec["num_speculative_tokens"] == entry["fixed_k"] and "num_speculative_tokens_per_batch_size" not in spec
        record = json.loads((out / "vllm" / name / "engine_schedule.json").read_text())
        assert record["num_speculative_tokens_per_batch_size"] is None and "--write-engine-config" in record["note"]
        assert record["dtype"] == metrics["dtype"]
    monkeypatch.undo()
    steep = table(verify=lambda b, w: 1e-3 * (1 + (b / 4) * (w - 1)), draft=lambda b: 1e-4, batch_sizes=(1, 64), k_max=8)
    dataclasses.replace(steep, dtype=metrics["dtype"]).save(tmp_path / "t.json")
    assert cli_main(["predict", str(out), "--drafter", "math", "--batch-sizes", "1,64", "--cost-table",
                     str(tmp_path / "t.json"), "--rounds", "3", "--write-engine-config"]) == 0
    spec = json.loads((out / "vllm" / "math" / "speculative_config.json").read_text())
    assert spec["num_speculative_tokens_per_batch_size"][-1] == [64, 64, 0]
    load_bundle(out)
    verify_files(out)


def test_export_paths_points_a_copied_bundle_at_itself(run_root, tmp_path, capsys):
    """A copied bundle's vLLM configs name the original; `specdraft export-paths` rewrites them to paths
    inside the copy, that exist, and updates the hashes (bundle.json and the manifest still verify). In
    place it changes nothing; a hand-edited config or a path that is no bundle is one line, exit 2."""
    from specdraft.pipelines.artifacts import verify_files
    from specdraft.pipelines.cli import main

    out = run_stage(_config(run_root), "export")
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert main(["export-paths", str(out)]) == 0 and "already name paths inside it" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before

    moved = tmp_path / "elsewhere" / "bundle"
    shutil.copytree(out, moved)
    configs = sorted(p for p in (moved / "vllm").rglob("*.json") if p.name != "engine_schedule.json")
    assert configs and all(str(out.resolve()) in p.read_text() for p in configs)  # stale: the original's paths
    assert main(["export-paths", str(moved)]) == 0
    assert f"rewrote {len(configs)} vLLM config(s)" in capsys.readouterr().out
    for p in configs:
        spec = json.loads(p.read_text())
        model = Path(spec["model"])
        assert model.is_absolute() and model.is_relative_to(moved.resolve()) and model.is_dir()
        assert str(out.resolve()) not in p.read_text()
    assert {p.name for p in configs} == {"speculative_config.json", "synthetic_speculative_config.json"}
    b = load_bundle(moved)  # every hash, the rewritten ones included
    assert b.root == moved.resolve()
    verify_files(moved)  # the stage manifest agrees too
    assert cli_main(["inspect-bundle", str(moved)]) == 0
    assert main(["export-paths", str(moved)]) == 0 and "already" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before  # the original untouched

    spec_path = moved / "vllm" / "math" / "speculative_config.json"
    spec_path.write_text(spec_path.read_text().replace(str(moved.resolve()), "/somewhere/else"))
    assert main(["export-paths", str(moved)]) == 2
    err = capsys.readouterr().err.strip()
    assert "'vllm/math/speculative_config.json' does not match its sha256" in err and "\n" not in err
    assert main(["export-paths", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a bundle" in err and "\n" not in err
