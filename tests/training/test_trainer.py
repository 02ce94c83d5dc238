import csv
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
from specdraft.drafters.lit_lm import CausalLMModule
from specdraft.drafters.model import build_causal_lm
from specdraft.core import devices
from specdraft.training.trainer import BF16_MIXED_MIN_PARAMETERS, TrainerConfig, WandbConfig, build_trainer, fit

REPO = Path(__file__).resolve().parents[2]
V = 48


def _data(n=20):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, V, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g).tolist()} for _ in range(n)]


def _cfg(**kw) -> TrainerConfig:
    base = dict(
        max_steps=8, batch_size=4, checkpoint_every_n_steps=3, log_every_n_steps=1,
        accelerator="cpu", wandb=WandbConfig(mode="disabled"), seed=0,
    )
    return TrainerConfig(**{**base, **kw})


def _run(out_dir, cfg, callbacks=None, parameters=None):
    module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0), lr=1e-2)
    dm = CausalLMDataModule(_data(), CausalLMCollator(pad_token_id=0), batch_size=cfg.batch_size, seed=cfg.seed)
    trainer = build_trainer(cfg, out_dir, callbacks=callbacks, parameters=parameters)
    fit(trainer, module, dm, cfg)
    return trainer


def _logged(out_dir, key="train/loss") -> dict[int, float]:
    """step -> value over all CSV versions in launch order (a later launch overrides a step)."""
    curve = {}
    for version in sorted((Path(out_dir) / "csv").glob("version_*"), key=lambda p: int(p.name.split("_")[1])):
        with open(version / "metrics.csv") as f:
            for row in csv.DictReader(f):
                if row.get(key):
                    curve[int(row["step"])] = float(row[key])
    return curve


class Crash(L.Callback):
    """Dies in the middle of an epoch, after some checkpoints were written (a preempted job)."""

    def __init__(self, at_step):
        self.at_step = at_step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.at_step:
            raise RuntimeError("simulated preemption")


def test_resumed_run_reproduces_the_uninterrupted_loss_curve(tmp_path):
    # 20 examples / batch 4 = 5 batches per epoch; 8 steps cross an epoch boundary; checkpoints at 3, 6
    _run(tmp_path / "straight", _cfg())
    straight = _logged(tmp_path / "straight")
    assert sorted(straight) == list(range(8))
    assert len({round(v, 4) for v in straight.values()}) == 8  # batches differ, so order matters

    with pytest.raises(RuntimeError, match="preemption"):
        _run(tmp_path / "resumed", _cfg(), callbacks=[Crash(at_step=5)])  # last.ckpt is from step 3
    trainer = _run(tmp_path / "resumed", _cfg(resume=True))
    resumed = _logged(tmp_path / "resumed")
    assert trainer.global_step == 8
    assert sorted(resumed) == list(range(8))
    for step in range(8):
        assert resumed[step] == pytest.approx(straight[step], abs=1e-6), step
    lr = _logged(tmp_path / "straight", "train/lr")
    assert lr[0] < lr[1] and lr[7] < lr[2]  # linear warmup (1 step at 3% of 8), then cosine decay


def test_strategy_and_precision_are_validated(tmp_path):
    with pytest.raises(InputError, match="did you mean 'ddp'"):
        build_trainer(_cfg(strategy="dpp"), tmp_path)
    with pytest.raises(InputError, match="did you mean 'bf16-mixed'"):
        build_trainer(_cfg(precision="bf16"), tmp_path)
    with pytest.raises(InputError, match="wandb.mode"):
        build_trainer(_cfg(wandb=WandbConfig(mode="offine")), tmp_path)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_gpu_only_strategies_are_refused_on_cpu(tmp_path, strategy):
    with pytest.raises(InputError, match="needs CUDA"):
        build_trainer(_cfg(strategy=strategy), tmp_path)


@pytest.mark.parametrize("units, parameters, chosen", [
    ((), 600_000_000, "32-true"),  # no bf16 units: bf16 would be converted element by element
    (("avx512_bf16",), None, "32-true"),  # a model of unknown size stays in fp32
    (("avx512_bf16", "AMX"), BF16_MIXED_MIN_PARAMETERS - 1, "32-true"),  # small: the casts cost more than they save
    (("avx512_bf16", "AMX"), BF16_MIXED_MIN_PARAMETERS, "bf16-mixed"),
    (("AMX",), 600_000_000, "bf16-mixed"),
])
def test_automatic_precision_on_cpu_follows_the_units_and_the_size(monkeypatch, units, parameters, chosen):
    monkeypatch.setattr(devices, "cpu_bf16_units", lambda: units)
    choice = _cfg().choose_precision(parameters)
    assert choice.precision == chosen and choice.why.startswith("auto: ")


def test_explicit_precision_on_cpu_is_what_runs_or_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(devices, "cpu_bf16_units", lambda: ())
    assert _cfg(precision="32").choose_precision(10**9).precision == "32-true"  # given: never replaced
    with pytest.raises(InputError, match="no bf16 units .* use '32' or null"):
        build_trainer(_cfg(precision="bf16-mixed"), tmp_path)
    with pytest.raises(InputError, match="needs a CUDA GPU"):
        build_trainer(_cfg(precision="16-mixed"), tmp_path)
    monkeypatch.setattr(devices, "cpu_bf16_units", lambda: ("AMX",))
    assert _cfg(precision="bf16-mixed").choose_precision(1).precision == "bf16-mixed"  # given, even when small


def test_bf16_mixed_trains_on_cpu(monkeypatch, tmp_path, capsys):
    # autocast runs on any CPU (slowly where it has no bf16 units): the fit is what is checked here
    monkeypatch.setattr(devices, "cpu_bf16_units", lambda: ("AMX",))
    trainer = _run(tmp_path, _cfg(max_steps=3), parameters=BF16_MIXED_MIN_PARAMETERS)
    assert trainer.precision == "bf16-mixed" and trainer.global_step == 3
    assert "[train] precision bf16-mixed (auto: this CPU has AMX" in capsys.readouterr().out
    losses = list(_logged(tmp_path).values())
    assert len(losses) == 3 and all(map(math.isfinite, losses))
    # the weights stay fp32 (autocast computes in bf16; the master weights and AdamW's state do not)
    assert {p.dtype for p in trainer.lightning_module.parameters()} == {torch.float32}


_DDP_SCRIPT = textwrap.dedent(
    """
    import json, pathlib, sys
    sys.path.insert(0, {repo!r})
    from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
    from specdraft.drafters.lit_lm import CausalLMModule
    from specdraft.drafters.model import build_causal_lm
    from specdraft.core import devices
from specdraft.training.trainer import BF16_MIXED_MIN_PARAMETERS, TrainerConfig, WandbConfig, build_trainer, fit

    class Seen(__import__("lightning").Callback):
        seen = []
        def on_train_batch_start(self, trainer, module, batch, idx):
            self.seen += batch["input_ids"][:, 0].tolist()

    cfg = TrainerConfig(max_steps=3, batch_size=2, strategy="ddp", devices=2, accelerator="cpu",
                        log_every_n_steps=1, checkpoint_every_n_steps=2, wandb=WandbConfig(mode="disabled"))
    data = [{{"input_ids": [i, 1, 2, 3]}} for i in range(12)]
    module = CausalLMModule(build_causal_lm("demo-tiny", 48, seed=0), lr=1e-2)
    trainer = build_trainer(cfg, sys.argv[1], callbacks=[Seen()])
    fit(trainer, module, CausalLMDataModule(data, CausalLMCollator(0), batch_size=2), cfg)
    out = pathlib.Path(sys.argv[1]) / f"rank{{trainer.global_rank}}.json"
    out.write_text(json.dumps({{"world": trainer.world_size, "step": trainer.global_step, "seen": Seen.seen}}))
    """
)


@pytest.mark.slow
def test_ddp_with_two_cpu_processes(tmp_path):
    script = tmp_path / "ddp_run.py"
    script.write_text(_DDP_SCRIPT.format(repo=str(REPO)))
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(REPO)}
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=240
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    r0, r1 = (json.loads((tmp_path / "out" / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world"] == r1["world"] == 2 and r0["step"] == r1["step"] == 3
    assert len(r0["seen"]) == len(r1["seen"]) == 6  # 3 steps x batch 2 on each rank
    assert not set(r0["seen"]) & set(r1["seen"])  # each rank trains on its own shard
    assert (tmp_path / "out" / "checkpoints" / "last.ckpt").is_file()
    print(f"ddp test wall time {time.time() - t0:.1f}s")


def test_wandb_offline_run_is_written_under_out_dir(tmp_path):
    trainer = _run(tmp_path, _cfg(max_steps=2, wandb=WandbConfig(mode="offline", project="p", run_name="r")))
    assert [type(l).__name__ for l in trainer.loggers] == ["CSVLogger", "WandbLogger"]
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    assert _logged(tmp_path)  # CSV too


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["auto", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_gpu_strategies_train_in_bf16(tmp_path, strategy):
    cfg = _cfg(strategy=strategy, accelerator="gpu", devices=1, max_steps=4)
    assert cfg.choose_precision().precision == "bf16-mixed"
    trainer = _run(tmp_path, cfg)
    assert trainer.global_step == 4
    assert trainer.precision == "bf16-mixed"
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_slurm_jobs_get_auto_requeue(tmp_path, slurm_job):
    from lightning.pytorch.plugins.environments import SLURMEnvironment

    env = build_trainer(_cfg(devices=1), tmp_path)._accelerator_connector.cluster_environment
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue


class SignalAt(L.Callback):
    """Sends this process the requeue signal in the middle of a batch (as Slurm's --signal does)."""

    def __init__(self, step):
        self.step = step

    def on_before_backward(self, trainer, module, loss):
        if trainer.global_step == self.step:
            import signal

            os.kill(os.getpid(), signal.SIGUSR1)


@pytest.fixture
def slurm_job(monkeypatch):
    """This process as task 0 of Slurm job 7; yields the list `scontrol requeue` calls are recorded in.
    The requeue path changes this process's SIGUSR1 and SIGTERM dispositions (it ignores SIGTERM on its way
    out); they are put back after the test, or later tests' child processes would inherit them."""
    import signal

    import specdraft.training.trainer as training

    slurm = dict(SLURM_NTASKS="1", SLURM_NTASKS_PER_NODE="1", SLURM_JOB_NAME="train", SLURM_JOB_ID="7",
                 SLURM_NODELIST="node1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0")
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    calls = []
    monkeypatch.setattr(training.subprocess, "run", lambda argv, **kw: calls.append(argv))
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR1, signal.SIGTERM)}
    yield calls
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_requeue_signal_checkpoints_at_the_next_step_and_resumes_exactly(tmp_path, slurm_job):
    _run(tmp_path / "straight", _cfg())
    straight = _logged(tmp_path / "straight")
    calls = slurm_job
    with pytest.raises(SystemExit) as exit_info:
        _run(tmp_path / "requeued", _cfg(checkpoint_every_n_steps=0), callbacks=[SignalAt(step=4)])
    assert exit_info.value.code == 0 and calls == [["scontrol", "requeue", "7"]]
    import signal

    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN  # Slurm's kill must not fail the exiting task
    ckpt = torch.load(tmp_path / "requeued" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 5  # the step the signal interrupted was finished first
    trainer = _run(tmp_path / "requeued", _cfg(resume=True))
    resumed = _logged(tmp_path / "requeued")
    assert trainer.global_step == 8 and sorted(resumed) == list(range(8))
    for step in range(8):
        assert resumed[step] == pytest.approx(straight[step], abs=1e-6), step


def test_requeue_signal_between_fits_requeues_at_the_next_fits_first_step(tmp_path, slurm_job):
    """The signal lands after one fit ended and before the next began (train-drafters between two drafters):
    the process lives on, and the next fit checkpoints at its first step and requeues."""
    import signal

    import specdraft.training.trainer as training

    calls = slurm_job
    _run(tmp_path / "first", _cfg(checkpoint_every_n_steps=0))
    assert calls == [] and not training.requeue_requested()
    os.kill(os.getpid(), signal.SIGUSR1)  # the default action would end this process here
    assert training.requeue_requested()
    with pytest.raises(SystemExit) as exit_info:
        _run(tmp_path / "second", _cfg(checkpoint_every_n_steps=0))
    assert exit_info.value.code == 0 and calls == [["scontrol", "requeue", "7"]]
    ckpt = torch.load(tmp_path / "second" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 1 and not training.requeue_requested()


def test_each_fit_logs_to_its_own_wandb_run(tmp_path):
    """Two stages in one process (`specdraft run`) each get their own W&B run under their own out_dir:
    the first fit's run is finished, not handed to the second WandbLogger."""
    for name in ("a", "b"):
        _run(tmp_path / name, _cfg(max_steps=1, wandb=WandbConfig(mode="offline", project="p", run_name=name)))
        assert list((tmp_path / name / "wandb").glob("offline-run-*")), name


@pytest.mark.parametrize("save_last", [True, False])
def test_save_last_false_writes_no_checkpoint_even_at_the_end(tmp_path, save_last):
    """A model whose checkpoint would not fit in memory beside it (Lightning buffers the file) trains without one."""
    trainer = _run(tmp_path, _cfg(max_steps=4, checkpoint_every_n_steps=0, save_last=save_last))
    assert trainer.global_step == 4
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file() == save_last
