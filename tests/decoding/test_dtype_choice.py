"""`dtype: auto` knows the CPU: bf16 on a CPU with bf16 units (avx512_bf16 or AMX) and on a CUDA device with bf16,
fp32 elsewhere; both CPU branches are taken here by patching the probe, so the tests hold on boxes with and
without the units. An explicit float16 on a CPU without float16 units, and a device this machine cannot run,
are one-line input errors before any model loads."""
import pytest
import torch

import specdraft.core.devices as devices
import specdraft.decoding.bundle.loading as loading
from specdraft.core.errors import InputError
from specdraft.decoding.bundle.loading import check_device, choose_dtype, dtype_of, load_causal_lm, resolve_dtype
from tests.decoding.conftest import tiny_llama
from tests.decoding.test_bundle import bundle, template  # noqa: F401 (fixtures: a hand-built bundle)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def probes(monkeypatch):
    """Patch what the probes read: torch's answers (None: this torch has no such probe) and /proc/cpuinfo's flags."""
    def set_probes(avx512_bf16=None, amx_tile=None, flags=()):
        answers = {"avx512_bf16": avx512_bf16, "amx_tile": amx_tile}
        monkeypatch.setattr(devices, "_torch_cpu_probe", lambda name: answers[name])
        monkeypatch.setattr(devices, "_cpu_flags", lambda: set(flags))
        devices.cpu_bf16_units.cache_clear()
    yield set_probes
    devices.cpu_bf16_units.cache_clear()


def test_auto_is_bf16_on_a_cpu_with_bf16_units_and_fp32_without(monkeypatch, no_cuda):
    monkeypatch.setattr(loading, "cpu_bf16_units", lambda: ("avx512_bf16", "AMX"))
    choice = choose_dtype("auto", "cpu")
    assert choice.dtype == torch.bfloat16
    assert choice.line() == "dtype bfloat16 (auto: this CPU has avx512_bf16/AMX)"
    assert resolve_dtype("auto", None) == torch.bfloat16  # a device_map on a machine without CUDA: the CPU's rule
    monkeypatch.setattr(loading, "cpu_bf16_units", lambda: ())
    choice = choose_dtype("auto", "cpu")
    assert choice.dtype == torch.float32 and "no bf16 units" in choice.reason
    # what the user gives is what runs, whatever the CPU
    assert choose_dtype("bfloat16", "cpu").dtype == torch.bfloat16 and choose_dtype("float32", "cpu").reason == "as given"


def test_auto_on_cuda_follows_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(loading, "cpu_bf16_units", lambda: ())
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert choose_dtype("auto", "cuda:0").dtype == torch.bfloat16
    assert choose_dtype("auto", "cpu").dtype == torch.float32  # the CPU's own rule, CUDA or not
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert choose_dtype("auto", "cuda").dtype == torch.float32


def test_the_bf16_probe_asks_torch_then_the_cpu_flags(probes):
    probes(avx512_bf16=True, amx_tile=True, flags={"avx512_bf16", "amx_bf16", "amx_tile"})
    assert devices.cpu_bf16_units() == ("avx512_bf16", "AMX")
    probes(avx512_bf16=False, amx_tile=False, flags={"avx512f", "avx2"})  # an AVX-512 CPU without bf16 (Skylake)
    assert devices.cpu_bf16_units() == ()
    probes(avx512_bf16=True, amx_tile=False, flags={"avx512_bf16"})  # AMD EPYC (Zen 4): no AMX
    assert devices.cpu_bf16_units() == ("avx512_bf16",)
    # a torch without the probes: the flags decide
    probes(flags={"avx512_bf16", "amx_bf16", "amx_tile"})
    assert devices.cpu_bf16_units() == ("avx512_bf16", "AMX")
    probes(flags={"avx2"})
    assert devices.cpu_bf16_units() == ()
    probes(amx_tile=True, flags={"amx_tile", "amx_int8"})  # tiles without bf16 products do not count
    assert devices.cpu_bf16_units() == ()


def test_float16_on_a_cpu_without_float16_units_is_refused(monkeypatch, no_cuda):
    monkeypatch.setattr(loading, "cpu_fp16_units", lambda: False)
    monkeypatch.setattr(loading, "cpu_bf16_units", lambda: ("avx512_bf16",))
    with pytest.raises(InputError, match=r"dtype float16 on this CPU: it has no float16 units.*use bfloat16 \(this CPU"):
        choose_dtype("float16", "cpu")
    monkeypatch.setattr(loading, "cpu_fp16_units", lambda: True)  # avx512_fp16 (Sapphire Rapids): it runs
    assert choose_dtype("float16", "cpu").dtype == torch.float16


@pytest.mark.parametrize("device, message", [
    ("tpu9", "'tpu9' is not a device name; give cpu, cuda, cuda:N, mps or auto"),
    ("meta", "models run on cpu, cuda, mps here, not meta"),
    ("cuda", "this machine has no CUDA device"),
    ("cuda:3", "this machine has no CUDA device"),
])
def test_a_device_this_machine_cannot_run_is_one_line(no_cuda, device, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        check_device(device)
    assert "\n" not in str(e.value)
    assert check_device("cpu") == "cpu"


def test_loading_refuses_before_reading_any_weight(tmp_path, monkeypatch, no_cuda):
    """The device and dtype are checked before transformers reads a file: the model directory is fine, the
    request is not."""
    tiny_llama(0).save_pretrained(tmp_path / "m")
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(loading, "cpu_fp16_units", lambda: False)
    with pytest.raises(InputError, match="no CUDA device"):
        load_causal_lm(tmp_path / "m", "auto", "cuda")
    with pytest.raises(InputError, match="no float16 units"):
        load_causal_lm(tmp_path / "m", "float16", "cpu")


def test_a_drafter_runs_in_its_targets_dtype(tmp_path, monkeypatch, no_cuda):
    monkeypatch.setattr(loading, "cpu_bf16_units", lambda: ("AMX",))
    tiny_llama(0).save_pretrained(tmp_path / "m")
    target = load_causal_lm(tmp_path / "m", "auto", "cpu")
    assert dtype_of(target) == "bfloat16"
    assert dtype_of(load_causal_lm(tmp_path / "m", "float32", "cpu")) == "float32"


def test_a_bundles_drafter_takes_the_loaded_targets_dtype(bundle):  # noqa: F811 (the bundle fixture)
    """Bundle.load_drafter without a dtype: the target's as loaded, else the one the bundle records (float32 here),
    never `auto` on its own (a bf16 target beside an fp32 drafter would be a pair nobody trained)."""
    from specdraft.decoding.bundle.directory import load_bundle

    b = load_bundle(bundle)
    target = b.load_target(dtype="bfloat16", device="cpu")
    assert dtype_of(b.load_drafter("d", device="cpu", target=target)) == "bfloat16"
    assert dtype_of(b.load_drafter("d", device="cpu")) == "float32"
