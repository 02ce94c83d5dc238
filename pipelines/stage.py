"""How a stage runs: check inputs, hit the cache or build into a temp dir, commit atomically.

Each stage module (`pipelines/<stage>.py`) defines `build(ctx) -> metrics` and nothing about caching,
manifests or atomicity; this file does that once for all of them.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib
import json
import os
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import (HashCache, Manifest, StageLock, StageOutput, read_manifest, tidy_stage_dir,
                                 verify_files)
from specdraft.pipelines.config import to_dict

if TYPE_CHECKING:  # annotations only: importing the schema pulls in torch and transformers (slow --help)
    from specdraft.pipelines.schema import RunConfig


@dataclass(frozen=True)
class StageSpec:
    name: str  # CLI name
    out: str  # directory under the run root
    inputs: tuple[str, ...]  # stages whose outputs it reads
    # config sections that change its output (the cache key): a section ("train_heads") or one key under
    # another stage's section ("decoding.k"); tests/pipelines/test_stage_config_reads.py checks that
    # a stage's build reads nothing else (besides UNKEYED_READS)
    sections: tuple[str, ...]
    module: str  # pipelines.<module> defines build(ctx)
    # returns a reason to skip the stage for this config (e.g. a real target needs no pretraining)
    skip: Callable[[RunConfig], str | None] = lambda cfg: None
    optional: tuple[str, ...] = ()  # inputs used when they exist (and part of the cache key then)
    # the directory under the run root when the config names one (default `out`): evaluate's `evaluate.out`
    # lets a bigger evaluation (configs/reproduce.yaml) reuse a run's trained stages beside the demo's report/
    out_from: Callable[[RunConfig], str | None] = lambda cfg: None

    def out_dir(self, cfg: RunConfig) -> str:
        return self.out_from(cfg) or self.out


def _demo_only(cfg: RunConfig) -> str | None:
    if cfg.target.name_or_path is not None:
        return f"the target is given (target.name_or_path={cfg.target.name_or_path!r})"
    if cfg.target.gguf is not None:
        return "the target is given (target.gguf)"
    return None


def _gguf_only(cfg: RunConfig) -> str | None:
    return None if cfg.target.gguf is not None else "no GGUF target (target.gguf is null)"


def _no_stored_signal(cfg: RunConfig) -> str | None:
    from specdraft.pipelines.schema import stored_signal_readers

    if stored_signal_readers(cfg):
        return None
    if not cfg.teacher_data.enabled:
        return "teacher_data.enabled is false (the drafters' training runs the target)"
    return ("no drafter's training reads it (train_drafters.finetune.loss ce on the target's answers, no "
            "teacher_data.extra rows, no EAGLE drafters, or finetune_on: reference)")


# the two stages that make the target inside the run (one runs, the other is skipped): every stage that reads
# the target lists both
IN_RUN_TARGET = ("convert-target", "pretrain-target")


STAGES: tuple[StageSpec, ...] = (
    # first: a truncated or foreign GGUF file stops the run before any stage has written
    StageSpec("convert-target", "target", (), ("target.gguf",), "convert_target", _gguf_only),
    StageSpec("prepare-data", "prompts", (), ("demo", "prompts"), "prepare_data"),
    StageSpec("pretrain-target", "target", ("prepare-data",), ("prompts", "pretrain_target"), "pretrain_target", _demo_only),
    # a drafter that drafts (distill_data.drafter) or is measured (the alignment table, acceptance-data's labels,
    # train-heads' cost ratio, the router's labels) runs with the weights decoding.draft_weights gives it
    StageSpec("distill-data", "distill_data", ("prepare-data", *IN_RUN_TARGET),
              ("target", "prompts", "distill_data", "decoding.draft_weights"), "distill_data"),
    # the target's signal over the training rows for every drafter's training: its top-k at the length the
    # readers train at, the hidden states of the layers the EAGLE drafters read; extra rows of the prompt
    # world's own text, formatted as prompts are, held-out domains excluded
    StageSpec("teacher-data", "teacher_data", ("prepare-data", *IN_RUN_TARGET, "distill-data"),
              ("target", "prompts", "teacher_data", "demo.heldout_domains", "train_drafters.finetune_on",
               "train_drafters.finetune.loss", "train_drafters.finetune.max_length", "train_drafters.eagle.enabled",
               "train_drafters.eagle.variant", "train_drafters.eagle.layers", "train_drafters.eagle.max_length"),
              "teacher_data", _no_stored_signal),
    # the general phase trains on the demo corpus less the held-out domains; with a stored signal (teacher-data)
    # no drafter's training runs the target
    StageSpec("train-drafters", "drafters", ("prepare-data", *IN_RUN_TARGET, "distill-data"),
              ("target", "prompts", "train_drafters", "demo.heldout_domains", "decoding.draft_weights"), "train_drafters",
              optional=("teacher-data",)),
    StageSpec("acceptance-data", "acceptance_data", (*IN_RUN_TARGET, "distill-data", "train-drafters"), ("target", "acceptance_data", "decoding.draft_weights"), "acceptance_data"),
    # rounds are simulated under the decoder's SpecDec++ cap (decoding.k_max), and the cost ratio is
    # timed with the drafts of a round it serves (decoding.k)
    StageSpec("train-heads", "heads", (*IN_RUN_TARGET, "train-drafters", "acceptance-data"),
              ("target", "train_heads", "decoding.k", "decoding.k_max", "decoding.draft_weights"), "train_heads"),
    # the perturbed / ood sets are answered as distill-data answers; acceptance is measured over sequences
    # of the finetune phase's length
    StageSpec("train-router", "router", ("prepare-data", *IN_RUN_TARGET, "distill-data", "train-drafters"),
              ("target", "prompts", "train_router", "distill_data", "train_drafters.finetune.max_length",
               "decoding.draft_weights"), "train_router"),
    # EAGLE drafters are served with the tree train-drafters names
    StageSpec("export", "bundle", (*IN_RUN_TARGET, "train-drafters", "train-heads"),
              ("target", "prompts", "export", "decoding", "train_drafters.eagle.tree"), "export",
              optional=("train-router", "distill-data")),
    StageSpec("evaluate", "report", ("prepare-data", "export"), ("evaluate", "target.trust_remote_code", "target.dtype", "target.quantization", "target.device_map"),
              "evaluate",
              out_from=lambda cfg: cfg.evaluate.out),
)
STAGE_NAMES = tuple(s.name for s in STAGES)
STAGE_VERSION = 2  # bump to invalidate every cached stage output after a format change


def get_spec(name: str) -> StageSpec:
    for spec in STAGES:
        if spec.name == name:
            return spec
    hint = difflib.get_close_matches(name, STAGE_NAMES, n=1, cutoff=0.0)
    raise InputError(f"unknown stage '{name}'; did you mean '{hint[0] if hint else STAGE_NAMES[0]}'?")


def stage_names(cfg: RunConfig) -> list[str]:
    """The stages `specdraft run` runs, in order: `run.stages` (checked by name before anything runs) or all."""
    for s in cfg.run.stages or []:
        if s not in STAGE_NAMES:
            hint = difflib.get_close_matches(s, STAGE_NAMES, n=1, cutoff=0.0)
            raise InputError(f"run.stages names unknown stage '{s}'; did you mean '{hint[0]}'?")
    return list(cfg.run.stages or STAGE_NAMES)


@dataclass
class Context:
    """What a stage's build() gets: the config, where to write, and its inputs' locations."""

    cfg: RunConfig
    spec: StageSpec
    root: Path
    out: Path  # temp dir; becomes root/spec.out when build() returns
    work: Path  # persistent scratch for resumable progress; removed after a successful commit
    inputs: dict[str, Path] = field(default_factory=dict)  # stage name -> finished output dir
    manifests: dict[str, Manifest] = field(default_factory=dict)
    input_hashes: dict[str, dict[str, str]] = field(default_factory=dict)  # extra inputs (external target...)

    def input(self, stage: str) -> Path:
        return self.inputs[stage]

    def target_path(self) -> str:
        """The target model: the user's (a local dir, or the snapshot dir of a hub id's pinned commit), or the
        one made in the run (convert-target's from a GGUF file, the demo's from pretrain-target)."""
        pin = target_pin(self.cfg)
        if pin is not None:
            self.input_hashes["target"] = pin.record
            return pin.load_path
        return str(self.input(self.target_stage()))

    def target_stage(self) -> str:
        """Which stage made the run's own target (an input of every stage that reads one)."""
        return next(s for s in IN_RUN_TARGET if s in self.inputs)


class StageIncomplete(Exception):
    """Raised by build() when this process finished its share but the stage as a whole is not done
    (other shards still running, or this is a non-zero rank of a multi-process training job):
    nothing is committed, progress stays in the work dir."""


def global_rank() -> int:
    """This process's rank in a multi-process job (torchrun, srun, Lightning's ddp launcher), else 0."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    if int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in os.environ:
        return int(os.environ["SLURM_PROCID"])
    return int(os.environ.get("NODE_RANK", "0")) + int(os.environ.get("LOCAL_RANK", "0"))


def on_rank_zero(trainer, write: Callable[[], Any]) -> None:
    """After a collective fit that more fits follow: rank 0 writes while the other ranks wait, so every
    rank sees the result (and makes the same skip/resume decisions) before the next collective step."""
    trainer.strategy.barrier()
    if trainer.is_global_zero:
        write()
    trainer.strategy.barrier()


def leave_unless_rank_zero(trainer) -> None:
    """After a collective fit, only rank 0 goes on to export and commit (the others would race it)."""
    trainer.strategy.barrier()
    if not trainer.is_global_zero:
        raise StageIncomplete(f"rank {trainer.global_rank} finished training; rank 0 writes the stage output")


def slurm_context() -> str | None:
    """Where this process sits in a Slurm job (job, array task, rank, node, restarts); None outside Slurm."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return None
    parts = [f"slurm job {env['SLURM_JOB_ID']}"]
    if "SLURM_ARRAY_TASK_ID" in env:
        parts.append(f"array task {env.get('SLURM_ARRAY_JOB_ID', '?')}_{env['SLURM_ARRAY_TASK_ID']}"
                     f" of {env.get('SLURM_ARRAY_TASK_COUNT', '?')}")
    parts.append(f"rank {global_rank()} of {env.get('SLURM_NTASKS', '1')}")
    parts.append(f"node {env.get('SLURMD_NODENAME', '?')}")
    if int(env.get("SLURM_RESTART_COUNT", "0")):
        parts.append(f"restart {env['SLURM_RESTART_COUNT']} (requeued)")
    return ", ".join(parts)


def stage_dir(cfg: RunConfig, name: str) -> Path:
    return Path(cfg.run.root) / get_spec(name).out_dir(cfg)


# Config keys that change how a stage logs or checkpoints, never what it writes: not in the cache key,
# so switching W&B to online or checkpointing more often does not redo finished stages.
OUTPUT_NEUTRAL_KEYS = frozenset({"wandb", "log_every_n_steps", "checkpoint_every_n_steps", "resume",
                                 "engine_url", "engine_model", "engine_python", "engine_timeout_s"})  # where an engine runs


def _without_neutral(value):
    if isinstance(value, dict):
        return {k: _without_neutral(v) for k, v in value.items() if k not in OUTPUT_NEUTRAL_KEYS}
    return value


def target_pin(cfg: RunConfig):
    """The user's target pinned (pipelines/pinning.py: content hash or hub commit), or None for a target made
    in the run (the manifest hash of convert-target or pretrain-target pins it). Cheap to repeat: file hashes are
    cached by size and mtime under run.root/.work."""
    if cfg.target.name_or_path is None:
        return None
    from specdraft.pipelines.pinning import pin_target

    cache = HashCache(Path(cfg.run.root) / ".work" / "hash-cache.json")
    pin = pin_target(cfg.target.name_or_path, cfg.target.revision, cache)
    cache.save()
    return pin


def gguf_sources(cfg: RunConfig, stage: str) -> dict:
    """The GGUF models a stage converts, by config key: convert-target's target.gguf, train-drafters' init_from
    when it names a GGUF (a string there is a checkpoint dir)."""
    if stage == "convert-target" and cfg.target.gguf is not None:
        return {"target.gguf": cfg.target.gguf}
    init = cfg.train_drafters.init_from
    if stage == "train-drafters" and init is not None and not isinstance(init, str):
        return {"train_drafters.init_from": init}
    return {}


def gguf_pins(cfg: RunConfig, stage: str) -> dict[str, dict[str, str]]:
    """What pins the bytes of each GGUF model the stage converts, for its cache key: the config's sha256, else the
    file's content hash (a new file under the same name converts again and, through the manifests, rebuilds
    everything after it)."""
    from specdraft.pipelines.gguf_file import gguf_pin

    sources = gguf_sources(cfg, stage)
    if not sources:
        return {}
    cache = HashCache(Path(cfg.run.root) / ".work" / "hash-cache.json")
    pins = {key: gguf_pin(source, key, cache) for key, source in sources.items()}
    cache.save()
    return pins


# Config reads that never change what a stage writes, so no cache key holds them: where the run lives,
# which stages `run` runs, how inputs are re-verified (recorded in the manifest), and OUTPUT_NEUTRAL_KEYS.
UNKEYED_READS = ("run.root", "run.stages", "run.verify_inputs")


def config_value(cfg: RunConfig, path: str):
    """The config value at a dotted path ("train_heads", "decoding.k")."""
    value = cfg
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _cache_key(cfg: RunConfig, spec: StageSpec, inputs: dict[str, Manifest]) -> str:
    relevant = {s: _without_neutral(to_dict(config_value(cfg, s))) for s in spec.sections}
    relevant["seed"] = cfg.run.seed
    if "target" in spec.sections and cfg.target.name_or_path is not None:
        relevant["target_pin"] = target_pin(cfg).record  # new weights under the same name rebuild
    pins = gguf_pins(cfg, spec.name)
    if pins:
        relevant["gguf_pin"] = pins
    blob = json.dumps({"stage": spec.name, "version": STAGE_VERSION, "config": relevant,
                       "inputs": {k: m.content_hash for k, m in sorted(inputs.items())}},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def load_inputs(cfg: RunConfig, spec: StageSpec) -> dict[str, Manifest]:
    """Finished manifests of the stages this one reads; one-line error naming what to run first."""
    manifests = {}
    for dep in spec.inputs + spec.optional:
        dep_spec = get_spec(dep)
        if dep_spec.skip(cfg):
            continue
        path = stage_dir(cfg, dep)
        if not any((Path(cfg.run.root) / ".locks").glob(f"{dep_spec.out_dir(cfg)}*.lock")):
            tidy_stage_dir(path)  # an input killed mid-replace is put back, not reported missing
        if dep in spec.optional and not path.is_dir():
            continue
        manifests[dep] = read_manifest(path, expect_stage=dep,
                                       hint=f"stage '{dep}' has not finished; run `specdraft {dep} --config ...` first")
    return manifests


def verify_inputs(cfg: RunConfig, manifests: dict[str, Manifest]) -> str:
    """Re-hash every file the input manifests promise, before any work (a flipped byte in a drafter
    must not reach the stages after it). Returns the mode used, which goes into the manifest."""
    mode = cfg.run.verify_inputs
    if mode == "off":
        return mode
    cache = HashCache(Path(cfg.run.root) / ".work" / "hash-cache.json" if mode == "cached" else None)
    try:
        for dep, manifest in manifests.items():
            verify_files(stage_dir(cfg, dep), manifest, cache)
    finally:
        cache.save()
    return mode


def _lock_name(spec: StageSpec, cfg: RunConfig) -> str:
    """Processes that legitimately run one stage together (distill shards: Slurm array tasks or
    SPECDRAFT_SHARD; training ranks: torchrun, srun tasks, Lightning's launcher) each take their own lock;
    two copies of the same process slot collide."""
    name = spec.out_dir(cfg)
    shard = os.environ.get("SPECDRAFT_SHARD") or os.environ.get("SLURM_ARRAY_TASK_ID")
    if shard:
        name += f".shard-{shard.replace('/', 'of')}"
    rank = global_rank()
    if rank:
        name += f".rank-{rank}"
    return name


def run_stage(cfg: RunConfig, name: str, force: bool = False, log: Callable[[str], Any] = print) -> Path | None:
    spec = get_spec(name)
    root = Path(cfg.run.root)
    out = stage_dir(cfg, name)
    reason = spec.skip(cfg)
    if reason:
        log(f"[{name}] skipped: {reason}")
        return None
    manifests = load_inputs(cfg, spec)
    key = _cache_key(cfg, spec, manifests)
    with StageLock(root, _lock_name(spec, cfg)):
        tidy_stage_dir(out)  # under the lock: no other writer is between its two renames
        if out.is_dir() and not force:
            try:
                done = read_manifest(out, expect_stage=name)
            except InputError:
                done = None
            if done is not None and done.cache_key == key:
                log(f"[{name}] cache hit: {out} (use --force to redo)")
                return out
            if done is not None:
                log(f"[{name}] config or inputs changed since {out} was built; rebuilding")
        return _build_stage(cfg, spec, manifests, key, log)


def _build_stage(cfg: RunConfig, spec: StageSpec, manifests: dict[str, Manifest], key: str,
                 log: Callable[[str], Any]) -> Path | None:
    name, root = spec.name, Path(cfg.run.root)
    out = stage_dir(cfg, name)
    verified = verify_inputs(cfg, manifests)
    module = importlib.import_module(f"specdraft.pipelines.{spec.module}")
    work = root / ".work" / f"{spec.out_dir(cfg)}-{key[:16]}"
    where = slurm_context()
    if where:
        log(f"[{name}] {where}")
    if work.is_dir() and any(work.iterdir()):
        log(f"[{name}] resuming from {work} (progress of an earlier, unfinished run)")
    work.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.time(), cpu_seconds()
    with StageOutput(out) as staged:
        ctx = Context(cfg=cfg, spec=spec, root=root, out=staged.tmp, work=work,
                      inputs={k: stage_dir(cfg, k) for k in manifests}, manifests=manifests)
        try:
            metrics = module.build(ctx) or {}
        except StageIncomplete as e:
            log(f"[{name}] {e}")
            return None
        inputs = {k: {"path": str(stage_dir(cfg, k)), "content_hash": m.content_hash, "verified": verified}
                  for k, m in manifests.items()}
        inputs.update(ctx.input_hashes)
        wall, cpu = time.time() - t0, cpu_seconds() - cpu0
        staged.commit(stage=name, config=to_dict(cfg), cache_key=key, inputs=inputs, metrics=metrics,
                      wall_time_s=round(wall, 3), cpu_time_s=round(cpu, 3))
    shutil.rmtree(work, ignore_errors=True)
    log(f"[{name}] done in {wall:.1f}s ({cpu:.1f} CPU s) -> {out}")
    return out


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of the children it has waited for (a stage's helper
    processes and training ranks are waited for before it commits, so their work counts)."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
