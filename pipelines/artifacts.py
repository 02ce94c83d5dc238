"""The artifact store: one directory per stage under the run root, written atomically.

A stage builds its output in a temp directory next to the final one and renames it into place after
`manifest.json` is written, so a directory under its final name is always finished. A stage killed
midway leaves only a `.tmp-*` directory (removed on the next run) and, for resumable stages, its
progress under `.work/` (kept until the stage finishes).

manifest.json: stage, resolved config, cache key, inputs (path + content hash), package version, git
commit, metrics, wall time, and the content hash of the directory's own files.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decoding.errors import InputError
from decoding.hashing import content_hash, file_sha256

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def package_version() -> str:
    try:
        from importlib.metadata import version

        return version("specdraft")
    except Exception:
        return "unknown"


def git_commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        commit = out.stdout.strip() if out.returncode == 0 else "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty and commit != "unknown" else "")
    except Exception:
        return "unknown"


def dir_files(root: Path) -> list[Path]:
    """All files under root except the manifest, in a stable order."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() != MANIFEST)


def dir_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): file_sha256(p) for p in dir_files(root)}


@dataclass
class Manifest:
    stage: str
    config: dict
    cache_key: str
    inputs: dict[str, dict[str, str]]
    metrics: dict[str, Any]
    wall_time_s: float
    content_hash: str
    files: dict[str, str]
    package_version: str = field(default_factory=package_version)
    git_commit: str = field(default_factory=git_commit)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    format_version: int = FORMAT_VERSION

    def write(self, directory: Path) -> None:
        (directory / MANIFEST).write_text(json.dumps(self.__dict__, indent=2, sort_keys=True, default=str) + "\n")


def read_manifest(directory: Path, expect_stage: str | None = None, hint: str = "") -> Manifest:
    """Load and sanity-check a finished stage's manifest; one-line InputError otherwise."""
    directory = Path(directory)
    path = directory / MANIFEST
    run_hint = hint or (f"run `specdraft {expect_stage}` first" if expect_stage else "rerun the stage that makes it")
    if not directory.is_dir():
        raise InputError(f"'{directory}' does not exist; {run_hint}")
    if not path.is_file():
        raise InputError(f"'{directory}' has no {MANIFEST} (not a finished stage output); {run_hint}")
    try:
        data = json.loads(path.read_text())
        m = Manifest(**data)
    except (json.JSONDecodeError, TypeError) as e:
        raise InputError(f"'{path}' is corrupt ({type(e).__name__}); rerun the stage with --force") from None
    if expect_stage and m.stage != expect_stage:
        raise InputError(f"'{directory}' was written by stage '{m.stage}', expected '{expect_stage}'; check the path")
    return m


def verify_files(directory: Path, manifest: Manifest | None = None) -> None:
    """Re-hash every file listed in the manifest: catches missing, extra-corrupted or tampered files."""
    directory = Path(directory)
    manifest = manifest or read_manifest(directory)
    for rel, want in manifest.files.items():
        p = directory / rel
        if not p.is_file():
            raise InputError(f"'{p}' is missing; rerun stage '{manifest.stage}' with --force")
        if file_sha256(p) != want:
            raise InputError(f"'{p}' does not match its hash in {MANIFEST} (corrupt or modified); rerun stage '{manifest.stage}' with --force")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StageOutput:
    """Context manager: a temp directory that becomes `final` only if the body finishes.

    with StageOutput(final) as out:
        ... write files into out.tmp ...
        out.commit(**manifest_fields)   # hashes files, writes manifest.json, renames into place

    Temp dirs carry host and pid, so cleaning up after killed runs never removes the temp dir of a
    process still running (another shard or rank writing the same stage).
    """

    def __init__(self, final: Path):
        self.final = Path(final)
        self.host = socket.gethostname().replace("-", "_")
        self.tmp = self.final.parent / f".tmp-{self.final.name}-{self.host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.committed = False

    def _stale(self, path: Path) -> bool:
        parts = path.name.rsplit("-", 3)  # .tmp-<name>, host, pid, uuid
        if len(parts) != 4 or parts[1] != self.host or not parts[2].isdigit():
            return False  # another machine's, or an unknown layout: leave it alone
        return not _pid_alive(int(parts[2]))

    def __enter__(self) -> "StageOutput":
        self.final.parent.mkdir(parents=True, exist_ok=True)
        for stale in self.final.parent.glob(f".tmp-{self.final.name}-*"):
            if self._stale(stale):
                _remove(stale)  # left by a killed run
        for stale in self.final.parent.glob(f".old-{self.final.name}-*"):
            _remove(stale)
        self.tmp.mkdir()
        return self

    def commit(self, **manifest_fields) -> Manifest:
        files = dir_hashes(self.tmp)
        manifest = Manifest(content_hash=content_hash(files), files=files, **manifest_fields)
        manifest.write(self.tmp)  # written last: its presence marks the directory finished
        if self.final.exists():
            old = self.final.parent / f".old-{self.final.name}-{uuid.uuid4().hex[:8]}"
            os.replace(self.final, old)
            os.replace(self.tmp, self.final)
            _remove(old)
        else:
            os.replace(self.tmp, self.final)
        self.committed = True
        return manifest

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            _remove(self.tmp)


def subdir_hash(manifest: Manifest, subdir: str) -> str:
    """Content hash of one subdirectory of a stage output (e.g. one drafter of drafters/), from the
    manifest's file hashes: identical to hashing that directory on its own."""
    prefix = subdir.rstrip("/") + "/"
    files = {k[len(prefix):]: v for k, v in manifest.files.items() if k.startswith(prefix)}
    if not files:
        raise InputError(f"'{subdir}' is not part of stage '{manifest.stage}'; rerun that stage")
    return content_hash(files)
