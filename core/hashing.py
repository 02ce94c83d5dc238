"""Content hashes shared by the artifact store (pipelines/) and the bundle loader (decoding/).

One definition, here in the bottom layer, so a drafter's hash recorded at training time (the heads'
`drafter_hash`) is exactly what the decoder recomputes from a bundle.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def content_hash(file_hashes: dict[str, str]) -> str:
    """Hash of a directory from its files' relative paths and hashes (order-independent)."""
    return hashlib.sha256(json.dumps(sorted(file_hashes.items())).encode()).hexdigest()


# A drafter's serving defaults (export writes transformers' num_assistant_tokens into it): not part of
# the drafter's identity, so a head trained on the drafter still matches the exported copy.
SERVING_FILES = frozenset({"generation_config.json"})


def drafter_hash(file_hashes: dict[str, str]) -> str:
    """The identity of a drafter directory (files relative to it): its content hash without SERVING_FILES."""
    return content_hash({k: v for k, v in file_hashes.items() if k not in SERVING_FILES})


def derive_seed(*parts) -> int:
    """A stable 60-bit seed from a run seed and names (stage, example id, method): the same parts give
    the same stream in every process and after every restart, whatever ran before."""
    return int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:15], 16)
