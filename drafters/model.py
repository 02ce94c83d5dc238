"""Causal LMs built from a small typed config: the drafters, and the demo's tiny target.

A drafter is a plain `LlamaForCausalLM` (MetaSD App. F.2), so every exported drafter loads with
`AutoModelForCausalLM.from_pretrained` and the decoder needs no special case for it. A drafter is only
useful if it speaks the target's vocabulary: `check_same_vocabulary` refuses a mismatch before any
training starts (bad input).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdraft.core.errors import InputError


@dataclass(frozen=True)
class CausalLMConfig:
    """Architecture of a Llama decoder. vocab_size comes from the target's tokenizer, never a preset."""

    n_layers: int  # decoder layers
    hidden: int  # hidden size
    n_heads: int  # attention heads (must divide hidden)
    intermediate: int  # MLP width (SwiGLU)
    max_positions: int = 2048  # context length
    tie_embeddings: bool = False  # share the input embedding and the LM head
    n_kv_heads: int | None = None  # None = n_heads (plain multi-head attention)
    rope_theta: float = 10000.0  # RoPE base

    @classmethod
    def from_preset(cls, name: str) -> "CausalLMConfig":
        """A config may name a preset instead of writing its fields (`train_drafters.model: metasd-68m`)."""
        return preset(name)

    def __post_init__(self):
        for name in ("n_layers", "hidden", "n_heads", "intermediate", "max_positions"):
            if getattr(self, name) < 1:
                raise InputError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.n_heads:
            raise InputError(
                f"model.hidden ({self.hidden}) must be divisible by model.n_heads ({self.n_heads}); "
                "pick a head count that divides it"
            )
        kv = self.n_kv_heads or self.n_heads
        if self.n_heads % kv:
            raise InputError(f"model.n_heads ({self.n_heads}) must be divisible by model.n_kv_heads ({kv})")


# MetaSD App. F.2: "2 hidden layers, 768 hidden size, 12 attention heads, vocabulary size of 32,000",
# i.e. Vicuna-68M (double7/vicuna-68m: intermediate 3072, untied embeddings, 2048 positions). With a
# 32k vocabulary this is 68M parameters, most of them in the two embedding matrices.
PRESETS: dict[str, CausalLMConfig] = {
    "metasd-68m": CausalLMConfig(n_layers=2, hidden=768, n_heads=12, intermediate=3072, max_positions=2048),
    # Demo sizes for 2 CPU cores. The drafter/target pair keeps the MetaSD shape (2-layer drafter,
    # deeper and wider target); tie_embeddings keeps the small models from being mostly embeddings.
    "demo-drafter": CausalLMConfig(
        n_layers=2, hidden=128, n_heads=4, intermediate=384, max_positions=512, tie_embeddings=True
    ),
    "demo-target": CausalLMConfig(
        n_layers=4, hidden=256, n_heads=8, intermediate=768, max_positions=512, tie_embeddings=True
    ),
    # For tests: a forward pass takes about a millisecond.
    "demo-tiny": CausalLMConfig(n_layers=1, hidden=32, n_heads=2, intermediate=64, max_positions=128),
}


def preset(name: str, **overrides) -> CausalLMConfig:
    """A named preset, optionally with some fields replaced (e.g. max_positions=1024)."""
    if name not in PRESETS:
        raise InputError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)


def llama_config(
    cfg: CausalLMConfig,
    vocab_size: int,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> LlamaConfig:
    if vocab_size < 2:
        raise InputError(f"vocab_size must be >= 2, got {vocab_size}; take it from the target's tokenizer")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads or cfg.n_heads,
        max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_theta=cfg.rope_theta,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        attention_dropout=0.0,  # App. F.2
    )


def build_causal_lm(
    cfg: CausalLMConfig | str,
    vocab_size: int,
    seed: int = 0,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> LlamaForCausalLM:
    """A freshly initialised LlamaForCausalLM. The same seed gives the same weights, and the global
    RNG is left untouched (the init runs under a forked RNG)."""
    if isinstance(cfg, str):
        cfg = preset(cfg)
    config = llama_config(cfg, vocab_size, bos_token_id, eos_token_id, pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def num_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once), a packed linear layer's weight among them (it holds no
    parameter: decoding/rounds/packed_linear.py)."""
    from specdraft.decoding.rounds.packed_linear import PackedLinear

    packed = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, PackedLinear))
    return packed + sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
