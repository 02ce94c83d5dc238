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

from specdraft.core.errors import InputError
from specdraft.core.hashing import content_hash, file_sha256

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
    # CPU seconds (user + system) of the stage's process and of the processes it started and waited for
    # (its helper shards, training ranks): on a busy machine the wall time says little, this says the work
    cpu_time_s: float | None = None
    package_version: str = field(default_factory=package_version)
    git_commit: str = field(default_factory=git_commit)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    format_version: int = FORMAT_VERSION

    def write(self, directory: Path) -> None:
        (directory / MANIFEST).write_text(json.dumps(self.__dict__, indent=2, sort_keys=True, default=str) + "\n")


# The manifest's schema: every field with the JSON type it must have. Reading checks it whole, so a
# damaged or hand-edited manifest is one line naming the field, never an AttributeError later on.
_MANIFEST_FIELDS: dict[str, tuple[type, ...]] = {
    "stage": (str,), "config": (dict,), "cache_key": (str,), "inputs": (dict,), "metrics": (dict,),
    "wall_time_s": (int, float), "content_hash": (str,), "files": (dict,), "package_version": (str,),
    "git_commit": (str,), "created": (str,), "format_version": (int,), "cpu_time_s": (int, float, type(None)),
}
_OPTIONAL_FIELDS = {"cpu_time_s"}  # added later: a manifest written before it reads as it was


def _check_manifest(data: Any, path: Path) -> None:
    fix = "rerun the stage that wrote it with --force"
    if not isinstance(data, dict):
        raise InputError(f"'{path}' is not a manifest (a JSON object is expected); {fix}")
    missing = [k for k in _MANIFEST_FIELDS if k not in data and k not in _OPTIONAL_FIELDS]
    extra = [k for k in data if k not in _MANIFEST_FIELDS]
    if missing or extra:
        what = ", ".join([f"missing '{k}'" for k in missing] + [f"unknown '{k}'" for k in extra])
        raise InputError(f"'{path}' does not follow the manifest schema ({what}); {fix}")
    for key, types_ in _MANIFEST_FIELDS.items():
        if key not in data:
            continue
        value = data[key]
        if not isinstance(value, types_) or isinstance(value, bool):
            raise InputError(f"'{path}' field '{key}' has the wrong type ({type(value).__name__}); {fix}")
    if data["format_version"] != FORMAT_VERSION:
        raise InputError(f"'{path}' has manifest format {data['format_version']}, this specdraft reads "
                         f"{FORMAT_VERSION}; {fix}")
    for rel, digest in data["files"].items():
        if not isinstance(digest, str) or len(digest) != 64 or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise InputError(f"'{path}' lists a bad file entry {rel!r}; {fix}")
    for name, entry in data["inputs"].items():
        if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
            raise InputError(f"'{path}' input '{name}' is malformed; {fix}")


def read_manifest(directory: Path, expect_stage: str | None = None, hint: str = "") -> Manifest:
    """Load and check a finished stage's manifest against its schema; one-line InputError otherwise."""
    directory = Path(directory)
    path = directory / MANIFEST
    run_hint = hint or (f"run `specdraft {expect_stage}` first" if expect_stage else "rerun the stage that makes it")
    if not directory.is_dir():
        raise InputError(f"'{directory}' does not exist; {run_hint}")
    if not path.is_file():
        raise InputError(f"'{directory}' has no {MANIFEST} (not a finished stage output); {run_hint}")
    data = read_json(path, "a stage manifest", "rerun the stage that wrote it with --force")
    _check_manifest(data, path)
    m = Manifest(**data)
    if expect_stage and m.stage != expect_stage:
        raise InputError(f"'{directory}' was written by stage '{m.stage}', expected '{expect_stage}'; check the path")
    return m


def read_json(path: Path, what: str, fix: str) -> Any:
    """A JSON file the pipeline wrote; damage (truncation, bad bytes, not JSON) is one line naming it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"'{path}' ({what}) is missing; {fix}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise InputError(f"'{path}' ({what}) is damaged ({type(e).__name__}); {fix}") from None


class HashCache:
    """sha256 of files keyed by (path, size, mtime_ns), kept in one JSON file under the run root.

    A real target's shards run to many GB: each is hashed once, and again only when its size or
    modification time changes. The cache is advisory: a missing or damaged cache file is rebuilt."""

    def __init__(self, path: Path | None):
        self.path = Path(path) if path is not None else None
        self.entries: dict[str, list] = {}
        if self.path is not None and self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
                self.entries = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                self.entries = {}

    def sha256(self, file: Path) -> str:
        st = file.stat()
        key = str(file.resolve())
        hit = self.entries.get(key)
        if isinstance(hit, list) and len(hit) == 3 and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            return hit[2]
        digest = file_sha256(file)
        self.entries[key] = [st.st_size, st.st_mtime_ns, digest]
        return digest

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.entries))
        os.replace(tmp, self.path)


def verify_files(directory: Path, manifest: Manifest | None = None, cache: HashCache | None = None) -> None:
    """Re-hash every file listed in the manifest: catches missing, extra-corrupted or tampered files."""
    directory = Path(directory)
    manifest = manifest or read_manifest(directory)
    for rel, want in manifest.files.items():
        p = directory / rel
        if not p.is_file():
            raise InputError(f"'{p}' is missing; rerun stage '{manifest.stage}' with --force")
        got = cache.sha256(p) if cache is not None else file_sha256(p)
        if got != want:
            raise InputError(f"'{p}' does not match its hash in {MANIFEST} (corrupt or modified); rerun stage '{manifest.stage}' with --force")


def load_dataset_dir(path: Path, stage: str):
    """`datasets.load_from_disk` for a stage output; a damaged Arrow file is one line naming the stage."""
    import datasets

    try:
        return datasets.load_from_disk(str(path))
    except FileNotFoundError:
        raise InputError(f"'{path}' is missing; rerun stage '{stage}' with --force") from None
    except Exception as e:  # pyarrow raises OSError / ArrowInvalid / ArrowIOError subclasses for damage
        raise InputError(f"'{path}' is not a readable dataset ({type(e).__name__}); rerun stage '{stage}' "
                         f"with --force") from None


def load_safetensors(path: Path, stage: str) -> dict:
    """`safetensors.torch.load_file`; a damaged file is one line naming the stage to rerun."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except FileNotFoundError:
        raise InputError(f"'{path}' is missing; rerun stage '{stage}' with --force") from None
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise InputError(f"'{path}' is not a readable safetensors file ({type(e).__name__}); rerun stage "
                         f"'{stage}' with --force") from None


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
        self.tmp = self.final.parent / f".tmp-{self.final.name}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.committed = False

    def __enter__(self) -> "StageOutput":
        tidy_stage_dir(self.final)
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


def _host() -> str:
    return socket.gethostname().replace("-", "_")


def _dead_temp_dir(path: Path) -> bool:
    """A `.tmp-<name>-<host>-<pid>-<uuid>` dir whose process (on this host) is gone."""
    parts = path.name.rsplit("-", 3)
    if len(parts) != 4 or parts[1] != _host() or not parts[2].isdigit():
        return False  # another machine's, or an unknown layout: leave it alone
    return not _pid_alive(int(parts[2]))


def tidy_stage_dir(final: Path) -> None:
    """Undo what a killed writer of `final` left behind; called under the stage's lock.

    `commit` replaces a finished directory in two renames (final -> .old-*, tmp -> final). A process
    killed between them leaves no `final` and a complete `.old-*`: put the old one back rather than
    lose it; once `final` exists, any `.old-*` is garbage. Temp dirs of dead processes are removed;
    those of live ones (another shard or rank of the same stage) are left alone."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    olds = sorted(final.parent.glob(f".old-{final.name}-*"), key=lambda p: p.stat().st_mtime)
    if not final.exists() and olds and (olds[-1] / MANIFEST).is_file():
        os.replace(olds.pop(), final)
    for old in olds:
        _remove(old)
    for tmp in final.parent.glob(f".tmp-{final.name}-*"):
        if _dead_temp_dir(tmp):
            _remove(tmp)


class StageLock:
    """One writer per stage output: `run.root/.locks/<stage>[.<shard>].lock` holds host and pid.

    A second run of the same stage on the same run root refuses with one line naming the holder. A lock
    whose holder is gone (same host, dead pid) is stale and taken over; a lock held on another host
    cannot be checked from here and is reported with how to remove it."""

    def __init__(self, root: Path, name: str):
        self.path = Path(root) / ".locks" / f"{name}.lock"
        self.held = False

    def _holder(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def __enter__(self) -> "StageLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                pid, host = holder.get("pid"), holder.get("host")
                if host == me["host"] and isinstance(pid, int) and not _pid_alive(pid):
                    self.path.unlink(missing_ok=True)  # stale: its process is gone
                    continue
                if not holder:  # being written right now, or damaged: look again shortly
                    time.sleep(0.2)
                    if not self._holder():
                        self.path.unlink(missing_ok=True)
                    continue
                raise InputError(f"'{self.path.parent.parent}' is in use: this stage is already running "
                                 f"(pid {pid} on {host}, since {holder.get('since', '?')}); wait for it, or "
                                 f"remove {self.path} if that process is gone") from None
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(me))
            self.held = True
            return self
        raise InputError(f"could not take the lock {self.path}; remove it if no run is active")

    def __exit__(self, *exc) -> None:
        if self.held and self._holder().get("pid") == os.getpid():
            self.path.unlink(missing_ok=True)
        self.held = False


def subdir_hash(manifest: Manifest, subdir: str) -> str:
    """Content hash of one subdirectory of a stage output (e.g. one drafter of drafters/), from the
    manifest's file hashes: identical to hashing that directory on its own."""
    prefix = subdir.rstrip("/") + "/"
    files = {k[len(prefix):]: v for k, v in manifest.files.items() if k.startswith(prefix)}
    if not files:
        raise InputError(f"'{subdir}' is not part of stage '{manifest.stage}'; rerun that stage")
    return content_hash(files)
