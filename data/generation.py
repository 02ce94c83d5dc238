"""Batched generation from a causal LM with Hugging Face `generate`: the target's responses that become
distillation data (distill-data) and router labels (train-router)."""
from __future__ import annotations

import torch


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
    results = []
    for row in out[:, width:].tolist():
        end = next((i for i, t in enumerate(row) if t in stops), None)
        if end is not None:
            results.append((row[: end + 1], "eos"))
        else:
            results.append((row, "length"))
    return results
