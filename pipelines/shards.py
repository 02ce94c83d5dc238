"""How N processes share one stage's work without talking to each other (distill-data's chunks,
evaluate's units): which share is this process's, an atomic file per finished piece, exactly one
merger when several finish together, and the processes a stage starts on this machine to use its
cores (`processes: N`). Below the stages that shard, so neither imports the other."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from specdraft.core.errors import InputError


def parse_shard(text: str, where: str = "SPECDRAFT_SHARD") -> tuple[int, int]:
    """'i/N' -> (i, N), 0 <= i < N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise InputError(f"{where} must look like 'i/N' (e.g. 0/2)") from None
    if not 0 <= i < n:
        raise InputError(f"shard index {i} is outside 0..{n - 1}; check {where}")
    return i, n


def shard_from_env() -> tuple[int, int]:
    """(index, count) of this process among the processes sharing the stage: SPECDRAFT_SHARD=i/N (what
    `--shard` sets), a Slurm array task, or a torchrun / srun rank; (0, 1) alone."""
    if "SPECDRAFT_SHARD" in os.environ:
        return parse_shard(os.environ["SPECDRAFT_SHARD"])
    def number(var: str, default: str | None = None) -> int:
        text = os.environ.get(var, default)
        try:
            return int(text)
        except ValueError:
            raise InputError(f"{var}={text!r} is not an integer; fix or unset it (or give --shard i/N)") from None

    if "SLURM_ARRAY_TASK_ID" in os.environ and "SLURM_ARRAY_TASK_COUNT" in os.environ:
        i = number("SLURM_ARRAY_TASK_ID") - number("SLURM_ARRAY_TASK_MIN", "0")
        n = number("SLURM_ARRAY_TASK_COUNT")
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        i, n = number("RANK"), number("WORLD_SIZE")
    else:
        i, n = 0, 1
    if not 0 <= i < n:
        raise InputError(f"shard index {i} is outside 0..{n - 1}; check SPECDRAFT_SHARD / the array range")
    return i, n


def read_piece(path: Path, what: str, check) -> Any:
    """One finished piece (a distill-data chunk, an evaluate unit) read back for the merge: written
    atomically by this code, so damage means a hand edit or a disk fault. `check(obj)` raises KeyError,
    TypeError or ValueError on a piece of the wrong shape. InputError names the file and the fix: the
    piece is redone by deleting it and rerunning the shard that owns it."""
    from specdraft.pipelines.artifacts import read_json

    fix = f"delete it and rerun the stage (its shard redoes that {what} only)"
    obj = read_json(path, what, fix)
    try:
        check(obj)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{what} file {path} has the wrong shape ({type(e).__name__}: {str(e)[:60]}); {fix}") from None
    return obj


def write_json_atomic(path: Path, obj: Any) -> None:
    """A finished piece appears whole or not at all: a killed writer leaves only its temp file."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def claim_merge(work: Path, shard: int) -> bool:
    """True for exactly one of the shards that call this (an exclusive create in the work dir); a shard
    that finds the work dir gone lost to a shard that already merged and committed."""
    try:
        fd = os.open(work / "merge.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except (FileExistsError, FileNotFoundError):
        return False
    os.write(fd, f"shard {shard} pid {os.getpid()}\n".encode())
    os.close(fd)
    return True


HELPER = "SPECDRAFT_SHARD_HELPER"  # set in the processes `processes_started_here` starts: they leave the merge to it


def is_helper() -> bool:
    """True in a process another one started to share its stage on this machine (it must not merge)."""
    return os.environ.get(HELPER) == "1"


@dataclass(frozen=True)
class Share:
    """This process's place among the processes sharing a stage."""
    shard: int
    count: int
    started_here: bool  # this process starts shards 1..count-1 itself (`processes` > 1 and no shard given) and merges
    side_by_side: int  # processes sharing this machine's cores (threads_per_process)


def this_share(processes: int, from_env: bool = True) -> Share:
    """The share of a stage configured with `processes`: a shard given (`--shard`, a Slurm array, ranks) when
    `from_env`, else shard 0 of `processes` started here, else the whole stage."""
    shard, count = shard_from_env() if from_env else (0, 1)
    started_here = count == 1 and processes > 1
    if started_here:
        count = processes
    return Share(shard, count, started_here, processes if started_here or is_helper() else 1)


def start_helpers(ctx, stage: str, n: int) -> list[tuple[subprocess.Popen, Path]]:
    """Shards 1..n-1 of `stage` as `specdraft STAGE --shard i/n --force` processes on this machine, on this run's
    config (written to the work dir: the same stage key, so the same store of finished pieces), each
    logging to the work dir. -> (process, log) per shard. `--force`: this process is building the stage, so a
    finished output already there (a forced rerun) is no cache hit for its helpers."""
    from specdraft.pipelines.config import to_dict

    import yaml

    config = ctx.work / "processes_config.yaml"
    config.write_text(yaml.safe_dump(to_dict(ctx.cfg), sort_keys=False))
    env = {**os.environ, HELPER: "1"}
    started = []
    for i in range(1, n):
        log = ctx.work / f"process-{i}.log"
        with open(log, "w") as out:
            started.append((subprocess.Popen([sys.executable, "-m", "specdraft.pipelines.cli", stage, str(config),
                                              "--shard", f"{i}/{n}", "--force"], env=env, stdout=out, stderr=subprocess.STDOUT),
                            log))
    print(f"[{stage}] {n} processes share the work: this one and {n - 1} started here "
          f"(logs: {ctx.work}/process-*.log)")
    return started


def wait_for_helpers(started: list[tuple[subprocess.Popen, Path]], stage: str) -> None:
    """Every helper's exit; one that failed ends the stage with its log's last line (its finished pieces stay:
    a rerun does only what is missing)."""
    failed = [(p, log) for p, log in started if p.wait() != 0]
    if failed:
        p, log = failed[0]
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        raise RuntimeError(f"{log.stem}, started here for {stage}, failed (exit {p.returncode}): "
                           f"{lines[-1] if lines else 'no output'}; see {log}, then rerun the stage")


@contextmanager
def processes_started_here(ctx, stage: str, place: Share) -> Iterator[None]:
    """Runs the block (this process's share) with shards 1..count-1 started beside it where `place` says this
    process starts them, then waits for them. A block that raises (a bug, Ctrl-C) terminates them: none is left
    working for a stage that stopped (their finished pieces stay for the rerun)."""
    helpers = start_helpers(ctx, stage, place.count) if place.started_here else []
    try:
        yield
    except BaseException:
        for process, _ in helpers:
            process.terminate()
        raise
    wait_for_helpers(helpers, stage)


@contextmanager
def threads_per_process(n: int) -> Iterator[None]:
    """This process's share of the machine's torch threads while n processes work side by side on it: small
    models' ops are too short for two threads to share, so n single-threaded processes use the cores better
    than one process with n threads (and one thread fighting another process for a core stalls its team)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // n))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def merger_or_stop(ctx, stage: str, place: Share, missing: list[str]) -> None:
    """Returns in the one process that merges the stage's finished pieces; elsewhere raises StageIncomplete: a
    process started here (the one that started it merges), pieces still missing (other shards' work; the shard
    that finishes last, or a rerun, merges), or another shard that finished at the same time claimed the merge
    (its commit then removes the work dir, which the others must not be reading from)."""
    from specdraft.pipelines.stage import StageIncomplete

    shard, n = place.shard, place.count
    if not place.started_here and is_helper():
        raise StageIncomplete(f"shard {shard}/{n} is done; the process that started it merges")
    if missing:
        raise StageIncomplete(f"shard {shard}/{n} is done; {len(missing)} chunks remain for other shards "
                              f"(the shard that finishes last, or a rerun, writes the {stage} output)")
    if n > 1 and not place.started_here and not claim_merge(ctx.work, shard):
        raise StageIncomplete(f"shard {shard}/{n} is done; another shard merges the {stage} output")
