"""A throwaway Slurm cluster for the `slurm` tests (off by default; `make test-slurm` runs them).

The cluster (munged, slurmctld, one slurmd with CPUs=2) lives under a pytest temp dir with its own
config, state, spool and log dirs and free ports; the daemons are our child processes, stopped by pid.
"""
import os
import sys
from pathlib import Path

import pytest

from slurm_cluster import Cluster, missing_binaries

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}); `make test-slurm` installs it")
    cluster = Cluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def job_env():
    """What every job inherits (sbatch exports the submitting environment): this interpreter and checkout."""
    return {"SPECDRAFT_PYTHON": sys.executable, "SPECDRAFT_HOME": str(REPO),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
