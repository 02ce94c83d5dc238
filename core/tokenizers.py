"""Tokenizer fingerprints and the vocabulary check: the one definition training, export and decoding use.

Speculative sampling compares p and q token by token, so a drafter must share the target's vocabulary
*and* tokenizer (same ids for the same strings); a fingerprint recorded at training time must be what the
decoder recomputes from a bundle.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from specdraft.core.errors import InputError

# A tokenizer saved as a plain tokenizer.json (the demo's BPE, or any `tokenizers` file) is loaded as exactly
# that: beside a Qwen2 or Gemma config, AutoTokenizer would pick the family's class, which adds tokens and
# breaks the target/drafter match between two families sharing one tokenizer.
GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def tokenizer_class_for(name_or_path: str | Path):
    """The transformers class to load a saved tokenizer with (see GENERIC_TOKENIZERS)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(name_or_path) / "tokenizer_config.json"
    try:
        saved = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        saved = None
    return PreTrainedTokenizerFast if saved in GENERIC_TOKENIZERS else AutoTokenizer


def tokenizer_fingerprint(tokenizer_or_dir: Any) -> str:
    """sha256 over the vocabulary (token -> id, added tokens included) and the special tokens.

    Built from what survives `save_pretrained` / `from_pretrained` unchanged, so a tokenizer and its
    reloaded copy share a fingerprint while any change of ids or special tokens changes it. Accepts a
    tokenizer object or a directory saved with save_pretrained (loaded locally; nothing is downloaded or
    unpickled).
    """
    tokenizer = tokenizer_or_dir
    if isinstance(tokenizer_or_dir, (str, os.PathLike)):
        path = Path(tokenizer_or_dir)
        if not (path / "tokenizer.json").is_file():
            raise InputError(f"no tokenizer.json in {path}; save the tokenizer there with save_pretrained")
        tokenizer = tokenizer_class_for(path).from_pretrained(path, local_files_only=True, trust_remote_code=False)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    special = {name: getattr(tokenizer, name, None) for name in SPECIAL_TOKENS}
    special = {k: str(v) for k, v in special.items() if v is not None}
    payload = json.dumps({"vocab": vocab, "special": special}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def check_same_vocabulary(
    drafter_vocab_size: int | None,
    target_vocab_size: int | None,
    drafter_tokenizer: Any = None,
    target_tokenizer: Any = None,
    name: str = "drafter",
) -> None:
    """Refuse a drafter that cannot share the target's tokens: a different vocabulary size or tokenizer.

    Sizes are compared when both are known; tokenizers (directories or tokenizer objects) by fingerprint
    when both are given.
    """
    if drafter_vocab_size is not None and target_vocab_size is not None and drafter_vocab_size != target_vocab_size:
        raise InputError(
            f"{name} vocabulary size {drafter_vocab_size} differs from the target's "
            f"(vocab size {drafter_vocab_size} != target vocab size {target_vocab_size}); "
            "use a drafter built with the target's tokenizer and vocab_size"
        )
    if drafter_tokenizer is not None and target_tokenizer is not None:
        d, t = tokenizer_fingerprint(drafter_tokenizer), tokenizer_fingerprint(target_tokenizer)
        if d != t:
            raise InputError(
                f"{name} uses a different tokenizer from the target's (sha256 {d[:12]} vs {t[:12]}); "
                "use a drafter trained with the target's tokenizer"
            )
