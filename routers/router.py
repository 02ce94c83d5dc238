"""Routing baselines (MetaSD §4.3): pick one drafter per prompt, once, before decoding.

Both routers read the same prompt feature: the target's *input embeddings mean-pooled over the prompt
tokens*, (H,) per prompt. Why not a small transformer encoder trained from scratch (or a BERT)?
  - it costs one embedding gather, no extra model, and nothing to keep in sync with the tokenizer:
    the router works on the target's own token ids, the ones the decoder already holds;
  - the target's embeddings were trained on far more text than a from-scratch encoder could see on
    a few thousand routing labels, so they already separate topics (code vs math vs translation);
  - it is the same information a static classifier router has in MetaSD Table 6 (input-level
    embeddings, no view of the generation), which is exactly the weakness the bandits are compared
    against; a bigger encoder would not change that comparison's nature.
The price: a bag-of-embeddings ignores word order, so prompts that differ only in structure look alike.

  PromptClassifierRouter  standardise -> Linear(H, hidden) -> GELU -> Linear(hidden, n_drafters); trained
                          with cross-entropy on per-prompt labels (routers/lit_router.py)
  CentroidRouter          nearest domain centroid by cosine similarity (no training); a domain maps to
                          its specialised drafter

Saved as `router.safetensors` (the router's own parameters and centroids only: the embedding table comes
from the target at load time) and `router_config.json` (kind, drafters, embedding size, label kind,
target tokenizer fingerprint, metrics). Pure PyTorch: the decoder imports this module.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from specdraft.core.errors import InputError
from specdraft.decoding.checkpoint import CheckpointFormat

WEIGHTS_NAME = "router.safetensors"
CONFIG_NAME = "router_config.json"
FORMAT = "specdraft-router/1"
KINDS = ("classifier", "centroid")
CHECKPOINT = CheckpointFormat("router", "train-router", WEIGHTS_NAME, CONFIG_NAME, FORMAT,
                              ("format", "kind", "drafters", "embed_dim", "hidden", "domains", "domain_drafters"))


def _weight(embeddings: torch.Tensor | nn.Module) -> torch.Tensor:
    """The (V, H) table of an nn.Embedding (e.g. `model.get_input_embeddings()`) or the tensor itself."""
    w = embeddings.weight if isinstance(embeddings, nn.Module) else embeddings
    if not isinstance(w, torch.Tensor) or w.ndim != 2:
        raise InputError("router embeddings must be a (vocab, hidden) tensor or an nn.Embedding; "
                         "pass target.get_input_embeddings()")
    return w.detach()


@torch.no_grad()
def mean_pooled(embeddings: torch.Tensor | nn.Module, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Prompts (lists of token ids) -> (N, H) float32 mean of their input embeddings, on CPU."""
    w = _weight(embeddings)
    vocab, out = w.shape[0], torch.empty(len(prompts), w.shape[1])
    for i, ids in enumerate(prompts):
        if len(ids) == 0:
            raise InputError("cannot route an empty prompt; give at least one token (e.g. the BOS token)")
        ids_t = torch.as_tensor(list(ids), dtype=torch.long)
        bad = ids_t[(ids_t < 0) | (ids_t >= vocab)]
        if len(bad):
            raise InputError(f"prompt has token id {int(bad[0])} outside the target vocabulary (0..{vocab - 1}); "
                             "tokenize with the target's tokenizer")
        out[i] = w[ids_t.to(w.device)].float().mean(0).cpu()
    return out


class _PromptRouter(nn.Module):
    """What both routers share: drafter names, the embedding size, and routing from token ids once an
    embedding table is bound (`bind`, done by `load_router`). Subclasses define `choice_scores`."""

    kind: str

    def __init__(self, embed_dim: int, drafters: Sequence[str]):
        super().__init__()
        if embed_dim < 1:
            raise InputError(f"router embedding size must be >= 1, got {embed_dim}")
        if len(drafters) < 1 or len(set(drafters)) != len(drafters):
            raise InputError(f"router drafters must be a non-empty list of distinct names, got {list(drafters)}")
        self.embed_dim, self.drafters = embed_dim, list(drafters)
        self._embeddings: torch.Tensor | None = None  # plain attribute: never saved with the router
        self.metadata: dict[str, Any] = {}  # router_config.json as loaded (label kind, metrics, ...)

    def choice_scores(self, pooled: torch.Tensor) -> torch.Tensor:
        """(N, H) pooled prompt embeddings -> (N, C) scores over this router's choices."""
        raise NotImplementedError

    def choice_drafters(self) -> list[str]:
        """The drafter each of the C choices routes to."""
        return self.drafters

    @torch.no_grad()
    def pick(self, pooled: torch.Tensor) -> list[str]:
        """(N, H) pooled prompt embeddings -> one drafter name per prompt."""
        p = self._param_device_dtype()
        idx = self.choice_scores(pooled.to(*p)).argmax(-1).tolist()
        names = self.choice_drafters()
        return [names[i] for i in idx]

    def bind(self, embeddings: torch.Tensor | nn.Module) -> "_PromptRouter":
        w = _weight(embeddings)
        if w.shape[1] != self.embed_dim:
            raise InputError(f"router reads embeddings of size {self.embed_dim} but the target's are {w.shape[1]}; "
                             "use the router trained for this target (train-router)")
        self._embeddings = w
        return self

    def route_many(self, prompts: Sequence[Sequence[int]]) -> list[str]:
        if self._embeddings is None:
            raise InputError("router has no embedding table; load it with load_router(dir, target.get_input_embeddings())")
        return self.pick(mean_pooled(self._embeddings, prompts))

    def route(self, prompt_ids: Sequence[int]) -> str:
        """The drafter to decode this prompt (target token ids) with."""
        return self.route_many([prompt_ids])[0]

    def _param_device_dtype(self) -> tuple[torch.device, torch.dtype]:
        t = next(iter(self.state_dict().values()))
        return t.device, t.dtype

    def config(self) -> dict[str, Any]:
        return {"format": FORMAT, "kind": self.kind, "drafters": self.drafters, "embed_dim": self.embed_dim}


class PromptClassifierRouter(_PromptRouter):
    """MLP over the standardised pooled embedding -> drafter logits.

    Inputs are z-scored with the training prompts' per-feature mean and std (buffers `mean`, `std`, set
    by `standardize_with` before training): every prompt's mean embedding shares a large common part
    (frequent tokens, BOS) and its scale is the target's init scale, so raw features put the signal in
    small differences on a large offset; standardising makes the learning rate portable across targets.
    """

    kind = "classifier"

    def __init__(self, embed_dim: int, drafters: Sequence[str], hidden: int = 128):
        super().__init__(embed_dim, drafters)
        if hidden < 1:
            raise InputError(f"router hidden width must be >= 1, got {hidden}")
        self.hidden = hidden
        self.register_buffer("mean", torch.zeros(embed_dim))
        self.register_buffer("std", torch.ones(embed_dim))
        self.mlp = nn.Sequential(nn.Linear(embed_dim, hidden), nn.GELU(), nn.Linear(hidden, len(self.drafters)))

    @torch.no_grad()
    def standardize_with(self, pooled: torch.Tensor) -> "PromptClassifierRouter":
        """Set the input standardisation from training features (N, H)."""
        self.mean.copy_(pooled.float().mean(0))
        self.std.copy_(pooled.float().std(0, correction=0).clamp_min(1e-6) if len(pooled) > 1 else torch.ones_like(self.std))
        return self

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.mlp((pooled - self.mean) / self.std)  # (N, H) -> (N, n_drafters) logits

    def choice_scores(self, pooled: torch.Tensor) -> torch.Tensor:
        return self(pooled)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "hidden": self.hidden}


class CentroidRouter(_PromptRouter):
    """Nearest domain centroid by cosine similarity; domain i routes to `domain_drafters[i]`.

    Cosine is taken after subtracting `center` (the mean pooled embedding of the training prompts):
    every prompt's mean embedding shares a large common part (frequent tokens, BOS), which without
    centering puts every cosine near 1 and lets that shared part decide the ranking.
    """

    kind = "centroid"

    def __init__(self, embed_dim: int, domains: Sequence[str], domain_drafters: Sequence[str]):
        if len(domains) != len(domain_drafters) or len(domains) < 1 or len(set(domains)) != len(domains):
            raise InputError(f"centroid router needs distinct domains, each with one drafter; got {list(domains)} "
                             f"-> {list(domain_drafters)}")
        super().__init__(embed_dim, sorted(set(domain_drafters)))
        self.domains, self.domain_drafters = list(domains), list(domain_drafters)
        self.register_buffer("centroids", torch.zeros(len(domains), embed_dim))  # (D, H), unit norm once fit
        self.register_buffer("center", torch.zeros(embed_dim))  # (H,)

    @torch.no_grad()
    def fit(self, pooled: torch.Tensor, domains: Sequence[str]) -> "CentroidRouter":
        """Centroids from training prompts' pooled embeddings (N, H) and their domains."""
        if len(pooled) != len(domains):
            raise InputError(f"centroid fit got {len(pooled)} embeddings for {len(domains)} domain labels")
        missing = sorted(set(self.domains) - set(domains))
        if missing:
            raise InputError(f"no training prompts for domain(s) {missing}; the centroid router needs some for each")
        pooled = pooled.float().cpu()
        self.center.copy_(pooled.mean(0))
        for i, d in enumerate(self.domains):
            rows = torch.tensor([x == d for x in domains])
            c = (pooled[rows] - self.center).mean(0)
            self.centroids[i] = c / c.norm().clamp_min(1e-12)
        return self

    def choice_scores(self, pooled: torch.Tensor) -> torch.Tensor:
        x = pooled - self.center
        return (x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)) @ self.centroids.T  # (N, D) cosines

    def choice_drafters(self) -> list[str]:
        return self.domain_drafters

    def nearest_domain(self, pooled: torch.Tensor) -> list[str]:
        return [self.domains[i] for i in self.choice_scores(pooled.float()).argmax(-1).tolist()]

    def config(self) -> dict[str, Any]:
        return {**super().config(), "domains": self.domains, "domain_drafters": self.domain_drafters}


Router = PromptClassifierRouter | CentroidRouter


def save_router(router: Router, out_dir: str | os.PathLike, meta: dict[str, Any] | None = None) -> Path:
    """Write router.safetensors + router_config.json. `meta` (JSON-serialisable) goes beside the
    architecture: the stage stores `label_kind`, `tokenizer_fingerprint` (checked by `load_router`),
    `pooling` and metrics there."""
    return CHECKPOINT.save(router, router.config(), out_dir, meta)


def load_router(router_dir: str | os.PathLike, target_embeddings: torch.Tensor | nn.Module,
                tokenizer_fingerprint: str | None = None) -> Router:
    """A saved router, bound to the target's input embeddings, in eval mode; `.route(prompt_ids)` -> name.

    Raises InputError on missing/corrupt files, an embedding size other than the router's, or (when
    `tokenizer_fingerprint` is given, see decoding.compat) a target tokenizer other than the one it was
    trained with.
    """
    d = Path(router_dir)
    config = CHECKPOINT.read_config(d)
    kind = config.get("kind")
    embed_dim, drafters = CHECKPOINT.arch(d, config, embed_dim="int", drafters="names")
    if kind == "classifier":
        router: Router = PromptClassifierRouter(embed_dim, drafters, *CHECKPOINT.arch(d, config, hidden="int"))
    elif kind == "centroid":
        router = CentroidRouter(embed_dim, *CHECKPOINT.arch(d, config, domains="names", domain_drafters="names"))
    else:
        raise InputError(f"{d / CONFIG_NAME}: unknown router kind {kind!r}; expected one of {', '.join(KINDS)}")
    if router.drafters != drafters:  # a centroid router's drafters are its domains' drafters
        raise CHECKPOINT.corrupt_config(d, ValueError(f"'drafters' {drafters} disagree with 'domain_drafters'"))
    CHECKPOINT.check_format(d, config)
    saved_fp = config.get("tokenizer_fingerprint")
    if tokenizer_fingerprint is not None and saved_fp != tokenizer_fingerprint:
        raise InputError(f"router {d} was trained for a target tokenizer with sha256 {str(saved_fp)[:12]}, not "
                         f"{tokenizer_fingerprint[:12]}; retrain it (train-router) for this target")
    CHECKPOINT.load_weights(router, d)
    router.metadata = config  # everything stored beside the weights (label kind, metrics, ...)
    return router.bind(target_embeddings).eval()
