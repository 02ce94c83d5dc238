"""evaluate on a CUDA machine (`make test-gpu`; marker `gpu`): the target loaded as the stages trained with
it (quantized with bitsandbytes, or placed by device_map), and timing a GPU can trust (CUDA events,
warm-up, repeats until the interval is narrow)."""
from __future__ import annotations

import json

import pytest
import torch

from tests.pipelines.conftest import FAST, run_template
from tests.pipelines.test_evaluate import TINY_EVAL

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

STAGES = ("prepare-data", "pretrain-target", "distill-data", "train-drafters", "acceptance-data", "train-heads",
          "export", "evaluate")


@pytest.mark.parametrize("target", [{"quantization": "nf4"}, {"device_map": "auto", "dtype": "bfloat16"}],
                         ids=["nf4", "device_map-auto"])
def test_evaluate_loads_the_target_as_trained_on_the_gpu(tmp_path_factory, target):
    pytest.importorskip("bitsandbytes")
    sections = {**FAST, "target": target, "distill_data": {"device": "cuda"},
                "evaluate": {**TINY_EVAL, "device": "cuda", "stream_bandits": []}}
    root = run_template(tmp_path_factory, "gpu_evaluate", None, STAGES, **sections)
    bundle = json.loads((root / "bundle" / "bundle.json").read_text())["target"]
    assert bundle["quantization"] == target.get("quantization", "none")
    assert bundle["device_map"] == target.get("device_map")
    metrics = json.loads((root / "report" / "metrics.json").read_text())
    placed = metrics["target_load"]
    assert placed["devices"] == ["cuda:0"] and placed["quantization"] == target.get("quantization", "none")
    assert metrics["timer"] == "cuda events"
    report = (root / "report" / "report.md").read_text()
    assert f"Target on cuda:0, dtype {placed['dtype']}, quantization {placed['quantization']}" in report
    # lossless whatever the loading: every greedy run emits as many tokens as AR on its prompt
    ar = {r["prompt"]: r["N"] for r in metrics["runs"] if r["family"] == "ar" and r["mode"] == "greedy"}
    assert all(r["N"] == ar[r["prompt"]] for r in metrics["runs"] if r["mode"] == "greedy" and r["prompt"] in ar)
