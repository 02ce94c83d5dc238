"""One cached forward step and KV-cache rollback: the only places the decoder touches a model.

Every model the decoder drives (target, drafter, a test stub) is called the same way: new token ids,
the model's own `DynamicCache`, and how many trailing positions we need logits (and hidden states) for.
Tokens go to the model's input device, so a target spread over GPUs by `device_map` and a drafter on
another device both work; the caller moves the outputs where it needs them.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


def new_cache() -> DynamicCache:
    return DynamicCache()


def input_device(model: torch.nn.Module) -> torch.device:
    """Where the model wants its input ids (the embedding's device under `device_map`)."""
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        param = next(model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def crop(cache: DynamicCache, length: int) -> None:
    """Roll the cache back to its first `length` positions (no-op if it is not longer).

    A negative argument to `crop` means "remove this many from the end" in every transformers version
    (5.x rejects the legacy positive "final length" form).
    """
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def forward(
    model: torch.nn.Module,
    cache: DynamicCache,
    token_ids: list[int],
    last: int = 1,
    hidden: bool = False,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Feed `token_ids` after what `cache` holds; return logits (last, V) and, if asked, the final
    hidden states (last, H) (after the final norm: `hidden_states[-1]`) of the last `last` positions.
    The cache grows by len(token_ids). `device`: the model's input device if already known.
    """
    ids = torch.tensor([token_ids], dtype=torch.long, device=device or input_device(model))  # (1, T)
    out = model(
        input_ids=ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=last,  # the LM head runs on `last` positions only, not the whole prompt
        output_hidden_states=hidden,
    )
    logits = out.logits[0, -last:]  # (last, V)
    states = out.hidden_states[-1][0, -last:] if hidden else None  # (last, H)
    return logits, states
