"""train-drafters with train_drafters.eagle on the tiny run, then export and `specdraft generate`."""
import json
import shutil

import pytest

from specdraft.decoding.bundle.directory import load_bundle
from specdraft.decoding.speculators.eagle_model import read_eagle_config, target_dir_hash
from specdraft.core.errors import InputError
from specdraft.decoding.speculators.eagle import TreeShape
from specdraft.decoding.generate import generate_text, load_pair
from specdraft.pipelines.cli import main
from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import fresh_copy, tiny_config

EAGLE = {"eagle": {"enabled": True, "variant": "eagle1", "drafters": ["ofa", "math", "translate"], "lr": 1e-3, "max_length": 64, "eval_every_n_steps": 2,
                   "train": {"max_steps": 3, "batch_size": 4, "wandb": {"mode": "disabled"}},
                   "tree": {"depth": 3, "top_k": 2, "nodes": 5}}}
FAST = {"train_heads": {"depths": [0], "w_rejs": [1.0], "epochs": 1, "cost_ratio": 0.2},
        "acceptance_data": {"max_sequences": {"train": 6, "dev": 3}}}


def _drafters(root) -> dict:
    import dataclasses

    return dict(dataclasses.asdict(tiny_config(root).train_drafters), **EAGLE)


def _config(root, **sections):
    return tiny_config(root, **FAST, **{"train_drafters": _drafters(root), **sections})


@pytest.fixture(scope="module")
def _bundled(_tiny_run_template, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle") / "run"
    shutil.copytree(_tiny_run_template, root)
    cfg = _config(root)
    for stage in ("distill-data", "train-drafters", "acceptance-data", "train-heads", "export"):
        run_stage(cfg, stage)
    return root


@pytest.fixture
def run_root(_bundled, tmp_path):
    return fresh_copy(_bundled, tmp_path)


def test_eagle_drafter_is_trained_pinned_and_bundled(run_root):
    out = run_root / "drafters" / "eagle" / "eagle-ofa"
    meta = read_eagle_config(out)
    assert meta["domains"] == ["math", "translate"] and meta["steps"] == 3
    assert meta["target_hash"] == target_dir_hash(run_root / "target")
    metrics = read_manifest(run_root / "drafters").metrics["eagle"]
    for dom in ("math", "translate"):
        row = metrics["alignment"]["eagle-ofa"][dom]
        assert 0 <= row["acceptance"] <= 1 and row["positions"] > 0
    # the independent drafters' stages do not see the EAGLE directory
    assert sorted(read_manifest(run_root / "bundle").metrics["drafters"]) == ["math", "ofa", "translate"]
    bundle = load_bundle(run_root / "bundle")
    assert sorted(bundle.eagle) == ["eagle-math", "eagle-ofa", "eagle-translate"]
    assert bundle.eagle["eagle-ofa"].tree == {"depth": 3, "top_k": 2, "nodes": 5}


@pytest.mark.parametrize("tree", ["bundle", "none"])
def test_generate_runs_the_eagle_drafter_and_matches_greedy(run_root, capsys, tree):
    bundle = str(run_root / "bundle")
    prompt = "Question: 2 + 3"
    assert main(["generate", bundle, "--drafter", "eagle-ofa", "--prompt", prompt, "--max-new-tokens", "12",
                 "--eagle-tree", tree]) == 0
    counters = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert counters["N"] == 12 and counters["N_target"] <= 12
    tok, target, drafter, head, _ = load_pair(bundle, drafter="eagle-ofa")
    assert head is None and drafter.attached
    shape = TreeShape(3, 2, 5) if tree == "bundle" else None
    eagle, m = generate_text(tok, target, drafter, prompt, 12, tree=shape)
    plain, _ = generate_text(tok, target, drafter, prompt, 12, method="ar")
    assert eagle == plain and m["N_target"] == counters["N_target"]


def test_a_drafter_for_another_target_is_refused(run_root):
    path = run_root / "bundle" / "eagle" / "eagle-ofa" / "eagle_config.json"
    meta = json.loads(path.read_text())
    meta["target_hash"] = "0" * 64
    path.write_text(json.dumps(meta))
    bundle = load_bundle(run_root / "bundle", verify=False)
    with pytest.raises(InputError, match="trained for target"):
        bundle.load_eagle("eagle-ofa", bundle.load_target())


def test_eagle_names_must_be_drafters_of_the_run(tiny_run):
    from specdraft.pipelines.train_eagle import eagle_specs

    cfg = _config(tiny_run)
    with pytest.raises(InputError, match="not a drafter of this run"):
        eagle_specs(type(cfg.train_drafters.eagle)(drafters=["nope"]), [("ofa", ["math"])])


EVAL = {"sets": ["test", "ood"], "prompts_per_domain": 1, "max_new_tokens": 8, "ks": [2], "k": 2, "sampling_prompts": 0,
        "bandits": ["ucb-be"], "spectr_drafts": [], "cascades": [], "model_free_arms": [], "repeats": 1,
        "calibration_reps": 2, "per_drafter_sets": []}


def test_evaluate_reports_metaeagle_rows(run_root):
    out = run_stage(_config(run_root, evaluate=EVAL), "evaluate")
    metrics = json.loads((out / "metrics.json").read_text())
    eagle = [r for r in metrics["rows"] if r["family"] == "eagle" and r["domain"] == "all" and r["set"] == "test"]
    drafts = sorted({(r["drafter"], r["params"]["draft"], r["reward"]) for r in eagle}, key=str)
    assert ("eagle-math", "chain", None) in drafts and ("eagle-ofa", "tree 3x2x5", None) in drafts
    assert (None, "bandit", "be") in drafts and (None, "bandit", "bd") in drafts
    # MetaEagle chooses among the specialised EAGLE drafters; the all-domain one is a baseline beside them
    chosen = {a for r in metrics["runs"] if r["family"] == "eagle" and r["bandit"] for a in r["arms"]}
    assert chosen and chosen <= {"eagle-math", "eagle-translate"}
    assert all(r["MAT"] >= 1 and r["counted_speedup"] is not None for r in eagle)
    assert {"eagle-math", "eagle-ofa"} <= set(metrics["calibration"]["drafter_ms"])
    report = (out / "report.md").read_text()
    assert "## EAGLE drafters vs independent drafters" in report and "MetaEagle-UCB (BD)" in report
    assert "EAGLE eagle-ofa tree 3x2x5" in report and "domain drafter K=2" in report
    # each drafter's training as train-drafters recorded it, its dev curve beside it
    ofa = metrics["eagle_training"]["eagle-ofa"]
    assert ofa["steps"] == 3 and [p["step"] for p in ofa["dev_curve"]] == [2, 3]  # every 2 steps, and the last
    assert set(metrics["eagle_training"]) == {"eagle-ofa", "eagle-math", "eagle-translate"}
    assert (f"- **eagle-ofa** trained 3 steps on {ofa['examples']} rows; dev acceptance (teacher-forced 1 - TV) "
            f"against steps: 2: {ofa['dev_curve'][0]['acceptance']:.3f}, 3: {ofa['dev_curve'][1]['acceptance']:.3f}.") in report


def test_the_default_eagle3_on_a_target_of_too_few_layers_stops_before_training(_bundled, tmp_path):
    """The default variant (vLLM's EAGLE-3) reads three distinct target layers; this one-layer target cannot give
    them, so train-drafters stops with one line before it trains anything, and writes nothing."""
    root = fresh_copy(_bundled, tmp_path)
    shutil.rmtree(root / "drafters")
    eagle = {k: v for k, v in EAGLE["eagle"].items() if k != "variant"}
    with pytest.raises(InputError, match="reads 3 distinct target layers; this target has 1") as err:
        run_stage(_config(root, train_drafters={**_drafters(root), "eagle": eagle}), "train-drafters")
    assert "\n" not in str(err.value) and not (root / "drafters").exists()
