"""Plain autoregressive decoding of one model with its KV cache: the baseline every speedup is
measured against, and the reference the speculative decoder must reproduce exactly under greedy."""
from __future__ import annotations

import time

import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.compat import check_prompt
from specdraft.core.errors import InputError
from specdraft.decoding.metrics import GenerationMetrics, GenerationResult
from specdraft.decoding.rounds.sampling import SamplingConfig, probs_on_cpu, sample


def as_token_list(prompt_ids) -> list[int]:
    """Accept a list of ids, a (T,) tensor or a (1, T) tensor; batch 1 only."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() == 2:
            if prompt_ids.shape[0] != 1:
                raise InputError(f"batch size {prompt_ids.shape[0]} is not supported; pass one prompt at a time")
            prompt_ids = prompt_ids[0]
        if prompt_ids.dim() != 1:
            raise InputError(f"prompt ids must be 1-D or (1, T), got shape {tuple(prompt_ids.shape)}")
        return [int(t) for t in prompt_ids.tolist()]
    return [int(t) for t in prompt_ids]


def eos_set(eos_token_id: int | list[int] | None) -> set[int]:
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(t) for t in eos_token_id}


@torch.inference_mode()
def generate_autoregressive(
    model: torch.nn.Module,
    prompt_ids,
    max_new_tokens: int,
    sampling: SamplingConfig = SamplingConfig(temperature=0.0),
    eos_token_id: int | list[int] | None = None,
    generator: torch.Generator | None = None,
) -> GenerationResult:
    """Sample up to max_new_tokens tokens, one target forward each (the prompt prefill gives the first).

    Sampling happens on CPU from `decoding.rounds.sampling.probs`, exactly as the speculative decoder does,
    so a seeded generator gives the same stream on any device. `generator` must be a CPU generator.
    """
    prompt = as_token_list(prompt_ids)
    check_prompt(prompt, max_new_tokens, model)
    eos = eos_set(eos_token_id)
    m = GenerationMetrics()
    start = time.perf_counter()
    cache = kv.new_cache()
    device = kv.input_device(model)
    out: list[int] = []
    pending = prompt
    while True:
        logits, _ = kv.forward(model, cache, pending, device=device)
        p = probs_on_cpu(logits[-1], sampling)  # (V,)
        m.n_target += 1
        token = int(p.argmax()) if sampling.greedy else int(sample(p, generator))
        out.append(token)
        if len(out) == max_new_tokens or token in eos:
            break
        pending = [token]
    m.time_total = m.time_target = time.perf_counter() - start
    m.n_generated = len(out)
    return GenerationResult(tokens=out, metrics=m)
