"""What only a CUDA machine can check (`make test-gpu`; off by default, marker `gpu`).

- the shared trainer (training/trainer.py) trains a drafter in bf16-mixed under the auto, fsdp and
  deepspeed_stage_2 strategies on one GPU, and the loss goes down;
- distill-data runs with an int8 and an nf4 (bitsandbytes) target on the GPU;
- a target placed by device_map="auto" with a max_memory budget that forces part of it onto the CPU
  still decodes greedily token for token like transformers' generate;
- greedy speculative decoding in bf16 on the GPU equals transformers' greedy `generate`.
"""
from __future__ import annotations

import pytest
import torch

# at module level, so that `make test` (which collects this file before deselecting it) fails when a helper
# moves: GPU tests run only where a GPU is lent
from tests.decoding.conftest import noisy_copy
from tests.pipelines.conftest import fresh_copy, run_template, tiny_config
from tests.training.test_trainer import V, _cfg, _logged

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


# --- training: the shared trainer on one GPU ---------------------------------------------------------

@pytest.mark.parametrize("strategy", ["auto", "fsdp", "deepspeed_stage_2"])
def test_drafter_trains_in_bf16_on_one_gpu(tmp_path, strategy):
    from specdraft.drafters.data import CausalLMCollator, CausalLMDataModule
    from specdraft.drafters.lit_lm import CausalLMModule
    from specdraft.drafters.model import build_causal_lm
    from specdraft.training.trainer import fit, build_trainer

    # 8 fixed sequences seen again and again: a drafter that trains at all fits them quickly
    gen = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(0, V, (12,), generator=gen).tolist()} for _ in range(8)] * 8
    cfg = _cfg(strategy=strategy, accelerator="gpu", devices=1, max_steps=30, batch_size=8, checkpoint_every_n_steps=0)
    module = CausalLMModule(build_causal_lm("demo-tiny", V, seed=0), lr=1e-2)
    dm = CausalLMDataModule(data, CausalLMCollator(pad_token_id=0), batch_size=cfg.batch_size, seed=cfg.seed)
    trainer = build_trainer(cfg, tmp_path)
    fit(trainer, module, dm, cfg)

    assert trainer.precision == "bf16-mixed" and trainer.global_step == 30
    assert trainer.strategy.root_device.type == "cuda"
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    curve = _logged(tmp_path)
    first, last = curve[min(curve)], curve[max(curve)]
    print(f"{strategy}: train/loss {first:.3f} -> {last:.3f}")
    assert last < 0.7 * first, curve


# --- quantized targets through distill-data ------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_target_run(tmp_path_factory):

    return run_template(tmp_path_factory, "gpu_tiny_run", None, ("prepare-data", "pretrain-target"))


@pytest.mark.parametrize("quantization", ["int8", "nf4"])
def test_quantized_target_through_distill_data(tiny_target_run, tmp_path, monkeypatch, quantization):
    import bitsandbytes as bnb

    import specdraft.pipelines.distill_data as dd
    from specdraft.pipelines.readers import load_distill_data
    from specdraft.decoding.bundle.loading import load_causal_lm
    from specdraft.pipelines.stage import run_stage

    root = fresh_copy(tiny_target_run, tmp_path)
    loaded = []

    def spy(*args, **kwargs):
        model = load_causal_lm(*args, **kwargs)
        loaded.append(model)
        return model

    monkeypatch.setattr(dd, "load_causal_lm", spy)
    cfg = tiny_config(root, target={"quantization": quantization}, distill_data={"device": "cuda"})
    out = run_stage(cfg, "distill-data")

    (model,) = loaded
    layer = {"int8": bnb.nn.Linear8bitLt, "nf4": bnb.nn.Linear4bit}[quantization]
    quantized = [m for m in model.modules() if isinstance(m, layer)]
    assert quantized and all(m.weight.device.type == "cuda" for m in quantized)
    # the quantized model computes nearly what the bf16 one does (same weights, same prompt)
    reference = load_causal_lm(root / "target", "bfloat16", "cuda")
    ids = torch.arange(1, 40, device="cuda")[None]
    with torch.no_grad():
        a, b = model(ids).logits.float(), reference(ids).logits.float()
    rel = float((a - b).norm() / b.norm())
    print(f"{quantization}: relative logit error vs bf16 {rel:.4f}, "
          f"memory {model.get_memory_footprint()} vs {reference.get_memory_footprint()} bytes")
    assert rel < {"int8": 0.1, "nf4": 0.3}[quantization]
    assert model.get_memory_footprint() < reference.get_memory_footprint()

    ds = load_distill_data(out)
    vocab = model.config.vocab_size
    assert len(ds["train"]) == 2 * 6 * 2 and len(ds["dev"]) == 2 * 3 * 2
    for r in ds["train"]:
        assert 1 <= len(r["response_ids"]) <= 8 and all(0 <= t < vocab for t in r["response_ids"])
        assert (r["finish_reason"] == "eos") == (r["response_ids"][-1] == 2)


# --- decoding on the GPU ------------------------------------------------------------------------------

def _llama(seed: int, layers: int, hidden: int = 256, vocab: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.2,  # peaked next-token distributions: bf16 rounding cannot flip an argmax
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return LlamaForCausalLM(cfg).eval()


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.get_input_embeddings().weight.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


PROMPTS = [list(range(1, 9)), [5, 17, 300, 42, 9, 9, 1], [int(x) for x in torch.arange(60) * 7 % 500]]


def test_greedy_speculative_in_bf16_equals_transformers_generate():
    from specdraft.decoding.speculative import generate_with_drafter

    target = _llama(0, layers=4).to("cuda", torch.bfloat16)
    drafter = noisy_copy(_llama(0, layers=4), 0.05, seed=1).to("cuda", torch.bfloat16)
    n_target = n_tokens = 0
    for prompt in PROMPTS:
        expected = _hf_greedy(target, prompt, 40)
        for k in (1, 3, 6):
            result = generate_with_drafter(target, drafter, prompt, 40, k=k)
            assert result.tokens == expected, (prompt, k)
            n_target, n_tokens = n_target + result.metrics.n_target, n_tokens + result.metrics.n_generated
    assert n_target < n_tokens  # drafts were accepted: the test exercised acceptance, rejection and rollback


def test_sampling_on_gpu_is_seeded_and_valid():
    from specdraft.decoding.rounds.sampling import SamplingConfig
    from specdraft.decoding.speculative import generate_with_drafter

    target = _llama(0, layers=2).to("cuda", torch.bfloat16)
    drafter = noisy_copy(_llama(0, layers=2), 0.05, seed=1).to("cuda", torch.bfloat16)
    sampling = SamplingConfig(temperature=1.0)
    runs = [generate_with_drafter(target, drafter, PROMPTS[0], 30, sampling, k=4,
                                 generator=torch.Generator().manual_seed(3)).tokens for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 30 and all(0 <= t < 512 for t in runs[0])


def test_device_map_auto_split_over_cpu_and_gpu_decodes_like_generate(tmp_path):
    from specdraft.decoding.bundle.loading import load_causal_lm
    from specdraft.decoding.speculative import generate_with_drafter

    _llama(0, layers=6).save_pretrained(tmp_path / "target", safe_serialization=True)
    per_layer = sum(p.numel() for p in _llama(0, layers=1).model.layers[0].parameters()) * 2  # bf16 bytes
    # room on the GPU for the embeddings and about two of the six layers: the rest must go to the CPU
    budget = {0: 3 * per_layer, "cpu": 2**30}
    target = load_causal_lm(tmp_path / "target", "bfloat16", device_map="auto", max_memory=budget)
    placed = set(target.hf_device_map.values())
    print(f"hf_device_map: {target.hf_device_map}")
    assert "cpu" in placed and (0 in placed or "cuda:0" in placed), target.hf_device_map

    drafter = noisy_copy(_llama(0, layers=6), 0.05, seed=1).to("cuda", torch.bfloat16)
    for prompt in PROMPTS[:2]:
        expected = _hf_greedy(target, prompt, 24)
        result = generate_with_drafter(target, drafter, prompt, 24, k=3)
        assert result.tokens == expected and result.metrics.n_target < 24


def test_probs_on_cpu_from_gpu_logits_is_probs_moved_to_cpu():
    from specdraft.decoding.rounds.sampling import SamplingConfig, probs, probs_on_cpu

    logits = torch.randn(5, 32000, device="cuda", dtype=torch.bfloat16)
    for cfg in (SamplingConfig(0.0), SamplingConfig(1.0)):
        assert torch.equal(probs_on_cpu(logits, cfg), probs(logits, cfg).cpu())


# --- the batched static-cache decoder on the GPU --------------------------------------------------------

def _batch_policies(hidden: int, table=None):
    """The batched policies; with a cost table (one profiled on this GPU), the head rules that read it too."""
    from specdraft.decoding.policies.batch_aware import (BatchAwareSpecDec, GlobalVerifyBudget, KPerBatchSize,
                                                          LockstepBatchAwareSpecDec)
    from specdraft.decoding.policies.batch_length_ucb import LengthUCB
    from specdraft.decoding.policies.stopping import FixedK, LockstepSpecDecPP, SpecDecPP
    from tests.decoding.test_greedy_equivalence import random_head

    def head():
        return random_head(hidden, 0).cuda()

    policies = {"autoregressive": None, "K3": FixedK(3), "specdecpp": SpecDecPP(head(), 0.5, k_max=6),
                "ucb-lengths": LengthUCB((0, 1, 2, 4)), "lockstep-specdecpp": LockstepSpecDecPP(head(), 0.5, k_max=6),
                "k-per-batch-size": KPerBatchSize({1: 4, 2: 2})}
    if table is not None:
        policies |= {"batch-aware": BatchAwareSpecDec(head(), table, 0.8, 6),
                     "batch-aware-lockstep": LockstepBatchAwareSpecDec(head(), table, 0.8, 6),
                     "global-budget": GlobalVerifyBudget(head(), table, 0.8, 4)}
    return policies


@pytest.mark.parametrize("compile", ["none", "reduce-overhead"])
def test_batched_greedy_in_bf16_equals_each_prompt_alone(compile):
    """Every row of a ragged bf16 batch equals transformers' greedy generate of that prompt alone, for
    every batched policy (the head rules deciding inside the draft graph, the batch-aware ones priced by a
    table profiled here); fixed K and SpecDec++ with CUDA graphs (reduce-overhead) too."""
    from specdraft.decoding.batched import generate_batch
    from specdraft.decoding.costs.profile import cache_length_for, profile_cost_table

    target = _llama(0, layers=4).to("cuda", torch.bfloat16)
    drafter = noisy_copy(_llama(0, layers=4), 0.05, seed=1).to("cuda", torch.bfloat16)
    expected = [_hf_greedy(target, prompt, 40) for prompt in PROMPTS]
    # eager: the batch-aware rules priced by this GPU's own step times (the table's CUDA timing too)
    table = None
    if compile == "none":
        table = profile_cost_table(target, drafter, [1, len(PROMPTS)], 7, compile, repeats=2, context=16,
                                   cache_length=cache_length_for(max(map(len, PROMPTS)), 40, 6, compile))
        assert table.device.startswith("cuda") and all(t > 0 for row in table.verify for t in row)
    for name, policy in _batch_policies(drafter.config.hidden_size, table).items():
        # compiled: fixed K and SpecDec++ cover the verify and both drafter widths (every head rule under CUDA graphs,
        # with its table profiled in that mode, did not finish within 110 s on an H200, 2026-11-28: not checked)
        if compile != "none" and name not in ("K3", "specdecpp"):
            continue
        results = generate_batch(target, PROMPTS, 40, drafter=drafter if policy else None, policy=policy,
                                 compile=compile)
        assert [r.tokens for r in results] == expected, name
        # drafts were accepted; the priced rules may rightly draft nothing (this drafter costs what the target does)
        if policy is not None and name not in ("batch-aware", "batch-aware-lockstep", "global-budget"):
            assert sum(r.metrics.n_target for r in results) < 3 * 40, name


def test_batched_sampling_on_gpu_is_seeded_and_valid():
    from specdraft.decoding.batched import generate_batch
    from specdraft.decoding.rounds.sampling import SamplingConfig
    from specdraft.decoding.policies.stopping import FixedK

    target = _llama(0, layers=2).to("cuda", torch.bfloat16)
    drafter = noisy_copy(_llama(0, layers=2), 0.05, seed=1).to("cuda", torch.bfloat16)
    hot = SamplingConfig(temperature=1.0)
    runs = [generate_batch(target, PROMPTS, 30, drafter=drafter, policy=FixedK(4), sampling=hot, seed=3) for _ in range(2)]
    assert [r.tokens for r in runs[0]] == [r.tokens for r in runs[1]]
    assert all(len(r.tokens) == 30 and all(0 <= t < 512 for t in r.tokens) for r in runs[0])


def test_batched_decoder_on_a_target_split_over_cpu_and_gpu(tmp_path):
    """device_map="auto" with a budget that puts part of the target on the CPU: each cache layer sits
    on its layer's device, and every row still decodes like transformers' generate."""
    from specdraft.decoding.batched import generate_batch
    from specdraft.decoding.bundle.loading import load_causal_lm
    from specdraft.decoding.policies.stopping import FixedK

    _llama(0, layers=6).save_pretrained(tmp_path / "target", safe_serialization=True)
    per_layer = sum(p.numel() for p in _llama(0, layers=1).model.layers[0].parameters()) * 2
    target = load_causal_lm(tmp_path / "target", "bfloat16", device_map="auto", max_memory={0: 3 * per_layer, "cpu": 2**30})
    assert "cpu" in set(target.hf_device_map.values()), target.hf_device_map
    drafter = noisy_copy(_llama(0, layers=6), 0.05, seed=1).to("cuda", torch.bfloat16)
    expected = [_hf_greedy(target, prompt, 24) for prompt in PROMPTS[:2]]
    results = generate_batch(target, PROMPTS[:2], 24, drafter=drafter, policy=FixedK(3))
    assert [r.tokens for r in results] == expected
