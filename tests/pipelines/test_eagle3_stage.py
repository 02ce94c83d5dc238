"""train-drafters with train_drafters.eagle.variant: eagle3 on the tiny run: the drafter records its variant
and fused layers, and decodes greedily lossless over the run's target."""
import dataclasses
import shutil

import pytest

from specdraft.core.errors import InputError
from specdraft.decoding.autoregressive import generate_autoregressive
from specdraft.decoding.speculators.eagle import EagleSpeculator
from specdraft.decoding.speculators.eagle_model import eagle3_layers, load_eagle, read_eagle_config
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.decoding.speculative import generate_speculative
from specdraft.decoding.policies.stopping import FixedK
from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import tiny_config
from tests.pipelines.test_eagle_stage import EAGLE, FAST

EAGLE3 = {"eagle": dict(EAGLE["eagle"], variant="eagle3", ttt_steps=2, drafters=["ofa"])}


def _config(root, eagle=EAGLE3):
    drafters = dict(dataclasses.asdict(tiny_config(root).train_drafters), **eagle)
    return tiny_config(root, **FAST, train_drafters=drafters)


def test_eagle3_drafter_is_trained_and_decodes_losslessly(_tiny_run_template, tmp_path):
    root = tmp_path / "run"
    shutil.copytree(_tiny_run_template, root)
    cfg = _config(root)
    for stage in ("distill-data", "train-drafters"):
        run_stage(cfg, stage)
    out = root / "drafters" / "eagle" / "eagle-ofa"
    meta = read_eagle_config(out)
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(root / "target").eval()
    layers = list(eagle3_layers(target.config.num_hidden_layers))
    assert meta["variant"] == "eagle3" and meta["feature_layers"] == layers and meta["steps"] == 3
    assert read_manifest(root / "drafters").metrics["eagle"]["drafters"]["eagle-ofa"]["variant"] == "eagle3"
    drafter = load_eagle(out, target=target)
    greedy = SamplingConfig(temperature=0.0)
    result = generate_speculative(target, EagleSpeculator(drafter, FixedK(3)), [5, 6, 7], 16, greedy)
    assert result.tokens == generate_autoregressive(target, [5, 6, 7], 16, greedy).tokens


def test_layers_need_the_eagle3_variant(tiny_run):
    with pytest.raises(InputError, match="only with variant: eagle3"):
        _config(tiny_run, {"eagle": dict(EAGLE["eagle"], layers=[1, 2, 3])}).train_drafters.eagle.check()
