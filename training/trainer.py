"""The one place a Lightning Trainer is built: every training stage goes through `build_trainer` + `fit`.

Outputs under out_dir:
    checkpoints/last.ckpt     written every `checkpoint_every_n_steps` optimizer steps (model,
                              optimizer, scheduler, loop progress, data position, RNG)
    csv/version_N/metrics.csv one version per launch (a resumed run writes the next version)
    wandb/                    offline W&B run unless wandb.mode says otherwise

Exact resume: the data position is checkpointed by `drafters.data.ResumableDataLoader` (Lightning
saves stateful train loaders and skips the consumed batches on restart); `RNGState` restores the RNG
streams; the LR scheduler and optimizer are in the checkpoint. Under Slurm, Lightning's SLURMEnvironment
sets ranks and the main address; `SlurmRequeue` answers the requeue signal (the sbatch templates'
--signal=SIGUSR1@90, or `scancel --signal=USR1 JOB`) by writing last.ckpt at the next optimizer-step
boundary and requeueing the job, which then resumes from last.ckpt like any other resume. (Lightning's
own handler saves an hpc_ckpt from inside the signal handler, in the middle of a batch, whose data
position can be one batch ahead of its weights.)
"""
from __future__ import annotations

import difflib
import os
import random
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment

from specdraft.core.errors import InputError
from specdraft.core import devices  # the CPU's bf16 units: one probe for inference and training

STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
GPU_ONLY_STRATEGIES = ("fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
PRECISIONS = {"32": "32-true", "32-true": "32-true", "bf16-mixed": "bf16-mixed", "16-mixed": "16-mixed"}
# On a CPU with bf16 units, bf16 autocast (fp32 master weights and optimizer) pays from about this size. Measured on
# the project's Xeon with AMX, 2 threads, the stage's module and Trainer (benchmarks/training/bench_train_precision.py):
# a step 1.21x faster for the 630M Qwen 0.5B sibling (2 x 256 tokens), 1.24x for a 14M SmolLM2 drafter (8 x 256),
# with the same dev agreement at every step measured; by hand, a plain loop at 16 x 128 tokens: 1.00x for a 4.7M
# model and 0.78x for a 0.4M one, whose steps are op overhead that the casts add to
BF16_MIXED_MIN_PARAMETERS = 10_000_000


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # Lightning's name: "32-true", "bf16-mixed" or "16-mixed"
    why: str  # one line for the stage's log


WANDB_MODES = ("online", "offline", "disabled")


def _closest(value: str, valid) -> str:
    match = difflib.get_close_matches(str(value), list(valid), n=1, cutoff=0.0)
    return match[0] if match else list(valid)[0]


@dataclass
class WandbConfig:
    mode: str = "offline"  # online | offline | disabled; offline runs can be `wandb sync`ed later
    project: str = "specdraft"  # W&B project name
    run_name: str | None = None  # None: W&B picks a name

    def check(self) -> None:
        if self.mode not in WANDB_MODES:
            raise InputError(
                f"wandb.mode {self.mode!r} is not valid; did you mean {_closest(self.mode, WANDB_MODES)!r}? "
                f"(choose from {list(WANDB_MODES)})"
            )


@dataclass
class TrainerConfig:
    # a config that gives max_epochs and not max_steps trains for epochs, whatever max_steps its section defaults to
    GIVEN_IMPLIES: ClassVar[dict] = {"max_epochs": {"max_steps": -1}}
    max_steps: int = -1  # optimizer steps; -1: run max_epochs
    max_epochs: int = 1  # used when max_steps is -1
    batch_size: int = 8  # per device
    accumulate_grad_batches: int = 1  # batches per optimizer step
    # "32" | "bf16-mixed" | "16-mixed"; None: bf16-mixed on CUDA with bf16, and on a CPU with bf16 units for a model
    # of at least BF16_MIXED_MIN_PARAMETERS; 32 elsewhere (choose_precision says which and why)
    precision: str | None = None
    strategy: str = "auto"  # auto | ddp | ddp_spawn | fsdp | deepspeed_stage_2 | deepspeed_stage_3
    accelerator: str = "auto"  # auto | cpu | gpu
    devices: int | str = "auto"  # per node: a count, or "auto"
    num_nodes: int = 1  # nodes (Slurm: one task per device)
    gradient_clip_val: float | None = 1.0  # by norm; None disables clipping
    checkpoint_every_n_steps: int = 200  # 0: no periodic checkpoints (last.ckpt still at the end)
    # false: no last.ckpt at all, not even at the end (a killed fit starts over): for a model whose checkpoint
    # (weights and optimizer, written through an in-memory buffer) would not fit in memory beside the model
    save_last: bool = True
    resume: bool = False  # continue from out_dir/checkpoints/last.ckpt when it exists (stages always do)
    log_every_n_steps: int = 10  # metrics logging interval
    seed: int = 0  # seeds the fit (stages set it from run.seed)
    wandb: WandbConfig = field(default_factory=WandbConfig)  # Weights & Biases logging

    def check(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InputError(
                f"trainer.strategy {self.strategy!r} is not valid; did you mean "
                f"{_closest(self.strategy, STRATEGIES)!r}? (choose from {list(STRATEGIES)})"
            )
        if self.precision is not None and self.precision not in PRECISIONS:
            raise InputError(
                f"trainer.precision {self.precision!r} is not valid; did you mean "
                f"{_closest(self.precision, PRECISIONS)!r}? (or null for automatic)"
            )
        if self.max_steps == 0 or self.max_steps < -1:
            raise InputError(f"trainer.max_steps must be >= 1, or -1 to use max_epochs; got {self.max_steps}")
        if self.max_steps == -1 and self.max_epochs < 1:
            raise InputError(f"trainer.max_epochs must be >= 1 when max_steps is -1; got {self.max_epochs}")
        for name in ("batch_size", "accumulate_grad_batches", "num_nodes", "log_every_n_steps"):
            if getattr(self, name) < 1:
                raise InputError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        if self.checkpoint_every_n_steps < 0:
            raise InputError(f"trainer.checkpoint_every_n_steps must be >= 0, got {self.checkpoint_every_n_steps}")
        self.wandb.check()

    def on_cuda(self) -> bool:
        """Whether this config trains on CUDA GPUs: one is visible and the accelerator is not forced to cpu."""
        return torch.cuda.is_available() and self.accelerator != "cpu"

    def choose_precision(self, parameters: int | None = None) -> PrecisionChoice:
        """The Lightning precision this config trains in and why; `parameters`: the trained model's count (None:
        unknown, which keeps a CPU in fp32). An explicit choice the device cannot run is refused in one line."""
        cuda = self.on_cuda()
        if self.precision is not None:
            chosen = PRECISIONS[self.precision]
            if chosen == "16-mixed" and not cuda:
                raise InputError(f"trainer.precision {self.precision!r} needs a CUDA GPU; use '32', 'bf16-mixed' "
                                 "(on a CPU with bf16 units) or null on CPU")
            if chosen == "bf16-mixed" and not cuda and not devices.cpu_bf16_units():
                raise InputError(f"trainer.precision {self.precision!r} on this CPU: it has no bf16 units "
                                 "(avx512_bf16 or AMX), so autocast would convert every element; use '32' or null")
            return PrecisionChoice(chosen, "as given")
        if cuda:
            if torch.cuda.is_bf16_supported():
                return PrecisionChoice("bf16-mixed", "auto: this CUDA device has bf16")
            return PrecisionChoice("32-true", "auto: this CUDA device has no bf16")
        units = devices.cpu_bf16_units()
        if not units:
            return PrecisionChoice("32-true", "auto: this CPU has no bf16 units (avx512_bf16 or AMX)")
        pays = f"bf16 autocast pays on a CPU from {BF16_MIXED_MIN_PARAMETERS / 1e6:.0f}M parameters"
        if parameters is None:
            return PrecisionChoice("32-true", f"auto: the model's size was not given ({pays})")
        if parameters < BF16_MIXED_MIN_PARAMETERS:
            return PrecisionChoice("32-true", f"auto: a model of {parameters / 1e6:.1f}M parameters ({pays})")
        return PrecisionChoice("bf16-mixed", f"auto: this CPU has {'/'.join(units)} and the model "
                                             f"{parameters / 1e6:.0f}M parameters")


class RNGState(Callback):
    """Saves and restores this process's RNG streams (python, numpy, torch CPU and CUDA) in the
    checkpoint, so sampling-based code (dropout, on-the-fly sampling) continues identically."""

    def state_dict(self) -> dict:
        # plain tensors and tuples only: checkpoints are loaded with torch.load(weights_only=True)
        name, keys, pos, has_gauss, gauss = np.random.get_state()
        numpy_state = (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss))
        state = {"python": random.getstate(), "numpy": numpy_state, "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict) -> None:
        random.setstate(state["python"])
        name, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


class FSDPGradientClipping(Callback):
    """Clip by global norm under FSDP, where Lightning refuses `gradient_clip_val` ("'norm' is not
    supported for FSDPPrecision"): the norm must come from the root FSDP module's `clip_grad_norm_`,
    which reduces over shards (torch.nn.utils.clip_grad_norm_ would see one shard only)."""

    def __init__(self, max_norm: float):
        self.max_norm = max_norm

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        trainer.strategy.model.clip_grad_norm_(self.max_norm)


_requeue_requested = False  # set by the requeue signal; read at the next optimizer-step boundary


def _note_requeue_signal(signum, frame) -> None:
    global _requeue_requested
    _requeue_requested = True  # acted on at the next step boundary: the handler may run mid-batch


def install_requeue_handler(signum: int = signal.SIGUSR1) -> None:
    """Under Slurm, for the whole process: the requeue signal only sets a flag. A signal that lands
    between two fits (after one drafter finished, before the next started, or while data loads) would
    otherwise meet the default action and kill the job (FAILED, never requeued); with the flag, the next
    fit checkpoints at its first step boundary and requeues, and a stage that has no fit left finishes.
    Installed before any fit, this handler also keeps Lightning from installing its own (it registers
    only over SIG_DFL) and is what Lightning restores when a fit tears down."""
    if signal.getsignal(signum) is not _note_requeue_signal:
        signal.signal(signum, _note_requeue_signal)


def requeue_requested() -> bool:
    return _requeue_requested


class SlurmRequeue(Callback):
    """Under Slurm: on the requeue signal, every rank stops at the same optimizer-step boundary, last.ckpt
    is written there, rank 0 runs `scontrol requeue`, and the process exits (Slurm restarts the job).
    The exit waits for the next batch start, so the interrupted step's metrics are logged first."""

    def __init__(self):
        self.pending, self._step = False, 0

    def on_train_start(self, trainer, module) -> None:
        self._step = trainer.global_step
        print(f"[slurm] job {os.environ.get('SLURM_JOB_ID', '?')} rank {trainer.global_rank}/{trainer.world_size}: "
              f"training from step {trainer.global_step}"
              + (f" (resumed from {trainer.ckpt_path})" if trainer.ckpt_path else ""), flush=True)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self._step or self.pending:
            return  # inside gradient accumulation: no consistent resume point yet
        self._step = trainer.global_step
        if not trainer.strategy.reduce_boolean_decision(requeue_requested(), all=False):
            return
        path = checkpoint_dir(trainer.default_root_dir) / "last.ckpt"
        trainer.save_checkpoint(path)
        self.pending = True
        print(f"[slurm] requeue signal: checkpoint at step {trainer.global_step} -> {path}", flush=True)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if self.pending:
            self._requeue_and_exit(trainer)

    def on_train_end(self, trainer, module) -> None:
        if self.pending:  # the signal came during the last step
            self._requeue_and_exit(trainer)

    def _requeue_and_exit(self, trainer) -> None:
        global _requeue_requested
        _requeue_requested = False  # answered: a fit in this same process (tests) starts clean
        job = os.environ.get("SLURM_JOB_ID", "")
        if "SLURM_ARRAY_JOB_ID" in os.environ:
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        trainer.strategy.barrier()
        # the requeue makes Slurm SIGTERM every task; a task killed by it on its way out ends the step with a
        # failure that can race the requeue and leave the job FAILED instead of pending (seen in CI). The
        # checkpoint is written: every task now ignores SIGTERM and exits 0 by itself
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # ...also after the fit: Lightning's teardown puts back the handlers it found when the fit began
        originals = getattr(getattr(trainer, "_signal_connector", None), "_original_handlers", None)
        if isinstance(originals, dict):
            originals[signal.SIGTERM] = signal.SIG_IGN
        if trainer.is_global_zero:
            print(f"[slurm] requeueing job {job}", flush=True)
            subprocess.run(["scontrol", "requeue", job], check=False)
        raise SystemExit(0)  # nothing is committed; the requeued job resumes from last.ckpt


def checkpoint_dir(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def build_trainer(cfg: TrainerConfig, out_dir: str | Path | None, callbacks: list[Callback] | None = None,
                  parameters: int | None = None, **overrides: Any) -> L.Trainer:
    """A Trainer with loggers, periodic last.ckpt, RNG checkpointing and Slurm requeue from `cfg`.

    out_dir None: an in-memory fit (no loggers, checkpoints, requeue or progress bar) for fits that take
    seconds and are redone rather than resumed (the acceptance heads). `overrides`: further
    lightning.Trainer arguments, applied last. `parameters`: the trained model's, for `choose_precision`."""
    cfg.check()
    cuda = cfg.on_cuda()
    if cfg.strategy in GPU_ONLY_STRATEGIES and not cuda:
        raise InputError(
            f"trainer.strategy {cfg.strategy!r} needs CUDA GPUs and none is available; use 'ddp' (or 'auto') on CPU"
        )
    choice = cfg.choose_precision(parameters)
    precision = choice.precision

    precision_and_devices = dict(
        max_steps=cfg.max_steps,
        max_epochs=cfg.max_epochs if cfg.max_steps == -1 else None,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        precision=precision,
        strategy=cfg.strategy,
        accelerator=cfg.accelerator,
        devices=cfg.devices,
        num_nodes=cfg.num_nodes,
        log_every_n_steps=cfg.log_every_n_steps,
        enable_model_summary=False,
        # the batch sampler of drafters.data shards over ranks itself so that its position can be
        # checkpointed; Lightning's DistributedSampler injection would replace it
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
    )
    if out_dir is None:
        return L.Trainer(**{**precision_and_devices, "gradient_clip_val": cfg.gradient_clip_val, "logger": False,
                            "enable_checkpointing": False, "enable_progress_bar": False,
                            "callbacks": list(callbacks or []), **overrides})
    out_dir = Path(out_dir)
    print(f"[train] precision {precision} ({choice.why})")
    loggers = [CSVLogger(out_dir, name="csv", flush_logs_every_n_steps=cfg.log_every_n_steps)]
    if cfg.wandb.mode != "disabled":
        from lightning.pytorch.loggers import WandbLogger

        (out_dir / "wandb").mkdir(parents=True, exist_ok=True)
        loggers.append(
            WandbLogger(
                project=cfg.wandb.project,
                name=cfg.wandb.run_name,
                save_dir=str(out_dir),
                mode=cfg.wandb.mode,  # passed to wandb.init (offline=True would set WANDB_MODE globally)
            )
        )
    ckpt = ModelCheckpoint(
        dirpath=checkpoint_dir(out_dir),
        every_n_train_steps=cfg.checkpoint_every_n_steps or None,
        save_top_k=0,  # only last.ckpt: a resume point, not a model zoo (stages export the model)
        save_last=True,
    )
    plugins, extra = None, list(callbacks or [])
    if SLURMEnvironment.detect():
        env = SLURMEnvironment(auto_requeue=True)
        plugins = [env]
        install_requeue_handler(env.requeue_signal)  # before the fit, so Lightning installs none of its own
        extra.append(SlurmRequeue())
    clip = cfg.gradient_clip_val
    if cfg.strategy == "fsdp" and clip is not None:
        extra.append(FSDPGradientClipping(clip))
        clip = None
    return L.Trainer(**{
        **precision_and_devices,
        "default_root_dir": out_dir,
        "gradient_clip_val": clip,
        "gradient_clip_algorithm": "norm",
        "logger": loggers,
        "callbacks": [ckpt, RNGState(), *extra] if cfg.save_last else extra,
        "enable_checkpointing": cfg.save_last,
        "plugins": plugins,
        "enable_progress_bar": True,
        **overrides,
    })


def fit(trainer: L.Trainer, module: L.LightningModule, datamodule: L.LightningDataModule, cfg: TrainerConfig) -> None:
    """trainer.fit, resuming from checkpoints/last.ckpt when cfg.resume is true and it exists."""
    ckpt_path = None
    if cfg.resume:
        last = checkpoint_dir(trainer.default_root_dir) / "last.ckpt"
        ckpt_path = str(last) if last.is_file() else None
        if ckpt_path:
            print(f"[train] resuming from {ckpt_path}", flush=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    finish_wandb_run(trainer)


def finish_wandb_run(trainer: L.Trainer) -> None:
    """End the W&B run this fit logged to. Lightning leaves it open (for a later trainer.test), and
    wandb.init hands an open run to the next WandbLogger in the same process: a second stage run in
    one process (`specdraft run`, the tests) would log into the first stage's run and directory."""
    from lightning.pytorch.loggers import WandbLogger

    if trainer.is_global_zero and any(isinstance(logger, WandbLogger) for logger in trainer.loggers):
        import wandb

        if wandb.run is not None:
            wandb.finish()
