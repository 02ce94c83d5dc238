"""How N processes share one stage's work without talking to each other (distill-data's chunks,
evaluate's units): which share is this process's, an atomic file per finished piece, and exactly one
merger when several finish together. Below the stages that shard, so neither imports the other."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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
