"""Checks that fail early, with one line naming the problem and the fix (`InputError`).
(Sampling settings are validated by `decoding.rounds.sampling.SamplingConfig` itself.)

Heads must read the drafter they were trained on; drafter and target must share the vocabulary and the
tokenizer (`core.tokenizers`, the one definition).
"""
from __future__ import annotations

from typing import Any

import torch

from specdraft.core.errors import InputError, require_int
from specdraft.decoding.defaults import is_threshold
from specdraft.core.tokenizers import check_same_vocabulary


def _config(model: Any) -> Any:
    return getattr(model, "config", None)


def vocab_size(model: Any) -> int | None:
    return getattr(_config(model), "vocab_size", None)


def context_length(model: Any) -> int | None:
    return getattr(_config(model), "max_position_embeddings", None)


def check_pair(target: Any, drafter: Any, target_tokenizer: Any = None, drafter_tokenizer: Any = None) -> None:
    """Drafter and target must have the same vocabulary size and, when given, the same tokenizer."""
    check_same_vocabulary(vocab_size(drafter), vocab_size(target), drafter_tokenizer, target_tokenizer)


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
    require_int(k, name)


def check_threshold(h: float) -> None:
    if not is_threshold(h):
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
