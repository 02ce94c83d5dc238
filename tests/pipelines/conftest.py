"""A tiny demo run (prompts + a 1-layer target) built once per session; tests get their own copy."""
import shutil
from pathlib import Path

import pytest

from specdraft.pipelines.config import from_dict
from specdraft.pipelines.schema import RunConfig
from specdraft.pipelines.stage import run_stage

OFF = {"wandb": {"mode": "disabled"}}


def tiny_config(root, **sections) -> RunConfig:
    data = {
        "run": {"root": str(root)},
        "demo": {"domains": ["math", "translate"], "heldout_domains": ["spell"], "corpus_per_domain": 30,
                 "train_per_domain": 6, "dev_per_domain": 3, "test_per_domain": 2},
        "pretrain_target": {"tokenizer": {"vocab_size": 300}, "seq_len": 64,
                            "model": {"n_layers": 1, "hidden": 64, "n_heads": 2, "intermediate": 128,  # nf4 on CPU needs >= 64
                                      "max_positions": 256},
                            "train": {"max_steps": 4, "batch_size": 4, **OFF}},
        "distill_data": {"temperatures": [0.0, 1.0], "max_new_tokens": 8, "batch_size": 4, "chunk_size": 5},
        "train_drafters": {
            "model": {"n_layers": 1, "hidden": 16, "n_heads": 2, "intermediate": 32, "max_positions": 256},
            "general": {"lr": 1e-3, "max_length": 64, "train": {"max_steps": 2, "batch_size": 4, **OFF}},
            "finetune": {"lr": 1e-3, "max_length": 64, "train": {"max_epochs": 1, "batch_size": 8, **OFF}},
        },
    }
    for name, value in sections.items():
        data.setdefault(name, {}).update(value)
    return from_dict(RunConfig, data)


def run_template(tmp_path_factory, name: str, base: Path | None, stages: tuple[str, ...], **sections) -> Path:
    """A run root built once per session or module: a copy of `base` (or nothing) with `stages` run
    under tiny_config(root, **sections). Tests take a `fresh_copy` so none sees another's changes."""
    root = tmp_path_factory.mktemp(name) / "run"
    if base is not None:
        shutil.copytree(base, root)
    cfg = tiny_config(root, **sections)
    for stage in stages:
        run_stage(cfg, stage)
    return root


def fresh_copy(template: Path, tmp_path: Path, name: str = "run") -> Path:
    root = tmp_path / name
    shutil.copytree(template, root)
    return root


@pytest.fixture(scope="session")
def _tiny_run_template(tmp_path_factory):
    return run_template(tmp_path_factory, "tiny_run", None, ("prepare-data", "pretrain-target"))


@pytest.fixture
def tiny_run(_tiny_run_template, tmp_path):
    """A run root holding finished prompts/ and target/ stages."""
    return fresh_copy(_tiny_run_template, tmp_path)


FAST_HEADS = {"depths": [0, 2], "w_rejs": [1.0, 6.0], "epochs": 1, "cost_ratio": 0.2, "lr": 1e-3}
FAST = {"acceptance_data": {"max_sequences": {"train": 10, "dev": 6}}, "train_heads": FAST_HEADS}


@pytest.fixture(scope="session")
def _drafted_template(_tiny_run_template, tmp_path_factory):
    return run_template(tmp_path_factory, "drafted_run", _tiny_run_template, ("distill-data", "train-drafters"), **FAST)


@pytest.fixture
def drafted_run(_drafted_template, tmp_path):
    """A run root with prompts/, target/, distill_data/ and drafters/ finished (tiny sizes)."""
    return fresh_copy(_drafted_template, tmp_path, "drafted")
