"""The sbatch templates and chain.sh on a real (throwaway, local) Slurm cluster, on the stage tests' tiny
config: every job's result is compared with the same stage run in one process without Slurm.

Every comparison is exact (file hashes): the DDP jobs against one process with batch_size=1 and
accumulate_grad_batches=2 (why that is bit-identical: test_two_task_ddp_equals_single_process), the
requeued jobs against uninterrupted runs, the array against one process, chain.sh against `specdraft run`.
The cluster fixture is in conftest.py; `make test-slurm` runs this file.
"""
import hashlib
import json
import os
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from specdraft.pipelines.config import load_config
from specdraft.pipelines.schema import RunConfig
from specdraft.pipelines.stage import STAGE_NAMES, run_stage

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "slurm"


def write_config(path: Path, root: Path, **sections) -> Path:
    """The stage tests' tiny config (tests/pipelines/conftest.py) as a YAML file for the CLI."""
    from specdraft.pipelines.config import to_dict
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


def _completed(states: dict, log: str = "") -> None:
    for job, st in states.items():
        summary = {k: st.get(k) for k in ("JobState", "Reason", "ExitCode", "Restarts", "RunTime", "StartTime")}
        assert st.get("JobState") == "COMPLETED" and st.get("ExitCode") == "0:0", f"job {job}: {summary}\n{log[-3000:]}"


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


def _copy(template: Path | None, tmp_path: Path, name: str, **sections) -> tuple[Path, Path]:
    """(run root, its config file): a copy of a finished template run (or an empty root)."""
    root = tmp_path / name / "run"
    if template is not None:
        shutil.copytree(template, root)
    else:
        root.parent.mkdir(parents=True)
    return root, write_config(root.parent / "cfg.yaml", root, **sections)


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


@pytest.fixture(scope="session")
def accumulated(distilled, tmp_path_factory):
    """train-drafters in one process, batch_size=1 and accumulate_grad_batches=2: what 2 DDP tasks equal."""
    ref, ref_cfg = _copy(distilled, tmp_path_factory.mktemp("accumulated"), "single")
    _run_in_process(ref_cfg, ("train-drafters",), *_per_device(1, accumulate_grad_batches=2))
    return ref


def test_two_task_ddp_equals_single_process(slurm, job_env, distilled, accumulated, tmp_path):
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
    _completed(states, log)
    assert "rank 0 of 2" in log and "rank 1 of 2" in log, log[-3000:]
    assert "rank 1/2: training from step 0" in log  # DDP world of 2 (SlurmRequeue's start line)
    assert "rank 1 finished training; rank 0 writes the stage output" in log

    ref = accumulated
    got, want = _weights(root, "drafters"), _weights(ref, "drafters")
    assert sorted(got) == ["base/model.safetensors", "math/model.safetensors", "ofa/model.safetensors",
                           "translate/model.safetensors"]
    assert got == want
    steps = {n: json.loads((root / "drafters" / n / "drafter.json").read_text())["finetune"]["steps"]
             for n in ("math", "ofa")}
    assert steps == {n: json.loads((ref / "drafters" / n / "drafter.json").read_text())["finetune"]["steps"]
                     for n in ("math", "ofa")}


LONG = [f"train_drafters.finetune.train.{k}={v}" for k, v in
        {"max_steps": 40, "checkpoint_every_n_steps": 2, "accelerator": "cpu"}.items()]


@pytest.fixture(scope="module")
def uninterrupted(distilled, tmp_path_factory):
    ref, ref_cfg = _copy(distilled, tmp_path_factory.mktemp("uninterrupted"), "run")
    _run_in_process(ref_cfg, ("train-drafters",), *LONG)
    return ref


@pytest.mark.parametrize("how", ["signal", "scontrol"])
def test_requeue_mid_training_resumes_to_the_uninterrupted_result(slurm, job_env, distilled, uninterrupted, tmp_path,
                                                                  how):
    """train-drafters is interrupted while its first finetuned drafter trains, either by the requeue signal
    the template sets (--signal=SIGUSR1@90; sent now with `scancel --signal=USR1`): last.ckpt at the next
    step boundary, then the job requeues itself; or by `scontrol requeue` (SIGTERM, then SIGKILL after
    KillWait): the job restarts from the periodic last.ckpt. Either way the requeued job resumes from
    the checkpoint and the drafters equal an uninterrupted run's."""
    root, cfg_file = _copy(distilled, tmp_path, "requeued")
    job = _submit(slurm, job_env, root.parent, str(SLURM / "stage.sbatch"), "train-drafters", str(cfg_file), *LONG)
    t0 = time.time()
    while not list((root / ".work").glob("drafters-*/math/train/checkpoints/last.ckpt")):
        assert slurm.job_state(job).get("JobState") in ("PENDING", "RUNNING"), _log(root.parent, "slurm-*.out")
        assert time.time() - t0 < 240, "train-drafters never checkpointed its first finetuned drafter"
        time.sleep(0.1)
    if how == "signal":
        slurm.run("scancel", "--signal=USR1", job)
    else:
        slurm.run("scontrol", "requeue", job)
    # Slurm holds a requeued batch job for about two minutes (BeginTime), long enough for the first run's
    # tasks to be gone; release it sooner for the test's sake, but only once the node is idle again
    t0 = time.time()
    while time.time() - t0 < 120:
        st = slurm.job_state(job)
        if st.get("Restarts") == "1" and st.get("JobState") == "PENDING":
            if slurm.nodes_idle():
                slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now", check=False)
        elif st.get("Restarts") == "1" and st.get("JobState") in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED"):
            break
        time.sleep(0.5)
    states = slurm.wait([job], timeout=300)
    log = _log(root.parent, f"slurm-specdraft-{job}.out")
    _completed(states, log)
    assert states[job]["Restarts"] == "1", log[-3000:]
    assert "restart 1 (requeued)" in log and "resuming from" in log
    resumed = [int(s) for s in re.findall(r"training from step (\d+) \(resumed from", log)]
    assert resumed and all(0 < s < 40 for s in resumed), log[-3000:]
    if how == "signal":
        stop = re.search(r"requeue signal: checkpoint at step (\d+)", log)
        assert stop and int(stop.group(1)) in resumed, log[-3000:]  # resumed exactly where it stopped
    assert _weights(root, "drafters") == _weights(uninterrupted, "drafters")


# the whole pipeline, smaller still where the stage tests' tiny config leaves minutes of work
CHAIN = {"train_router": {"train": {"max_epochs": 1, "batch_size": 32, "wandb": {"mode": "disabled"}}},
         "evaluate": {"prompts_per_domain": 1, "sampling_prompts": 0, "bandits": ["ucb-bd"], "stream_bandits": []}}
COUNTS = ("N", "N_target", "N_draft", "N_discarded", "MAT")


def _report_counts(root: Path) -> dict:
    """The report's exact numbers: token counts and MAT per row (its times and speedups are measured)."""
    rows = json.loads((root / "report" / "metrics.json").read_text())["rows"]
    key = ("set", "domain", "method", "mode", "drafter", "k")
    return {tuple(str(r.get(k)) for k in key): tuple(r.get(c) for c in COUNTS) for r in rows}


def _root_free_bundle(root) -> tuple[dict, dict]:
    """(bundle.json less the hashes of its vllm/ files, those files' text with the bundle's own path taken out)."""
    bundle = root / "bundle"
    meta = json.loads((bundle / "bundle.json").read_text())
    meta["files"] = {rel: h for rel, h in meta["files"].items() if not rel.startswith("vllm/")}
    texts = {p.relative_to(bundle).as_posix(): p.read_text().replace(str(bundle.resolve()), "<bundle>")
             for p in sorted((bundle / "vllm").rglob("*.json"))} if (bundle / "vllm").is_dir() else {}
    return meta, texts


def test_chain_equals_specdraft_run(slurm, job_env, distilled, tmp_path):
    """slurm/chain.sh submits every stage as dependent jobs (distill-data, teacher-data and evaluate each as a
    2-task array + merge job); its drafters, heads, bundle.json and report counts equal `specdraft run` on the same
    config."""
    root, cfg_file = _copy(None, tmp_path, "chain", **CHAIN)
    out = slurm.run(str(SLURM / "chain.sh"), str(cfg_file), "2", "2", cwd=root.parent, env=job_env)
    jobs = out.split()
    assert len(jobs) == 14 and all(j.isdigit() for j in jobs), out
    arrays = (jobs[3], jobs[5], jobs[12])  # distill-data's, teacher-data's and evaluate's
    states = slurm.wait(jobs, timeout=900)
    for a in arrays:
        states.update({f"{a}_{i}": slurm.job_state(f"{a}_{i}") for i in range(2)})
        del states[a]
    _completed(states)
    # each job started after the one before it ended (an array: after its last task)
    when = {j: (datetime.fromisoformat(s["StartTime"]), datetime.fromisoformat(s["EndTime"])) for j, s in states.items()}
    spans = [when[j] if j in when else (min(when[f"{j}_{i}"][0] for i in range(2)), max(when[f"{j}_{i}"][1] for i in range(2)))
             for j in jobs]
    assert all(spans[i][0] >= spans[i - 1][1] for i in range(1, len(spans))), spans
    # evaluate: each array task ran its own share of the plan's units; one of them (or the merge job) merged
    eval_logs = _log(root.parent, f"slurm-specdraft-evaluate-{jobs[12]}_*.out")
    shares = {int(i): int(n) for i, n in re.findall(r"shard (\d)/2: \d+ of its (\d+) units to run", eval_logs)}
    assert sorted(shares) == [0, 1] and all(shares.values()), eval_logs[-3000:]
    merge_log = _log(root.parent, f"slurm-specdraft-{jobs[13]}.out")
    assert ("[evaluate] done in" in eval_logs) != ("[evaluate] done in" in merge_log), merge_log[-3000:]
    assert "[evaluate] cache hit" in merge_log or "[evaluate] done in" in merge_log, merge_log[-3000:]

    from specdraft.pipelines.cli import main

    ref, ref_cfg = _copy(distilled, tmp_path, "ref", **CHAIN)  # its first three stages are cache hits
    assert main(["run", str(ref_cfg)]) == 0
    for stage_dir in ("drafters", "heads", "bundle"):
        assert _weights(root, stage_dir) == _weights(ref, stage_dir), stage_dir
        assert _weights(root, stage_dir)
    # vLLM's speculative configs name where their bundle sits (a user pastes them as they are): equal but for that
    # root, and bundle.json equal but for those files' hashes
    assert _root_free_bundle(root) == _root_free_bundle(ref)
    assert _report_counts(root) == _report_counts(ref)
    logs = _log(root.parent, "slurm-*.out")
    # every stage ran as a job of its own, but convert-target, which a config without a GGUF target skips, and
    # teacher-data, which this config's drafters (ce on the target's answers, no EAGLE) do not read
    skipped = ("convert-target", "teacher-data")
    assert all(f"[{stage}] slurm job" in logs for stage in STAGE_NAMES if stage not in skipped), logs[-3000:]
    assert "[convert-target] skipped: no GGUF target" in logs
    assert "[teacher-data] skipped: no drafter's training reads it" in logs


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """A second cluster: slurmctld + slurmd n1 in one network namespace, slurmd n2 in another, joined by
    a veth pair (addresses only inside the two namespaces; clients run in the first one)."""
    from slurm_cluster import Cluster, TwoHostNetwork, missing_binaries

    if missing_binaries():
        pytest.skip("Slurm is not installed; `make test-slurm` installs it")
    if shutil.which("nsenter") is None or shutil.which("ip") is None:
        pytest.skip("needs `ip` (iproute2) and `nsenter` (util-linux) for the two network namespaces")
    net = TwoHostNetwork(str(os.getpid())).start()
    try:
        cluster = Cluster(tmp_path_factory.mktemp("slurm2"), nodes=[("n1", net.addrs[0]), ("n2", net.addrs[1])],
                          ctld_addr=net.addrs[0], netns={"n1": net.names[0], "n2": net.names[1]},
                          ctld_netns=net.names[0]).start()
        try:
            yield cluster, net
        finally:
            cluster.stop()
    finally:
        net.stop()


def test_two_nodes_ddp_equals_single_process(two_hosts, job_env, distilled, accumulated, tmp_path):
    """--nodes=2, one task per node, DDP across the two hosts (gloo over the veth pair): the same
    drafters as one process with accumulate_grad_batches=2 (see test_two_task_ddp_equals_single_process).
    MASTER_ADDR and GLOO_SOCKET_IFNAME name the first host's address and the interface, as on a cluster
    whose node names do not resolve or whose nodes have several interfaces."""
    cluster, net = two_hosts
    env = {**job_env, "MASTER_ADDR": net.addrs[0], "GLOO_SOCKET_IFNAME": net.ifname}
    root, cfg_file = _copy(distilled, tmp_path, "two_nodes")
    job = _submit(cluster, env, root.parent, "--nodes=2", "--ntasks-per-node=1", str(SLURM / "stage.sbatch"),
                  "train-drafters", str(cfg_file), *_per_device(1, strategy="ddp", devices=1, num_nodes=2))
    states = cluster.wait([job], timeout=300)
    log = _log(root.parent, f"slurm-specdraft-{job}.out")
    _completed(states, log)
    assert "rank 0 of 2, node n1" in log and "rank 1 of 2, node n2" in log, log[-3000:]
    assert _weights(root, "drafters") == _weights(accumulated, "drafters")
