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

EAGLE-3 (Li et al. 2025, arXiv 2503.01840, Sec. 3.2 "multi-layer feature fusion") as `variant="eagle3"`:
the feature the drafter reads at a committed position is the concatenation of three of the target's
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
from transformers import AutoConfig, AutoModel, PretrainedConfig

from specdraft.core.errors import InputError, require_int

EAGLE_CONFIG = "eagle_config.json"
EAGLE_WEIGHTS = "model.safetensors"
FORMAT = "specdraft-eagle/1"
VARIANTS = ("eagle1", "eagle3")


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
        self.target_config = target_config
        self.target_hash = target_hash
        self.variant = variant
        d = target_config.hidden_size
        L = target_config.num_hidden_layers
        if variant == "eagle1":
            if feature_layers not in (None, [-1], (-1,)):
                raise InputError("eagle.layers is for variant eagle3 (EAGLE-1 reads the final hidden state); "
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
        embed, _ = self._parts()
        with torch.no_grad():
            emb = embed(input_ids)
        fc_dtype = self.fc.weight.dtype
        if self.variant == "eagle3" and features.shape[-1] == 3 * self.config.hidden_size:
            features = self.fuse(features.to(fc_dtype))
        z = self.fc(torch.cat([emb.to(fc_dtype), features.to(fc_dtype)], dim=-1))
        out = self.body(inputs_embeds=z, past_key_values=past_key_values, attention_mask=attention_mask,
                        position_ids=position_ids, use_cache=use_cache)
        return out.last_hidden_state

    def lm_logits(self, features: torch.Tensor) -> torch.Tensor:
        """The target's LM head on (predicted) features: (..., d) -> (..., V). Gradients flow to the
        features, not to the frozen head."""
        _, head = self._parts()
        return head(features.to(head.weight.dtype))


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
    meta.update(extra or {})
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}
    save_file(state, str(out / EAGLE_WEIGHTS))
    (out / EAGLE_CONFIG).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return out


def is_eagle_dir(path: str | Path) -> bool:
    return (Path(path) / EAGLE_CONFIG).is_file()


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
    if meta.get("format") != FORMAT:
        raise InputError(f"{file}: unknown format {meta.get('format')!r}; expected {FORMAT}")
    return meta


def load_eagle(path: str | Path, target: torch.nn.Module | None = None, target_hash: str | None = None,
               device: str | torch.device | None = None) -> EagleDrafter:
    """Load an EAGLE drafter directory (safetensors only, nothing unpickled); with `target`, attach it;
    with `target_hash`, refuse a drafter trained for another target."""
    from safetensors.torch import load_file

    meta = read_eagle_config(path)
    if target_hash is not None and meta.get("target_hash") not in (None, target_hash):
        raise InputError(f"EAGLE drafter {path} was trained for target {str(meta['target_hash'])[:12]}, this "
                         f"target is {target_hash[:12]}; train an EAGLE drafter for this target")
    variant = meta.get("variant", "eagle1")  # drafters written before EAGLE-3 are EAGLE-1
    try:
        tcfg = dict(meta["target_config"])
        target_config = AutoConfig.for_model(tcfg.pop("model_type"), **tcfg)
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{path}/{EAGLE_CONFIG}: its target_config cannot be read ({type(e).__name__}); re-export "
                         "the drafter (train-drafters)") from None
    drafter = EagleDrafter(target_config, n_layers=meta.get("n_layers"), target_hash=meta.get("target_hash"),
                           variant=variant, feature_layers=meta.get("feature_layers") if variant == "eagle3" else None)
    state = load_file(str(Path(path) / EAGLE_WEIGHTS))
    try:
        missing, unexpected = drafter.load_state_dict(state, strict=False)
    except RuntimeError:  # shapes: the config describes another drafter than the weights
        raise InputError(f"{path}/{EAGLE_WEIGHTS} has weights of other shapes than its {EAGLE_CONFIG} describes; "
                         "re-export the drafter") from None
    if missing or unexpected:
        raise InputError(f"{path}/{EAGLE_WEIGHTS} does not match its config (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}); re-export the drafter")
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
