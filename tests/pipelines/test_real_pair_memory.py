"""A real pair's drafters are each a third of the target (Qwen2.5-Coder 0.5B beside its 1.5B): train-drafters'
alignment table and acceptance-data hold one drafter in memory at a time, never all of them beside the target."""
import gc
import json
import weakref
from pathlib import Path

import pytest

import specdraft.pipelines.acceptance_data as ad
import specdraft.pipelines.train_drafters as td
from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import FAST, tiny_config


@pytest.fixture
def drafters_alive(monkeypatch):
    """install(stage module) -> a list that gets, at every forward of the target the stage loads, how many of the
    drafters it loaded are still alive (after a garbage collection: a dropped drafter counts as gone); its
    loaded_alive() counts them at any other moment."""
    loaded = []

    class Alive(list):
        def loaded_alive(self) -> int:
            gc.collect()
            return sum(ref() is not None for ref in loaded)

    def install(module):
        alive = Alive()
        real_drafter, real_target = module.load_drafter, module.load_causal_lm

        def tracked(load):
            def drafter(*args, **kwargs):
                model = load(*args, **kwargs)
                loaded.append(weakref.ref(model))
                return model
            return drafter

        def count(_module, _args):
            alive.append(alive.loaded_alive())

        def target(*args, **kwargs):
            model = real_target(*args, **kwargs)
            model.register_forward_pre_hook(count)
            return model

        monkeypatch.setattr(module, "load_drafter", tracked(real_drafter))
        if hasattr(module, "load_to_train"):  # train-drafters: the drafters it trains, beside those it measures
            monkeypatch.setattr(module, "load_to_train", tracked(module.load_to_train))
        monkeypatch.setattr(module, "load_causal_lm", target)
        return alive
    return install


def test_alignment_table_holds_one_drafter_at_a_time(drafted_run, drafters_alive):
    alive = drafters_alive(td)
    cfg = tiny_config(drafted_run, **FAST)
    out = run_stage(cfg, "train-drafters", force=True)
    table = json.loads((Path(out) / "alignment.json").read_text())
    assert sorted(table) == ["base", "math", "ofa", "translate"]  # every drafter measured, each on its own turn
    assert alive and max(alive) == 1


def test_finetuning_holds_one_drafter_at_a_time(drafted_run, drafters_alive, monkeypatch):
    """The trainer of a finished drafter (its optimizer: twice the drafter again) is gone before the next trains."""
    alive = drafters_alive(td)  # the patched loader records every drafter loaded
    at_fit = []
    real_train = td._train

    def train(model, *args, **kwargs):
        at_fit.append(alive.loaded_alive())
        return real_train(model, *args, **kwargs)

    monkeypatch.setattr(td, "_train", train)
    run_stage(tiny_config(drafted_run, **FAST), "train-drafters", force=True)
    # the general phase's base (built, not loaded), then math, translate and ofa: each alone when its fit starts
    assert at_fit == [0, 1, 1, 1]


def test_acceptance_data_holds_one_drafter_at_a_time(drafted_run, drafters_alive):
    alive = drafters_alive(ad)
    cfg = tiny_config(drafted_run, **FAST)
    out = run_stage(cfg, "acceptance-data")
    assert sorted(read_manifest(out).metrics["drafters"]) == ["math", "ofa", "translate"]
    assert alive and max(alive) == 1


def test_a_kept_init_that_is_a_specialists_best_rival_gets_its_margin_column():
    """With no general phase the kept sibling is measured as `base` and listed under its own name too; where it
    is the best rival of a specialist (a sibling beats drafters barely finetuned), the margin reads its column."""
    import torch

    from specdraft.drafters.model import build_causal_lm, preset
    from specdraft.pipelines.schema import TrainDraftersSection

    def model(seed):
        return build_causal_lm(preset("demo-tiny"), vocab_size=40, seed=seed).eval()

    target = model(0)
    loaders = {"math": lambda: model(1), "ofa": lambda: model(2), "base": lambda: model(0)}  # base: the target
    g = torch.Generator().manual_seed(0)
    rows = [{"domain": "math", "prompt_ids": torch.randint(3, 40, (5,), generator=g).tolist(),
             "response_ids": torch.randint(3, 40, (6,), generator=g).tolist()} for _ in range(4)]
    table = td.alignment_table(target, loaders, rows, 0, TrainDraftersSection(), ["math", "ofa", "sibling"], 0,
                               {"sibling": "base"})
    assert table["sibling"]["math"]["agreement"] == 1.0  # the target's own weights
    own = table["math"]["math"]
    assert own["agreement_vs_best_other"] == pytest.approx(own["agreement"], abs=1e-3)  # over the sibling's 1.0
