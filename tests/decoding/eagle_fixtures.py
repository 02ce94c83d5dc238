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
    eagle3-proj: a random fusion and a small weight on the (fused or predicted) feature, so it is read."""
    drafter = EagleDrafter(target.config, variant=variant, feature_layers=feature_layers)
    d = target.config.hidden_size
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        drafter.body.layers[0].load_state_dict(copy.deepcopy(target.model.layers[0].state_dict()))
        drafter.body.norm.load_state_dict(target.model.norm.state_dict())
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, :d] = torch.eye(d)
        drafter.fc.bias.zero_()
        if variant == "eagle3-proj":
            drafter.fuse.weight.copy_(torch.randn(drafter.fuse.weight.shape, generator=gen) / (3 * d) ** 0.5)
            drafter.fc.weight[:, d:] = torch.randn(d, d, generator=gen) * 0.05 / d ** 0.5
        for param in drafter.body.layers[0].parameters():
            if param.dim() > 1:
                param.add_(torch.randn(param.shape, generator=gen) * noise * param.std())
    return drafter.eval().attach_target(target)


def trained_eagle3(target, steps: int = 150, seed: int = 0, draft_ids=None, feature_layers=None, greedy: bool = False,
                   n_rows: int = 32, length: int = 28, prompts: list[list[int]] | None = None, ttt_steps: int = 1):
    """vLLM's EAGLE-3 layout (variant eagle3) fitted to `target` by teacher forcing on the target's own
    continuations (sampled, or greedy to serve greedy decoding) of `prompts` (equal lengths) and random
    ones, forward KL at every position and at each of `ttt_steps` training-time-test steps
    (drafters.eagle.ttt_predictions, so deeper drafts are trained too): its residual stream starts from the fused features, not from the
    token, so no hand-made copy of the target mimics it; a short fit does (a random target's continuations
    of unseen prompts it does not learn: self-distill on the prompts it will serve)."""
    from specdraft.decoding.speculators.eagle_model import fused_features, new_eagle_drafter

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    drafter = new_eagle_drafter(target.config, variant="eagle3", draft_ids=draft_ids, feature_layers=feature_layers)
    drafter.attach_target(target).init_from_target(target)
    V = target.config.vocab_size
    with torch.no_grad():
        ids = torch.randint(0, V, (n_rows, len(prompts[0]) if prompts else 4), generator=gen)
        if prompts:
            ids[: len(prompts)] = torch.tensor(prompts)
        for _ in range(length):
            logits = target(input_ids=ids).logits[:, -1]
            nxt = logits.argmax(-1, keepdim=True) if greedy else torch.multinomial(logits.softmax(-1), 1, generator=gen)
            ids = torch.cat([ids, nxt], dim=1)
        out = target(input_ids=ids, output_hidden_states=True)
        feats = fused_features(out.hidden_states, drafter.feature_layers)[:, :-1]
    opt = torch.optim.Adam([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    from specdraft.drafters.eagle import ttt_predictions

    valid = torch.ones_like(ids[:, 1:])
    for _ in range(steps):
        loss = 0.0
        for s, pred in enumerate(ttt_predictions(drafter, feats, ids[:, 1:], valid, ttt_steps)):
            logits, wanted = drafter.train_logits(pred[:, s:], out.logits[:, 1 + s :])
            loss = loss + torch.nn.functional.kl_div(logits.log_softmax(-1), wanted.log_softmax(-1), log_target=True,
                                                     reduction="batchmean")
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()
