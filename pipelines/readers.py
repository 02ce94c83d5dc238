"""Artifact readers: how one stage reads another stage's output (the only way stages depend on each other).

Each reader knows one output's layout and fails with a one-line InputError naming the stage to rerun.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import datasets
import torch

from specdraft.core.errors import InputError
from specdraft.drafters.teacher_signal import SignalFormat
from specdraft.pipelines.artifacts import load_dataset_dir, load_safetensors, read_json

BASE = "base"  # the general-phase drafter: the "trained on the raw corpus, no target generations" reference


def load_distill_data(path: str | Path) -> datasets.DatasetDict:
    return load_dataset_dir(Path(path) / "data", "distill-data")


TEACHER_INFO = "info.json"


@dataclass(frozen=True)
class TeacherData:
    """Stage teacher-data's output: the stored rows per split (memory-mapped; drafters/teacher_signal.py has the
    columns), their format, and the distill-data output they were scored from (its manifest content hash)."""

    format: SignalFormat
    distill_data: str
    splits: dict[str, datasets.Dataset]

    def indices(self, split: str, domains) -> list[int]:
        """The rows of `split` in `domains`, by index (none when the split is absent)."""
        data = self.splits.get(split)
        return [] if data is None else [i for i, d in enumerate(data["domain"]) if d in domains]

    def has_extra_rows(self) -> bool:
        """Whether the train split holds rows of text the target did not write (teacher_data.extra)."""
        return any(s != "distilled" for s in self.splits["train"]["source"])


def load_teacher_data(path: str | Path, distill_data: str | None = None,
                      stale_fix: str = "rerun stage teacher-data (specdraft run does it in order)") -> TeacherData:
    """teacher_data/: info.json (the format, the chunks of each split in order) and data/<split>/<chunk>/. With
    `distill_data` (a distill-data output's content hash) it must have been scored from that output, else one line
    ending in `stale_fix`: its rows pair with those answers by id."""
    fix = "rerun stage 'teacher-data' with --force"
    info = _checked(Path(path) / TEACHER_INFO, "teacher data info", fix,
                    {"format": lambda v: isinstance(v, dict), "distill_data": _text,
                     "chunks": lambda v: isinstance(v, dict) and all(_names(c) for c in v.values())})
    if distill_data is not None and info["distill_data"] != distill_data:
        raise InputError(f"'{path}' was scored from another distill-data output than this run's; {stale_fix}")
    try:
        fmt = SignalFormat.from_json(info["format"])
    except TypeError:
        raise InputError(f"'{Path(path) / TEACHER_INFO}' has a format this specdraft does not read; {fix}") from None
    splits = {}
    for split, chunks in info["chunks"].items():
        parts = [load_dataset_dir(Path(path) / "data" / split / c, "teacher-data") for c in chunks]
        splits[split] = datasets.concatenate_datasets(parts) if parts else None
    return TeacherData(fmt, info["distill_data"], {k: v for k, v in splits.items() if v is not None})


def transform_dirs(acc_dir) -> list:
    """Every <drafter>/<transform tag>/ of an acceptance-data output, sorted."""
    return sorted(p.parent for p in acc_dir.glob("*/*/info.json"))


def load_features(drafter_dir, split: str) -> dict[str, torch.Tensor]:
    path = drafter_dir / f"features_{split}.safetensors"
    if not path.is_file():
        raise InputError(f"{path} is missing; rerun `specdraft acceptance-data --force`")
    return load_safetensors(path, "acceptance-data")


def _names(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _text(v) -> bool:
    return isinstance(v, str) and bool(v)


def _checked(path: Path, what: str, fix: str, shape: dict) -> dict:
    """read_json, then every key of `shape` present and passing its test: a stage reading another's JSON
    would otherwise stop on a KeyError deep inside its work (reached when verify_inputs is off)."""
    obj = read_json(path, what, fix)
    if not isinstance(obj, dict):
        raise InputError(f"'{path}' ({what}) is not a JSON object; {fix}")
    for key, ok in shape.items():
        if key not in obj or not ok(obj[key]):
            raise InputError(f"'{path}' ({what}) has {key} {str(obj.get(key))[:40]!r}, not what the stage wrote; {fix}")
    return obj


def read_drafter_info(drafter_dir: Path) -> dict:
    """A drafter's drafter.json (train-drafters): its domains and size."""
    return _checked(Path(drafter_dir) / "drafter.json", "drafter info", "rerun stage 'train-drafters' with --force",
                    {"domains": _names, "parameters": _count})


def read_acceptance_info(data_dir: Path) -> dict:
    """An acceptance-data set's info.json (<drafter>/<transform tag>/): the drafter it labels, as the
    directory it sits in names it, and the transform, hidden size and length its features were made with."""
    from specdraft.decoding.rounds.sampling import SamplingConfig

    def transform(v) -> bool:
        try:
            SamplingConfig(v["temperature"], v["top_k"], v["top_p"])
            return True
        except (InputError, KeyError, TypeError):
            return False

    fix = "rerun stage 'acceptance-data' with --force"
    path = Path(data_dir) / "info.json"
    info = _checked(path, "acceptance data info", fix,
                    {"drafter": _text, "drafter_hash": _text, "hidden_size": _count, "max_length": _count,
                     "label_transform": transform})
    if info["drafter"] != Path(data_dir).parent.name:  # heads are filed under the directory's drafter
        raise InputError(f"'{path}' labels drafter '{info['drafter']}' but sits under '{Path(data_dir).parent.name}'; {fix}")
    return info
