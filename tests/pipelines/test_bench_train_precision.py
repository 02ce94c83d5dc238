"""benchmarks/training/bench_train_precision.py: its --model parsing and one-line refusals, dev agreement judged in
fp32 inside an autocast region, a fit in either precision on a tiny drafter and fabricated distilled rows (in this
process, and in a child of its own), the table's arithmetic, and the refusal on a CPU without bf16 units."""
import argparse
import json

import datasets
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdraft.core.errors import InputError
from specdraft.core import devices
from specdraft.drafters.data import CausalLMCollator
from tests.conftest import import_benchmark

V = 64


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_train_precision")


@pytest.fixture
def world(tmp_path):
    """A tiny model directory and a run directory whose distill_data holds greedy and sampled rows."""
    model = tmp_path / "model"
    LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(model)
    g = torch.Generator().manual_seed(0)

    def rows(split, n):
        return [{"id": f"{split}{i}@t{t}", "prompt_id": f"{split}{i}", "domain": "d", "temperature": float(t),
                 "prompt_ids": torch.randint(1, V, (5,), generator=g).tolist(),
                 "response_ids": torch.randint(1, V, (7,), generator=g).tolist()}
                for i in range(n) for t in (0, 1)]

    run = tmp_path / "run"
    datasets.DatasetDict({s: datasets.Dataset.from_list(rows(s, n)) for s, n in (("train", 8), ("dev", 3))}
                         ).save_to_disk(str(run / "distill_data" / "data"))
    return model, run


def test_a_model_is_a_name_two_directories_and_options(bench, world, tmp_path, capsys):
    model, run = world
    spec = bench.parse_model(f"m={model},{run},fresh,lr=1e-3,batch=4")
    assert (spec.name, spec.init, spec.run, spec.fresh, spec.lr, spec.batch) == ("m", model, run, True, 1e-3, 4)
    assert bench.parse_model(f"m={model},{run}").lr == 2e-5  # the stage's finetuning rate unless given
    for bad in (f"m={model}", f"m={model},{run},stale", f"m={model},{run},lr=-1", f"m={model},{run},batch=x"):
        with pytest.raises(InputError, match="give NAME=INIT,RUN"):
            bench.parse_model(bad)
    page = tmp_path / "RESULTS.md"
    assert bench.main(["--model", f"m={model},{tmp_path / 'nowhere'}", "--page", str(page)]) == 2
    assert "has no distill_data/" in capsys.readouterr().err and not page.exists()


def test_agreement_is_judged_in_fp32_inside_autocast(bench, world):
    model_dir, run = world
    model = LlamaForCausalLM.from_pretrained(model_dir)
    rows = bench.greedy_rows(run, "dev")
    assert {r["temperature"] for r in rows} == {0.0} and len(rows) == 3
    batches = [CausalLMCollator(pad_token_id=0)(rows)]
    plain = bench.agreement(model, batches)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert bench.agreement(model, batches) == plain
    assert model.training  # handed back as the fit had it


def test_a_fit_records_its_dev_curve_in_either_precision(bench, world, tmp_path, monkeypatch):
    model, run = world
    monkeypatch.setattr(devices, "cpu_bf16_units", lambda: ("AMX",))  # bf16-mixed as given needs the units
    common = ["--model", f"tiny={model},{run},fresh,lr=1e-2,batch=4", "--steps", "4", "--eval-every", "2",
              "--threads", "1"]
    for precision in bench.PRECISIONS:
        out = tmp_path / f"{precision}.json"
        assert bench.main(common + ["--fit-one", precision, "--fit-out", str(out)]) == 0
        points = json.loads(out.read_text())
        assert [s for s, _, _ in points] == [0, 2, 4]  # before the fit, then every 2 steps
        assert all(0 <= a <= 1 for _, _, a in points) and points[0][1] < points[-1][1]


def test_a_child_fits_in_a_process_of_its_own(bench, world, tmp_path):
    model, run = world
    spec = bench.parse_model(f"tiny={model},{run},fresh,batch=4")
    args = argparse.Namespace(steps=2, eval_every=1, max_length=64, threads=1, seed=0)
    fit = bench.child_fit(spec, "32-true", args, tmp_path)  # fp32 runs on any CPU
    assert [s for s, _, _ in fit["points"]] == [0, 1, 2] and fit["peak_gb"] > 0


def test_the_table_reads_steps_seconds_agreement_and_memory(bench, world):
    model, run = world
    spec = bench.parse_model(f"tiny={model},{run},steps=4")
    fits = {"32-true": [{"points": [[0, 0.0, 0.5], [4, 8.0, 0.7]], "peak_gb": 3.0}] * 2,
            "bf16-mixed": [{"points": [[0, 0.0, 0.5], [4, 4.0, 0.7]], "peak_gb": 2.0},
                           {"points": [[0, 0.0, 0.5], [4, 6.0, 0.6]], "peak_gb": 2.5}]}
    args = argparse.Namespace(max_length=256, rounds=2, steps=16)
    text = bench.render([{"spec": spec, "parameters": 5e6, "rows": 8, "dev": 3, "fits": fits}], args, "cmd")
    assert "| 32-true | 2.00 (2.00-2.00) | 0.500 | 0.700 | +1.5000 | 3.0 |" in text  # 0.2 in 8 s: 1.5 a minute
    # medians over the two rounds: 1.25 s a step, agreement 0.65, gains 3.0 and 1.0 a minute; the larger peak
    assert "| bf16-mixed | 1.25 (1.00-1.50) | 0.500 | 0.650 | +2.0000 | 2.5 |" in text
    assert "seconds a step: 1.60x" in text and "4 steps" in text


def test_a_cpu_without_bf16_units_is_refused_in_one_line(bench, world, tmp_path, monkeypatch, capsys):
    model, run = world
    monkeypatch.setattr(devices, "cpu_bf16_units", lambda: ())
    page = tmp_path / "RESULTS.md"
    assert bench.main(["--model", f"tiny={model},{run}", "--page", str(page)]) == 2
    assert "this CPU has no bf16 units" in capsys.readouterr().err and not page.exists()
