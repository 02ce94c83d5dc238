"""Pinning a user's target: what exactly `target.name_or_path` names, for the cache keys.

A name or path alone does not say which weights it holds: a hub repository moves on with new commits,
and a local directory can be overwritten with a retrained model. Every stage whose output depends on
the target (the stages with the `target` config section) puts the pin in its cache key, so new weights
under the same name rebuild everything downstream instead of mixing old drafters with a new target.

  local directory  the content hash of its files (weights, config, tokenizer, chat template); the
                   file hashes are cached by (size, mtime) under run.root/.work, so a multi-GB target
                   is hashed once
  hub id           the commit of `target.revision` (a branch, tag or commit; null: main), resolved from
                   the local Hugging Face cache, else downloaded once; stages then load the snapshot
                   directory of exactly that commit
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdraft.core.errors import InputError
from specdraft.core.hashing import content_hash
from specdraft.pipelines.artifacts import HashCache

# What a causal LM and its tokenizer load from; the snapshot download fetches only these.
MODEL_FILES = ("*.json", "*.safetensors", "*.model", "*.jinja", "*.txt", "*.tiktoken")


@dataclass(frozen=True)
class TargetPin:
    load_path: str  # what from_pretrained reads: the local dir, or the hub snapshot dir of the commit
    record: dict[str, str]  # goes into cache keys and manifests: path + content_hash (+ revision)


def _local_pin(path: Path, cache: HashCache) -> TargetPin:
    files = {p.name: cache.sha256(p) for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")}
    return TargetPin(str(path), {"path": str(path), "content_hash": content_hash(files)})


def _hub_pin(repo_id: str, revision: str | None) -> TargetPin:
    from huggingface_hub import snapshot_download

    try:  # the cached snapshot of the revision (a branch or tag resolves through the cache's refs)
        snapshot = snapshot_download(repo_id, revision=revision, allow_patterns=list(MODEL_FILES),
                                     local_files_only=True)
    except Exception:  # not cached (or partly): fetch it once, unless offline
        try:
            snapshot = snapshot_download(repo_id, revision=revision, allow_patterns=list(MODEL_FILES))
        except Exception as e:
            raise InputError(f"cannot resolve hub target '{repo_id}' at revision {revision or 'main'} "
                             f"({type(e).__name__}); download it first (huggingface-cli download) or point "
                             "target.name_or_path to a local directory") from None
    commit = Path(snapshot).name
    return TargetPin(str(snapshot), {"path": repo_id, "revision": commit, "content_hash": commit})


def pin_target(name_or_path: str, revision: str | None, cache: HashCache) -> TargetPin:
    """The pin of a user's target: a local directory's content hash, or a hub id's commit."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        if revision is not None:
            raise InputError(f"target.revision is for hub ids; '{name_or_path}' is a local directory (remove "
                             "target.revision: the directory's content hash pins it)")
        return _local_pin(local.resolve(), cache)
    if local.is_absolute() or name_or_path.startswith((".", "~")):
        raise InputError(f"target '{name_or_path}' does not exist; give a model directory or a hub id")
    return _hub_pin(name_or_path, revision)
