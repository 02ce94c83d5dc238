"""Checks that fail early, with one line naming the problem and the fix (`InputError`).
(Sampling settings are validated by `decoding.sampling.SamplingConfig` itself.)

Speculative sampling compares p and q token by token, so drafter and target must share the vocabulary
*and* the tokenizer (same ids for the same strings); heads must read the drafter they were trained on.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from core.errors import InputError


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 over the vocabulary (token -> id, added tokens included) and the special tokens.

    Built from what survives `save_pretrained` / `from_pretrained` unchanged, so a tokenizer and its
    reloaded copy share a fingerprint while any change of ids or special tokens changes it.
    """
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    special = {
        name: getattr(tokenizer, name, None)
        for name in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
    }
    special = {k: str(v) for k, v in special.items() if v is not None}
    payload = json.dumps({"vocab": vocab, "special": special}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _config(model: Any) -> Any:
    return getattr(model, "config", None)


def vocab_size(model: Any) -> int | None:
    return getattr(_config(model), "vocab_size", None)


def context_length(model: Any) -> int | None:
    return getattr(_config(model), "max_position_embeddings", None)


def check_pair(target: Any, drafter: Any, target_tokenizer: Any = None, drafter_tokenizer: Any = None) -> None:
    """Drafter and target must have the same vocabulary size and, when given, the same tokenizer."""
    vt, vd = vocab_size(target), vocab_size(drafter)
    if vt is not None and vd is not None and vt != vd:
        raise InputError(
            f"drafter vocabulary size {vd} differs from the target's {vt}; "
            "use a drafter trained with the target's tokenizer"
        )
    if target_tokenizer is not None and drafter_tokenizer is not None:
        ft, fd = tokenizer_fingerprint(target_tokenizer), tokenizer_fingerprint(drafter_tokenizer)
        if ft != fd:
            raise InputError(
                f"drafter tokenizer (sha256 {fd[:12]}) differs from the target's ({ft[:12]}); "
                "use a drafter trained with the target's tokenizer"
            )


def head_input_size(head: torch.nn.Module) -> int | None:
    """The hidden size a head reads: its `hidden_size` attribute, else its first Linear's in_features."""
    size = getattr(head, "hidden_size", None)
    if size is not None:
        return int(size)
    for module in head.modules():
        if isinstance(module, torch.nn.Linear):
            return module.in_features
    return None


def check_head(head: torch.nn.Module, drafter: Any) -> None:
    expected = getattr(_config(drafter), "hidden_size", None)
    got = head_input_size(head)
    if expected is not None and got is not None and expected != got:
        raise InputError(
            f"acceptance head reads hidden size {got} but the drafter's hidden size is {expected}; "
            "use the head trained for this drafter"
        )


def check_k(k: int, name: str = "K") -> None:
    if not isinstance(k, int) or k < 1:
        raise InputError(f"{name} must be an integer >= 1, got {k!r}")


def check_threshold(h: float) -> None:
    if not (0.0 < h < 1.0):
        raise InputError(f"stopping threshold h must be in (0, 1), got {h}; the paper's default is 0.7")


def check_prompt(prompt: list[int], max_new_tokens: int, *models: Any) -> None:
    """Non-empty prompt; prompt plus new tokens fit every model's context."""
    if len(prompt) == 0:
        raise InputError("the prompt is empty; give at least one token (e.g. the BOS token)")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    for model in models:
        ctx = context_length(model)
        if ctx is None:
            continue
        if len(prompt) >= ctx:
            raise InputError(
                f"prompt has {len(prompt)} tokens but the model context is {ctx}; shorten the prompt"
            )
        if len(prompt) + max_new_tokens > ctx:
            raise InputError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model "
                f"context ({ctx}); lower max_new_tokens to at most {ctx - len(prompt)}"
            )
