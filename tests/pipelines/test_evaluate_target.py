"""evaluate loads the target as the stages trained with it (target.dtype, device_map, quantization through
the one loader), bundle.json records how the stages loaded it, and the report says where it ran.
Quantization and a device_map over GPUs need CUDA: tests/gpu/test_gpu_evaluate.py."""
import json

import pytest
import torch

from specdraft.decoding.bundle.directory import load_bundle
from specdraft.decoding.bundle.schema import BundleSpec
from specdraft.pipelines.evaluate.load import load_target, target_placement
from specdraft.pipelines.evaluate.render import target_line
from specdraft.decoding.rounds.packed_linear import can_pack
from specdraft.pipelines.schema import TargetSection
from tests.pipelines.test_evaluate import _exported  # noqa: F401  (the module's exported tiny run)


@pytest.mark.parametrize("dtype, device_map", [("bfloat16", None), ("float32", "cpu"), ("float16", {"": "cpu"})])
def test_target_loads_with_the_configured_dtype_and_device_map(_exported, dtype, device_map, monkeypatch):  # noqa: F811
    import specdraft.decoding.bundle.loading as loading

    monkeypatch.setattr(loading, "cpu_fp16_units", lambda: True)  # float16 on a CPU runs where it has the units
    bundle = load_bundle(_exported / "bundle")
    tcfg = TargetSection(dtype=dtype, device_map=device_map)
    target = load_target(bundle, tcfg, "cpu")
    assert {p.dtype for p in target.parameters()} == {getattr(torch, dtype)}
    placed = target_placement(target, tcfg, bundle)
    assert placed["devices"] == ["cpu"] and placed["dtype"] == dtype and placed["quantization"] == "none"
    assert placed["device_map"] == device_map and placed["dtype_reason"] == "as given"


def test_the_report_says_which_dtype_auto_chose_and_why(_exported, monkeypatch):  # noqa: F811
    """target.dtype auto on a CPU: bf16 where it has bf16 units, fp32 where not (both taken by patching the probe),
    and the report's target line says which and why."""
    import specdraft.decoding.bundle.loading as loading

    bundle = load_bundle(_exported / "bundle")
    for units, dtype, why in ((("avx512_bf16", "AMX"), "bfloat16", "auto: this CPU has avx512_bf16/AMX"),
                              ((), "float32", "auto: this CPU has no bf16 units (avx512_bf16 or AMX)")):
        monkeypatch.setattr(loading, "cpu_bf16_units", lambda units=units: units)
        placed = target_placement(load_target(bundle, TargetSection(dtype="auto"), "cpu"), TargetSection(), bundle)
        assert placed["dtype"] == dtype and placed["dtype_reason"] == why
        line = " ".join(target_line({"target_load": placed}))
        assert f"Target on cpu, dtype {dtype} ({why}), quantization none." in line
        # the drafters as bundle.load_drafter takes them under decoding.draft_weights auto: int8 where bf16 packs
        drafters = "int8" if dtype == "bfloat16" and can_pack(torch.bfloat16, "cpu") else "the target's dtype"
        assert f"Drafter LMs' linear weights (EAGLE drafters keep theirs): {drafters} (decoding.draft_weights auto)." \
            in line


def test_bundle_records_how_the_target_was_loaded(_exported, tmp_path):  # noqa: F811
    data = json.loads((_exported / "bundle" / "bundle.json").read_text())
    assert {k: data["target"][k] for k in ("dtype", "quantization", "device_map")} == \
        {"dtype": "auto", "quantization": "none", "device_map": None}
    # a spread, quantized target round-trips through bundle.json; an unknown quantization is refused
    data["target"].update(quantization="nf4", device_map={"model.embed_tokens": 0, "lm_head": 1})
    spec = BundleSpec.from_json(data, _exported / "bundle")
    assert spec.target.quantization == "nf4" and spec.target.device_map == {"model.embed_tokens": 0, "lm_head": 1}
    assert spec.to_json(_exported / "bundle")["target"]["device_map"] == {"model.embed_tokens": 0, "lm_head": 1}
    data["target"]["quantization"] = "int3"
    with pytest.raises(Exception, match="quantization"):
        BundleSpec.from_json(data, _exported / "bundle")


def test_report_names_the_targets_devices_dtype_and_quantization():
    placed = {"devices": ["cuda:0", "cuda:1"], "dtype": "bfloat16", "quantization": "nf4", "device_map": "auto",
              "bundle": {"dtype": "bfloat16", "quantization": "none", "device_map": "auto"}}
    line = " ".join(target_line({"target_load": placed}))
    assert "Target on cuda:0, cuda:1, dtype bfloat16, quantization nf4, device_map auto." in line
    assert "the stages loaded it with quantization none" in line  # a difference from training is said
    placed["bundle"]["quantization"] = "nf4"
    assert "stages loaded" not in " ".join(target_line({"target_load": placed}))


@pytest.mark.parametrize("quantization", ["int8", "nf4"])
def test_target_loads_quantized_as_configured(_exported, quantization):  # noqa: F811
    bnb = pytest.importorskip("bitsandbytes")
    bundle = load_bundle(_exported / "bundle")
    tcfg = TargetSection(quantization=quantization)
    target = load_target(bundle, tcfg, "cpu")
    layer = {"int8": bnb.nn.Linear8bitLt, "nf4": bnb.nn.Linear4bit}[quantization]
    assert any(isinstance(m, layer) for m in target.modules())
    placed = target_placement(target, tcfg, bundle)
    assert placed["quantization"] == quantization and placed["devices"] == ["cpu"]
    assert placed["bundle"]["quantization"] == "none"  # what the stages trained with, said beside it
