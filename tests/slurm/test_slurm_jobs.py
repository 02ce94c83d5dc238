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


def _per_device(batch_size: int, **train) -> list[str]:
    """Overrides of both train-drafters phases (general, finetune)."""
    return [f"train_drafters.{phase}.train.{k}={v}" for phase in ("general", "finetune")
            for k, v in {"batch_size": batch_size, "accelerator": "cpu", **train}.items()]


def test_two_task_ddp_equals_single_process(slurm, job_env, distilled, tmp_path):
    """One job, 2 tasks (srun; Lightning's SLURMEnvironment gives the ranks; DDP over gloo on CPU).

    The documented single-process equivalent of W tasks with batch_size=1 each is one process with
    batch_size=1 and accumulate_grad_batches=W: rank r trains on example r of each group of W of the
    seeded epoch order (drafters.data.ResumableBatchSampler), DDP averages the W gradients, and
    accumulation adds the W gradients of the loss divided by W. Halving is exact in floating point and
    the sum of two numbers does not depend on their order, so for W=2 the drafters are bit-identical.
    """
    root, cfg_file = _copy(distilled, tmp_path, "ddp")
    job = _submit(slurm, job_env, root.parent, "--ntasks-per-node=2", str(SLURM / "stage.sbatch"), "train-drafters",
                  str(cfg_file), *_per_device(1, strategy="ddp", devices=2))
    states = slurm.wait([job], timeout=300)
    log = _log(root.parent, f"slurm-specdraft-{job}.out")
    _completed(states)
    assert "rank 0 of 2" in log and "rank 1 of 2" in log, log[-3000:]
    assert "rank 1/2: training from step 0" in log  # DDP world of 2 (SlurmRequeue's start line)
    assert "rank 1 finished training; rank 0 writes the stage output" in log

    ref, ref_cfg = _copy(distilled, tmp_path, "single")
    _run_in_process(ref_cfg, ("train-drafters",), *_per_device(1, accumulate_grad_batches=2))
    got, want = _weights(root, "drafters"), _weights(ref, "drafters")
    assert sorted(got) == ["base/model.safetensors", "math/model.safetensors", "ofa/model.safetensors",
                           "translate/model.safetensors"]
    assert got == want
    steps = {n: json.loads((root / "drafters" / n / "drafter.json").read_text())["finetune"]["steps"]
             for n in ("math", "ofa")}
    assert steps == {n: json.loads((ref / "drafters" / n / "drafter.json").read_text())["finetune"]["steps"]
                     for n in ("math", "ofa")}
