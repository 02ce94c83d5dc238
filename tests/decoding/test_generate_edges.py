"""`specdraft generate` at its edges, on the generate tests' hand-built bundle: prompts of 512-2048 tokens decode
with the bundle's default (batch-aware) stop rule, whose cost table prices prefills past its widest timed width
by extension (said under --verbose) instead of refusing the prompt; contradictory choices, a device this machine
does not have and a dtype it cannot run usefully are one line and exit 2, before any model loads; --verbose says
which dtype runs and why."""
import json

import pytest
import torch

import specdraft.decoding.bundle.directory as directory
import specdraft.decoding.bundle.loading as loading
from specdraft.decoding.policies.acceptance_head import CONFIG_NAME as HEAD_CONFIG
from specdraft.pipelines.cli import main
from tests.decoding.test_bundle import bundle  # noqa: F401 (a copy of the generate tests' template)
from tests.decoding.test_generate_cli import (MATH, _greedy_reference, _lines, _prompts, _ship_acceptance_summary,
                                              template)  # noqa: F401


def words(n: int) -> str:
    return " ".join(f"w{3 + i % 60}" for i in range(n))


def test_long_prompts_decode_with_the_default_stop_rule(bundle, tmp_path, monkeypatch, capsys):  # noqa: F811
    """600- and 2100-token prompts: the batch-aware rule's table is timed over their cache (prefills at powers of two
    up to it), priced past its widest prefill by extension, and the greedy output is the target's own."""
    monkeypatch.setenv("SPECDRAFT_COST_CACHE", str(tmp_path / "costs"))
    for config in bundle.glob("**/config.json"):  # the tiny models' context, 256, raised (their weights do not change)
        config.write_text(json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 4096}))
    head_config = bundle / "heads" / "math" / "T1" / "D1" / HEAD_CONFIG  # the head names its (edited) drafter
    head_config.write_text(json.dumps({**json.loads(head_config.read_text()), "drafter_hash": directory.drafter_hash(
        directory.bundle_files(bundle / "drafters" / "math"))}))
    _ship_acceptance_summary(bundle)  # (and bundle.json's hashes rewritten)
    for n in (600, 2100):
        out = tmp_path / f"o{n}.jsonl"
        argv = ["generate", str(bundle), "--prompts", _prompts(tmp_path, [{"prompt": words(n)}]), "--drafter", "math",
                "--output", str(out), "--verbose", "--max-new-tokens", "4"]
        assert main(argv) == 0, capsys.readouterr().err
        err = capsys.readouterr().err
        assert "profiled into" in err and "priced by extending the two widest" in err, err
        row = _lines(out)[0]
        assert row["prompt_tokens"] >= n and row["token_ids"] == _greedy_reference(bundle, words(n), 4)


@pytest.mark.parametrize("argv, message", [
    (["--stop-rule", "batch-aware", "--k", "4"], "--stop-rule batch-aware lets a head choose each round's length, "
                                                 "and --k 4 fixes it; give one"),
    (["--stop-rule", "specdecpp", "--k", "2"], "and --k 2 fixes it; give one"),
    (["--stop-rule", "batch-aware", "--method", "ar"], "--stop-rule batch-aware is how a head stops a drafter's rounds, "
                                                       "and --method ar drafts nothing; give one"),
])
def test_contradictory_choices_are_refused(bundle, capsys, argv, message):  # noqa: F811
    assert main(["generate", str(bundle), "--prompt", MATH, "--drafter", "math", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err


@pytest.fixture
def nothing_loads(monkeypatch):
    """Fail the test if the bundle is read or a model loads: the refusal must come first."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(directory, "load_bundle", lambda *a, **k: pytest.fail("the bundle was read"))
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("argv, message", [
    (["--device", "tpu9"], "--device 'tpu9' is not a device name; give cpu, cuda, cuda:N, mps or auto"),
    (["--device", "cuda"], "--device cuda: this machine has no CUDA device"),
    (["--drafter-device", "cuda:1"], "--drafter-device cuda:1: this machine has no CUDA device"),
    (["--dtype", "float16"], "dtype float16 on this CPU: it has no float16 units"),
])
def test_what_this_machine_cannot_run_is_refused_before_any_model_loads(bundle, capsys, monkeypatch, nothing_loads,  # noqa: F811
                                                                        argv, message):
    monkeypatch.setattr(loading, "cpu_fp16_units", lambda: False)
    assert main(["generate", str(bundle), "--prompt", MATH, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specdraft: error:") and message in err and "\n" not in err, err


def test_verbose_says_which_dtype_runs_and_why(bundle, capsys, monkeypatch):  # noqa: F811
    """The bundle records float32 (its stages ran so): that is the default; --dtype auto follows the CPU, both
    branches taken by patching the probe; the drafter runs in the target's dtype."""
    seen = []
    real = directory.Bundle.load_drafter
    monkeypatch.setattr(directory.Bundle, "load_drafter", lambda self, *a, **k: seen.append(real(self, *a, **k)) or seen[-1])
    argv = ["generate", str(bundle), "--prompt", MATH, "--drafter", "math", "--k", "2", "--verbose"]
    assert main(argv) == 0
    assert "dtype float32 (as given)" in capsys.readouterr().err
    monkeypatch.setattr(loading, "cpu_bf16_units", lambda: ("avx512_bf16", "AMX"))
    assert main(argv + ["--dtype", "auto"]) == 0
    assert "dtype bfloat16 (auto: this CPU has avx512_bf16/AMX)" in capsys.readouterr().err
    assert seen[-1].get_input_embeddings().weight.dtype == torch.bfloat16
    monkeypatch.setattr(loading, "cpu_bf16_units", lambda: ())
    assert main(argv + ["--dtype", "auto"]) == 0
    captured = capsys.readouterr()
    assert "dtype float32 (auto: this CPU has no bf16 units" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["N"] >= 1
