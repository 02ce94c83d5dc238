"""Tiny EAGLE drafters for the decoder tests, built offline from configs of several families."""
from __future__ import annotations

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdraft.decoding.speculators.eagle_model import EagleDrafter

FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def tiny_target(family: str, seed: int, vocab: int = 96, layers: int = 1, context: int = 256):
    config_cls, model_cls = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = config_cls(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                     initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                     tie_word_embeddings=False)
    return model_cls(cfg).eval()


def mimic_drafter(target, noise: float, seed: int, variant: str = "eagle1", feature_layers=None) -> EagleDrafter:
    """An EAGLE drafter that mostly agrees with a one-layer target: its layer and final norm are the
    target's, and the projection passes the token embedding through (ignoring the feature), so at input
    (f_j, x_{j+1}) it recomputes the target's layer over x_1..x_{j+1} (missing only x_0); relative noise
    on the layer's matrices makes it disagree sometimes, so acceptance, rejection and rollback all happen.
    EAGLE-3: a random fusion and a small weight on the (fused or predicted) feature, so it is read."""
    drafter = EagleDrafter(target.config, variant=variant, feature_layers=feature_layers)
    d = target.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        drafter.body.layers[0].load_state_dict(copy.deepcopy(target.model.layers[0].state_dict()))
        drafter.body.norm.load_state_dict(target.model.norm.state_dict())
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, :d] = torch.eye(d)
        drafter.fc.bias.zero_()
        if variant == "eagle3":
            drafter.fuse.weight.copy_(torch.randn(drafter.fuse.weight.shape, generator=gen) / (3 * d) ** 0.5)
            drafter.fc.weight[:, d:] = torch.randn(d, d, generator=gen) * 0.05 / d ** 0.5
        for param in drafter.body.layers[0].parameters():
            if param.dim() > 1:
                param.add_(torch.randn(param.shape, generator=gen) * noise * param.std())
    return drafter.eval().attach_target(target)
