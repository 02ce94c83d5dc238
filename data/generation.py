"""Batched generation of the target's answers, the responses that become distillation data (distill-data)
and router labels (train-router): Hugging Face `generate` on left-padded batches (`generate_responses`), or
the project's own batched decoder (`decode_responses`: static KV cache, ragged rows, optionally compiled, and
optionally speculative with a drafter whose drafts the target verifies). Both return, per prompt, the answer's
token ids (the stop token included when the target stopped) and why it ended ("eos" | "length")."""
from __future__ import annotations

import torch

from specdraft.decoding.compilation import StepCompiler
from specdraft.decoding.generate import Plan, decode_batch
from specdraft.decoding.metrics import GenerationMetrics
from specdraft.decoding.rounds.sampling import SamplingConfig


def cut_at_stop(row: list[int], stops: set[int]) -> tuple[list[int], str]:
    """`row` up to and including its first stop token -> (ids, "eos"); no stop: (row, "length")."""
    end = next((i for i, t in enumerate(row) if t in stops), None)
    return (row[: end + 1], "eos") if end is not None else (row, "length")


@torch.no_grad()
def generate_responses(model, prompts: list[list[int]], pad_id: int, eos_id: int | list[int], temperature: float,
                   top_k: int, top_p: float, max_new_tokens: int, seed: int) -> list[tuple[list[int], str]]:
    """Left-padded batched generation with the KV cache; each row stops at its first end-of-turn token
    (`eos_id`: one id or several, e.g. decoding.bundle.chat.end_of_turn_ids)."""
    stops = set(eos_id) if isinstance(eos_id, (list, tuple)) else {eos_id}
    device = model.get_input_embeddings().weight.device
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p)
        mask[r, width - len(p):] = 1
    torch.manual_seed(seed)
    sampling = dict(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p) if temperature > 0 else \
        dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                         eos_token_id=sorted(stops), pad_token_id=pad_id, use_cache=True, **sampling)
    return [cut_at_stop(row, stops) for row in out[:, width:].tolist()]


def decode_responses(target, prompts: list[list[int]], stops: list[int], sampling: SamplingConfig, max_new_tokens: int,
                     seed: int, plan: Plan | None = None, compiler: StepCompiler | None = None,
                     metrics: list[GenerationMetrics] | None = None) -> list[tuple[list[int], str]]:
    """The batch through the decoder's front door (`decode_batch`) under `plan` (None: the target alone; or a
    drafter and its stopping policy: lossless, so the answers are the target's own), sampling from one generator
    seeded with `seed`; `compiler`: the StepCompiler a caller keeps over many batches, so each graph compiles once
    (None: eager). Each row ends at its first stop token, kept, as `generate_responses` returns it. metrics: a list
    that receives each row's decoder counts (target forwards, drafts), for a caller that reports them."""
    results = decode_batch(target, prompts, max_new_tokens, plan or Plan("target"), sampling, stops, seed,
                           compiler or "none")
    if metrics is not None:
        metrics.extend(r.metrics for r in results)
    return [cut_at_stop(list(r.tokens), set(stops)) for r in results]
