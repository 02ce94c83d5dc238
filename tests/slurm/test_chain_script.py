"""slurm/chain.sh against a stand-in `sbatch` that records its arguments (runs in `make test`; the real
cluster runs of chain.sh are the `slurm`-marked tests)."""
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_SBATCH = """#!/bin/bash
n=$(( $(cat "$LOG.count" 2>/dev/null || echo 100) + 1 )); echo $n > "$LOG.count"
echo "$n SPECDRAFT_HOME=$SPECDRAFT_HOME $*" >> "$LOG"
echo "$n;cluster"
"""


def _chain(tmp_path, *args):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    log = tmp_path / "sbatch.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LOG": str(log)}
    env.pop("SPECDRAFT_HOME", None)
    out = subprocess.run([str(REPO / "slurm" / "chain.sh"), *args], env=env, capture_output=True, text=True, cwd=tmp_path)
    return out, [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def test_chain_submits_every_stage_after_the_previous_one(tmp_path):
    out, calls = _chain(tmp_path, "cfg.yaml", "3", "2", "evaluate.k=2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(i) for i in range(101, 115)]  # one id per job, ";cluster" cut off
    assert all(c[1] == f"SPECDRAFT_HOME={REPO}" for c in calls)
    stages = [c[c.index("--parsable") + 1:] for c in calls]
    deps = [next((a for a in s if a.startswith("--dependency")), None) for s in stages]
    assert deps == [None] + [f"--dependency=afterok:{i}" for i in range(101, 114)]
    scripts = [next(Path(a).name for a in s if a.endswith(".sbatch")) for s in stages]
    assert scripts == ["stage.sbatch"] * 3 + ["distill_data.sbatch", "stage.sbatch", "teacher_data.sbatch"] + \
        ["stage.sbatch"] * 6 + ["evaluate.sbatch", "stage.sbatch"]
    assert "--array=0-2" in stages[3] and "--array=0-2" in stages[5] and "--array=0-1" in stages[12]
    arrays = (3, 5, 12)
    names = [s[s.index(str(REPO / "slurm" / "stage.sbatch")) + 1] for i, s in enumerate(stages) if i not in arrays]
    assert names == ["convert-target", "prepare-data", "pretrain-target", "distill-data", "teacher-data", "train-drafters",
                     "acceptance-data", "train-heads", "train-router", "export", "evaluate"]
    assert all(s[-2:] == ["cfg.yaml", "evaluate.k=2"] for s in stages[:-1])
    # the last job merges evaluate's shards, after every array task succeeded
    assert stages[-1][-3:] == ["cfg.yaml", "evaluate.k=2", "--merge"]
    assert not any("--merge" in s for s in stages[:-1])
    assert not any("gpu" in a for s in stages for a in s)  # a CPU cluster can run every job


def test_chain_shard_count_is_optional(tmp_path):
    out, calls = _chain(tmp_path, "cfg.yaml", "evaluate.k=2")
    assert out.returncode == 0, out.stderr
    assert "--array=0-3" in calls[3] and calls[3][-2:] == ["cfg.yaml", "evaluate.k=2"]
    assert "--array=0-3" in calls[5] and calls[5][-2:] == ["cfg.yaml", "evaluate.k=2"]  # teacher-data's too
    assert "--array=0-3" in calls[12] and calls[12][-2:] == ["cfg.yaml", "evaluate.k=2"]  # evaluate's default too
    out, calls = _chain(tmp_path / "zero", "cfg.yaml", "0") if (tmp_path / "zero").mkdir() is None else (None, None)
    assert out.returncode == 2 and "N_DISTILL_SHARDS" in out.stderr and not calls
    (tmp_path / "zero_eval").mkdir()
    out, calls = _chain(tmp_path / "zero_eval", "cfg.yaml", "2", "0")
    assert out.returncode == 2 and "N_EVAL_SHARDS" in out.stderr and not calls
