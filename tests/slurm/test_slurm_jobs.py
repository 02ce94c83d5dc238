"""The sbatch templates and chain.sh on a real (throwaway, local) Slurm cluster, on the stage tests' tiny
config: every job's result is compared with the same stage run in one process without Slurm.

Documented single-process equivalent of DDP (test_two_task_ddp_equals_single_process): W tasks with
batch_size=B each, ranks taking contiguous... see that test's docstring.
"""
import hashlib
import json
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from pipelines.config import load_config
from pipelines.schema import RunConfig
from pipelines.stage import STAGE_NAMES, run_stage

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "slurm"


def write_config(path: Path, root: Path, **sections) -> Path:
    """The stage tests' tiny config (tests/pipelines/conftest.py) as a YAML file for the CLI."""
    from pipelines.config import to_dict
    from tests.pipelines.conftest import FAST, tiny_config
    from tests.pipelines.test_evaluate import TINY_EVAL

    merged = {**FAST, "evaluate": TINY_EVAL}
    for name, value in sections.items():
        merged[name] = {**merged.get(name, {}), **value}
    path.write_text(yaml.safe_dump(to_dict(tiny_config(root, **merged))))
    return path


def _cfg(path: Path, *overrides: str) -> RunConfig:
    return load_config(RunConfig, str(path), list(overrides))


def _run_in_process(cfg_file: Path, stages, *overrides: str) -> None:
    cfg = _cfg(cfg_file, *overrides)
    for stage in stages:
        run_stage(cfg, stage)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _weights(root: Path, stage_dir: str) -> dict[str, str]:
    """sha256 of every safetensors file under root/stage_dir (drafters, heads, bundle)."""
    base = root / stage_dir
    return {str(p.relative_to(base)): _sha(p) for p in sorted(base.rglob("*.safetensors"))}


def _completed(states: dict) -> None:
    for job, st in states.items():
        assert st.get("JobState") == "COMPLETED" and st.get("ExitCode") == "0:0", (job, st)


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """A tiny run root with prepare-data and pretrain-target finished (in this process, no Slurm)."""
    root = tmp_path_factory.mktemp("prepared") / "run"
    cfg_file = write_config(root.parent / "cfg.yaml", root)
    _run_in_process(cfg_file, ("prepare-data", "pretrain-target"))
    return root


@pytest.fixture(scope="session")
def distilled(prepared, tmp_path_factory):
    root = tmp_path_factory.mktemp("distilled") / "run"
    shutil.copytree(prepared, root)
    _run_in_process(write_config(root.parent / "cfg.yaml", root), ("distill-data",))
    return root


def _copy(template: Path, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """(run root, its config file): a copy of a finished template run."""
    root = tmp_path / name / "run"
    shutil.copytree(template, root)
    return root, write_config(root.parent / "cfg.yaml", root)


def _submit(slurm, job_env, cwd: Path, *argv: str) -> str:
    return slurm.run("sbatch", "--parsable", *argv, cwd=cwd, env=job_env).strip().split(";")[0]


def _log(cwd: Path, pattern: str) -> str:
    return "\n".join(p.read_text() for p in sorted(cwd.glob(pattern)))


def test_distill_array_shards_cover_every_chunk_once(slurm, job_env, prepared, tmp_path):
    root, cfg_file = _copy(prepared, tmp_path, "array")
    job = _submit(slurm, job_env, root.parent, "--array=0-2", str(SLURM / "distill_data.sbatch"), str(cfg_file))
    slurm.wait([job], timeout=240)
    states = {f"{job}_{i}": slurm.job_state(f"{job}_{i}") for i in range(3)}
    logs = _log(root.parent, f"slurm-specdraft-distill-{job}_*.out")
    _completed(states)

    manifest = json.loads((root / "distill_data" / "manifest.json").read_text())
    n_chunks = manifest["metrics"]["chunks"]
    generated = {int(i): int(k) for i, k in re.findall(r"shard (\d)/3: (\d+) chunks to generate", logs)}
    assert sorted(generated) == [0, 1, 2], logs  # every task ran as its own shard
    assert sum(generated.values()) == n_chunks  # chunk i belongs to shard i mod 3: each generated once
    assert logs.count("another shard merges") == 2 or logs.count("chunks remain for other shards") >= 1
    assert re.search(rf"array task {job}_\d of 3", logs)  # Slurm-aware progress line

    ref, ref_cfg = _copy(prepared, tmp_path, "single")
    _run_in_process(ref_cfg, ("distill-data",))
    ref_manifest = json.loads((ref / "distill_data" / "manifest.json").read_text())
    assert manifest["content_hash"] == ref_manifest["content_hash"]  # byte-identical dataset files
    assert manifest["files"] == ref_manifest["files"]
