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


def _llama(seed: int, layers: int, hidden: int = 512, vocab: int = 2048):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                      initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def test_evaluate_timed_speedup_agrees_with_a_direct_benchmark_within_10_percent():
    """evaluate's loop (speculator built before the timed call, warm-up, CUDA events, passes until +-5%)
    and a plain benchmark of the same pair (warm-up, then the median of 7 timed generations per prompt)
    give the same speedup of fixed K=4 over the target alone, within 10%."""
    import statistics

    from specdraft.decoding.autoregressive import generate_autoregressive
    from specdraft.decoding.rounds.sampling import SamplingConfig
    from specdraft.decoding.speculative import generate_speculative
    from specdraft.decoding.speculators.drafter import DrafterSpeculator
    from specdraft.decoding.policies.stopping import FixedK
    from specdraft.decoding.timing import timed_call
    from specdraft.pipelines.evaluate.methods import MethodKey
    from specdraft.pipelines.evaluate.plan import Built, Prompt, Run
    from specdraft.pipelines.evaluate.run import TimingPolicy, execute
    from tests.decoding.conftest import noisy_copy

    greedy = SamplingConfig(temperature=0.0)
    target = _llama(0, layers=12).to("cuda", torch.bfloat16)
    drafter = noisy_copy(_llama(0, layers=12), 0.02, seed=1)
    drafter.model.layers = drafter.model.layers[:1]  # a 1-layer drafter sharing the target's embeddings' shape
    drafter.config.num_hidden_layers = 1
    drafter = drafter.to("cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    prompts = [Prompt("test", "x", f"p{i}", tuple(torch.randint(1, 2048, (48,), generator=gen).tolist()), i)
               for i in range(4)]
    n = 64
    plan = [r for p in prompts for r in (
        Run(MethodKey("ar"), p, lambda done: Built(None)),
        Run(MethodKey("fixed", drafter="d", k=4), p, lambda done: Built(DrafterSpeculator(drafter, FixedK(4)))))]
    records = execute(plan, target, n, {"greedy": greedy}, None, "cuda", 2, progress=False,
                      policy=TimingPolicy(2, repeats_max=6, repeat_ci=0.05, warmup=True))
    by = {(r.prompt, r.key.family): r for r in records}
    evaluate_speedup = sum(by[(p.id, "ar")].time for p in prompts) / sum(by[(p.id, "fixed")].time for p in prompts)

    def bench(fn):
        fn()  # warm-up
        return statistics.median(timed_call(fn, "cuda")[1].time for _ in range(7))

    ar = sum(bench(lambda p=p: generate_autoregressive(target, list(p.ids), n, greedy)) for p in prompts)
    spec = sum(bench(lambda p=p: generate_speculative(target, DrafterSpeculator(drafter, FixedK(4)), list(p.ids), n,
                                                      greedy)) for p in prompts)
    bench_speedup = ar / spec
    print(f"timed speedup: evaluate {evaluate_speedup:.3f}, direct benchmark {bench_speedup:.3f}")
    assert abs(evaluate_speedup / bench_speedup - 1) < 0.10
    assert all(r.metrics.n_generated == n for r in records)
