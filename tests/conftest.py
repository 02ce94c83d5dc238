import os

# Tests must never reach a hub or the network, and must not write W&B runs anywhere but tmp dirs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import atexit
import shutil
import tempfile

# cost tables the decoder profiles (`specdraft generate`, evaluate) go to a tmp dir, not the user's cache
if "SPECDRAFT_COST_CACHE" not in os.environ:
    os.environ["SPECDRAFT_COST_CACHE"] = tempfile.mkdtemp(prefix="specdraft-costs-")
    atexit.register(shutil.rmtree, os.environ["SPECDRAFT_COST_CACHE"], ignore_errors=True)

import sys

import torch


class _RefuseBareProjectImports:
    """The package installs as `specdraft.*`; tests run from the repository root, where a bare
    `import pipelines` would also resolve (to a second copy of every module, whose monkeypatches and
    registries the installed one never sees). Refuse such imports, so any that remain fail a test."""

    BARE = {"core", "training", "decoding", "data", "drafters", "heads", "routers", "pipelines"}

    def find_spec(self, name, path=None, target=None):
        if path is None and name in self.BARE:
            raise ImportError(f"bare import of {name!r}: import specdraft.{name} instead")
        return None


sys.meta_path.insert(0, _RefuseBareProjectImports())

# Tiny models run fastest on one thread, and tests that start subprocesses (ddp, sharded stages)
# must not oversubscribe the 2 cores of a CI box.
torch.set_num_threads(1)


def import_benchmark(name: str):
    """A script of benchmarks/ as a module, found by its name in whichever question's folder holds it
    (`bench_batch_decoder` -> benchmarks.decoder.bench_batch_decoder; `publish` -> benchmarks.harness.publish)."""
    import importlib
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    found = sorted((root / "benchmarks").glob(f"*/{name}.py"))
    assert len(found) == 1, f"benchmarks/*/{name}.py: {len(found)} files"
    return importlib.import_module(".".join(found[0].relative_to(root).with_suffix("").parts))


def examples_digest(examples) -> str:
    """One hash of a built split's (id, prompt, response) triples: equal iff the worlds built the same examples."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps([(e.id, e.prompt, e.response) for e in examples]).encode()).hexdigest()
