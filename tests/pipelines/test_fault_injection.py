"""Fault injection: kill a stage at seeded points of its progress, rerun it, compare with a clean run.

For a stage S on a run root whose inputs are finished:
  1. a clean run of S in a copy gives the reference directory (its manifest's file hashes);
  2. in another copy S is started as its own process and killed (SIGKILL, or SIGTERM) after a delay
     drawn by a seeded schedule over the clean run's duration, then rerun until it finishes;
  3. the finished directory must hold exactly the reference files, no temp dir or lock may be left,
     and a finished directory from before (the --force case) must never be gone after a kill.
The kill during the final rename is exact rather than timed: a driver makes the process SIGKILL
itself right after `commit` moved the old directory aside, before the new one is in place.

Each stage's schedule takes one to a few minutes of subprocesses, so they run with `make test-slow`.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specdraft.pipelines.artifacts import read_manifest, verify_files
from specdraft.pipelines.config import to_dict
from specdraft.pipelines.stage import STAGES, run_stage
from tests.pipelines.conftest import FAST, tiny_config

REPO = Path(__file__).resolve().parents[2]
SEED = 20261123

# Makes the stage process kill itself right after the first of commit's two renames (final -> .old-*).
RENAME_KILLER = """
import os, signal, sys
import specdraft.pipelines.artifacts as a
real = os.replace
def replace(src, dst):
    real(src, dst)
    if os.path.basename(str(dst)).startswith(".old-"):
        os.kill(os.getpid(), signal.SIGKILL)
a.os = type(os)("os_shim")
a.os.__dict__.update(os.__dict__)
a.os.replace = replace
from specdraft.pipelines.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled")
    env.pop("SPECDRAFT_SHARD", None)
    return env


def _command(stage: str, config: Path, force: bool = False, driver: str | None = None) -> list[str]:
    head = [sys.executable, "-c", driver] if driver else [sys.executable, "-m", "specdraft.pipelines.cli"]
    return head + [stage, "--config", str(config)] + (["--force"] if force else [])


def _write_config(root: Path) -> Path:
    path = root.parent / f"{root.name}.yaml"
    path.write_text(yaml.safe_dump(to_dict(tiny_config(root, **FAST))))
    return path


def _run(stage: str, config: Path, **kw) -> float:
    t0 = time.monotonic()
    out = subprocess.run(_command(stage, config, **kw), cwd=REPO, env=_env(), capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return time.monotonic() - t0


def _kill_after(stage: str, config: Path, delay: float, sig: int, force: bool = False) -> bool:
    """Start the stage, send `sig` to its process group after `delay` s; True if it was still running."""
    proc = subprocess.Popen(_command(stage, config, force=force), cwd=REPO, env=_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=delay)
        return False  # finished before the fault: still a valid (uninteresting) schedule point
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
        return True


def _out(root: Path, stage: str) -> Path:
    return root / next(s.out for s in STAGES if s.name == stage)


# evaluate measures time, so its report and plots differ between any two runs; what a rerun must
# reproduce exactly are the files it writes and every run's counts (SPEC: counts are exact, times are not)
COUNT_KEYS = ("prompt", "set", "domain", "family", "drafter", "k", "policy", "bandit", "reward", "mode", "params",
              "N", "N_target", "N_draft", "N_discarded", "drafted")


def _evaluate_counts(out: Path) -> list:
    runs = json.loads((out / "metrics.json").read_text())["runs"]
    return sorted((json.dumps({k: r.get(k) for k in COUNT_KEYS}, sort_keys=True) for r in runs))


def _reference(root: Path, stage: str):
    out = _out(root, stage)
    files = read_manifest(out, expect_stage=stage).files
    if stage == "evaluate":
        return sorted(files), _evaluate_counts(out)
    return files


def _assert_clean(root: Path, stage: str, reference) -> None:
    out = _out(root, stage)
    assert _reference(root, stage) == reference
    verify_files(out)
    assert not list(root.glob(f".tmp-{out.name}-*")) and not list(root.glob(f".old-{out.name}-*"))
    assert not list((root / ".locks").glob("*.lock")) if (root / ".locks").exists() else True


def _prepared(base: Path, tmp_path: Path, stage: str) -> tuple[Path, Path]:
    """A copy of `base` with every stage before `stage` finished, and its config file."""
    root = tmp_path / stage
    shutil.copytree(base, root)
    names = [s.name for s in STAGES]
    for later in STAGES[names.index(stage):]:  # the base may hold this stage or later ones finished
        shutil.rmtree(root / later.out, ignore_errors=True)
    cfg = tiny_config(root, **FAST)
    for spec in STAGES[: names.index(stage)]:
        run_stage(cfg, spec.name, log=lambda *_: None)
    return root, _write_config(root)


def check_stage_survives_faults(base: Path, tmp_path: Path, stage: str, n_kills: int) -> None:
    ref_root, ref_cfg = _prepared(base, tmp_path, stage)
    clean_time = _run(stage, ref_cfg)
    reference = _reference(ref_root, stage)

    rng = random.Random(f"{SEED}/{stage}")
    root = tmp_path / f"{stage}-faults"
    shutil.copytree(ref_root, root)
    shutil.rmtree(_out(root, stage))
    shutil.rmtree(root / ".work", ignore_errors=True)
    cfg = _write_config(root)
    schedule = [(signal.SIGKILL, rng.uniform(0.2, 0.95) * clean_time) for _ in range(n_kills)]
    schedule.append((signal.SIGTERM, rng.uniform(0.4, 0.95) * clean_time))
    for sig, delay in schedule:
        _kill_after(stage, cfg, delay, sig)
    _run(stage, cfg)
    _assert_clean(root, stage, reference)

    # --force over a finished directory: killed at a random point, or exactly between the two renames,
    # the finished directory is never lost (the next plain run is a cache hit on the same files)
    _kill_after(stage, cfg, rng.uniform(0.3, 0.95) * clean_time, signal.SIGKILL, force=True)
    _run(stage, cfg)
    _assert_clean(root, stage, reference)
    out = subprocess.run(_command(stage, cfg, force=True, driver=RENAME_KILLER), cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert not _out(root, stage).exists() and list(root.glob(f".old-{_out(root, stage).name}-*"))
    _run(stage, cfg)
    _assert_clean(root, stage, reference)


@pytest.mark.slow  # about 100 s of subprocesses: `make test-slow`
def test_distill_data_survives_kill_9_sigterm_and_a_kill_during_the_final_rename(_tiny_run_template, tmp_path):
    check_stage_survives_faults(_tiny_run_template, tmp_path, "distill-data", n_kills=1)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [s.name for s in STAGES if s.name != "distill-data"])
def test_every_stage_survives_faults(_tiny_run_template, tmp_path, stage):
    check_stage_survives_faults(_tiny_run_template, tmp_path, stage, n_kills=3)
