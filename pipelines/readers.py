"""Artifact readers: how one stage reads another stage's output (the only way stages depend on each other).

Each reader knows one output's layout and fails with a one-line InputError naming the stage to rerun.
"""
from __future__ import annotations

from pathlib import Path

import datasets
import torch

from specdraft.core.errors import InputError
from specdraft.pipelines.artifacts import load_dataset_dir, load_safetensors

BASE = "base"  # the general-phase drafter: the "trained on the raw corpus, no target generations" reference


def load_distill_data(path: str | Path) -> datasets.DatasetDict:
    return load_dataset_dir(Path(path) / "data", "distill-data")


def transform_dirs(acc_dir) -> list:
    """Every <drafter>/<transform tag>/ of an acceptance-data output, sorted."""
    return sorted(p.parent for p in acc_dir.glob("*/*/info.json"))


def load_features(drafter_dir, split: str) -> dict[str, torch.Tensor]:
    path = drafter_dir / f"features_{split}.safetensors"
    if not path.is_file():
        raise InputError(f"{path} is missing; rerun `specdraft acceptance-data --force`")
    return load_safetensors(path, "acceptance-data")
