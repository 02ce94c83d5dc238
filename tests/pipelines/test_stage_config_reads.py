"""Every stage reads only the config in its cache key: a stage that read a key outside it would keep
serving a cached output after that key changed. The config is wrapped so every field read is recorded
while a stage's build() runs, on a tiny run through every stage."""
import dataclasses

import pytest

import specdraft.pipelines.stage as stage_module
from specdraft.pipelines.stage import OUTPUT_NEUTRAL_KEYS, STAGES, UNKEYED_READS, StageSpec, run_stage
from tests.pipelines.conftest import FAST, tiny_config

TINY_EVAL = {"prompts_per_domain": 1, "max_new_tokens": 4, "ks": [2], "k": 2, "sampling_prompts": 1,
             "stream_bandits": [], "bandits": ["ucb-bd"], "repeats": 1, "calibration_reps": 2, "sets": ["test"],
             "spectr_drafts": [2], "cascades": ["token"], "model_free_arms": ["lookup"], "eagle_sets": []}


class Reads:
    """Dotted paths of the config fields read while `active`."""

    def __init__(self):
        self.active, self.paths = False, set()


_RECORDING: dict[type, type] = {}


def _recording_class(cls: type) -> type:
    """A subclass of config dataclass `cls` that records reads of its fields (still a dataclass instance:
    asdict, isinstance and the stages' own code see the config they expect)."""
    if cls not in _RECORDING:
        def __getattribute__(self, name):
            if name in type(self).__dataclass_fields__:
                try:
                    reads, path = object.__getattribute__(self, "_reads"), object.__getattribute__(self, "_path")
                except AttributeError:  # a copy made by dataclasses.replace: not recorded
                    reads = None
                if reads is not None and reads.active:
                    reads.paths.add(path + name)
            return object.__getattribute__(self, name)

        _RECORDING[cls] = type(f"Recorded{cls.__name__}", (cls,), {"__getattribute__": __getattribute__})
    return _RECORDING[cls]


def recording(obj, reads: Reads, path: str = ""):
    """A copy of config `obj` whose every (nested) field read is recorded into `reads` as a dotted path."""
    def wrap(value, where):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return recording(value, reads, where + ".")
        if isinstance(value, list):
            return [wrap(v, where) for v in value]
        return value

    new = object.__new__(_recording_class(type(obj)))
    for f in dataclasses.fields(obj):
        object.__setattr__(new, f.name, wrap(object.__getattribute__(obj, f.name), path + f.name))
    object.__setattr__(new, "_reads", reads)
    object.__setattr__(new, "_path", path)
    return new


def unkeyed(spec: StageSpec, paths: set[str]) -> list[str]:
    """The reads outside the stage's cache key: not inside a keyed section or key, not on the way to one
    (reading `train_drafters` to reach the keyed `train_drafters.finetune.max_length`), not output-neutral."""
    keyed = (*spec.sections, "run.seed", *UNKEYED_READS)

    def covered(p):
        return any(p == k or p.startswith(k + ".") or k.startswith(p + ".") for k in keyed) \
            or any(part in OUTPUT_NEUTRAL_KEYS for part in p.split("."))

    return sorted(p for p in paths if not covered(p))


def run_recorded(cfg, monkeypatch) -> dict[str, set[str]]:
    """Run every stage of `cfg`; -> stage name -> the config paths its build() read."""
    import importlib

    per_stage: dict[str, set[str]] = {}
    for spec in STAGES:
        if spec.skip(cfg):  # convert-target without a GGUF target: tests/pipelines/test_real_target.py reads it
            continue
        reads = Reads()
        module = importlib.import_module(f"specdraft.pipelines.{spec.module}")
        real = module.build

        def build(ctx, real=real, reads=reads):
            reads.active = True
            try:
                return real(ctx)
            finally:
                reads.active = False

        monkeypatch.setattr(module, "build", build)
        run_stage(recording(cfg, reads), spec.name)
        per_stage[spec.name] = reads.paths
    return per_stage


def test_every_stage_reads_only_the_config_in_its_cache_key(tmp_path, monkeypatch):
    eagle = {"enabled": True, "variant": "eagle1", "drafters": ["math"], "train": {"max_steps": 1, "batch_size": 4, "wandb": {"mode": "disabled"}}}
    cfg = tiny_config(tmp_path / "run", **FAST, evaluate=TINY_EVAL, train_drafters={"eagle": eagle})
    per_stage = run_recorded(cfg, monkeypatch)
    assert set(per_stage) == {s.name for s in STAGES} - {"convert-target"}
    assert all(per_stage[s] for s in per_stage)  # the recorder saw each stage read its config
    outside = {s.name: unkeyed(s, per_stage[s.name]) for s in STAGES if s.name in per_stage}
    assert outside == {s: [] for s in per_stage}


def test_the_recorder_sees_nested_reads_and_the_check_flags_an_unkeyed_one():
    cfg = tiny_config("unused")
    reads = Reads()
    rec = recording(cfg, reads)
    rec.train_heads.lr  # not yet active: not recorded
    reads.active = True
    assert rec.train_drafters.finetune.max_length == cfg.train_drafters.finetune.max_length
    assert dataclasses.asdict(rec.decoding) == dataclasses.asdict(cfg.decoding)
    assert {"train_drafters.finetune.max_length", "decoding.k", "decoding.cost_ratio"} <= reads.paths
    assert "train_heads.lr" not in reads.paths
    spec = StageSpec("x", "x", (), ("train_heads", "train_drafters.finetune.max_length"), "x")
    # reads of the keyed key and on the way to it pass; the decoding section's do not
    assert unkeyed(spec, reads.paths) == sorted(p for p in reads.paths if p.startswith("decoding"))
    assert unkeyed(spec, {"run.root", "train_heads.lr", "train_drafters.general.train.wandb.mode"}) == []


def test_a_dotted_section_is_part_of_the_cache_key(tmp_path):
    """train-heads keys decoding.k and k_max (the draft run it times c with, the cap it simulates) and
    nothing else of the decoding section, nor export."""
    spec = stage_module.get_spec("train-heads")
    a = tiny_config(tmp_path)
    b = tiny_config(tmp_path, decoding={"k": 3})
    c = tiny_config(tmp_path, export={"heads": "all"}, decoding={"temperature": 0.5})
    d = tiny_config(tmp_path, decoding={"k_max": 8})
    key = stage_module._cache_key
    assert key(a, spec, {}) != key(b, spec, {}) and key(a, spec, {}) != key(d, spec, {})
    assert key(a, spec, {}) == key(c, spec, {})
