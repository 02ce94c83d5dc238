"""One cached forward step and KV-cache rollback: the only places the decoder touches a model.

Every model the decoder drives (target, drafter, a test stub) is called the same way: new token ids,
the model's own `DynamicCache`, and how many trailing positions we need logits (and hidden states) for.
Tokens go to the model's input device, so a target spread over GPUs by `device_map` and a drafter on
another device both work; the caller moves the outputs where it needs them.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from specdraft.core.errors import InputError


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
    hidden_last: int | None = None,
    layers: tuple[int, ...] = (-1,),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Feed `token_ids` after what `cache` holds; return logits (last, V) and, if asked, the final
    hidden states (after the final norm: `hidden_states[-1]`, what the LM head reads) of the last
    `hidden_last` positions (default `last`; an EAGLE drafter needs the target's features at every fed
    position, while logits stay limited to the verified ones). The cache grows by len(token_ids).
    `layers`: which `hidden_states` to return, concatenated (an EAGLE-3 drafter's low, middle and high
    layers: (n_states, 3H)). `device`: the model's input device if already known.
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
    n_states = last if hidden_last is None else hidden_last
    states = layer_features(out.hidden_states, layers)[0, -n_states:] if hidden else None  # (n_states, H * len(layers))
    return logits, states


def layer_features(hidden_states, layers: tuple[int, ...]) -> torch.Tensor:
    """hidden_states[i] for i in `layers`, concatenated on the feature axis."""
    if len(layers) == 1:
        return hidden_states[layers[0]]
    return torch.cat([hidden_states[i] for i in layers], dim=-1)


def forward_batch(
    model: torch.nn.Module,
    cache: DynamicCache,
    token_ids: torch.Tensor,
    hidden: bool = False,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Feed one new token per row, token_ids (B,), after what a batch-B `cache` holds (every row the same
    length, so no padding and no mask); return the next-token logits (B, V) and, if asked, the final
    hidden states (B, H). The cache grows by one position in every row."""
    ids = token_ids.to(device or input_device(model)).view(-1, 1)  # (B, 1)
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                output_hidden_states=hidden)
    return out.logits[:, -1], (out.hidden_states[-1][:, -1] if hidden else None)


def repeat_rows(cache: DynamicCache, rows: int) -> None:
    """A batch-1 cache becomes `rows` identical rows (K drafts continuing one shared prefix)."""
    cache.batch_repeat_interleave(rows)


def select_row(cache: DynamicCache, row: int) -> None:
    """Keep only batch row `row` (the draft that agrees longest with the committed context)."""
    cache.batch_select_indices(torch.tensor([row]))


def tree_ancestors(parents: list[int]) -> torch.Tensor:
    """(N, N) bool: [i, j] when node j is node i or one of its ancestors. parents[i] < i, -1 for a root
    child (parents always precede their children in a draft tree)."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            anc[i] = anc[parent]
        anc[i, i] = True
    return anc


def forward_tree(
    model: torch.nn.Module,
    cache: DynamicCache,
    prefix_ids: list[int],
    tree_ids: list[int],
    parents: list[int],
    depths: list[int],
    device: torch.device | None = None,
    hidden: bool = False,
    layers: tuple[int, ...] = (-1,),
):
    """One forward over `prefix_ids` (committed tokens the cache has not seen, causal) followed by the N
    nodes of a draft tree in one row, with a tree attention mask: a node sees the whole prefix, its
    ancestors and itself, at position id (prefix end - 1 + depth). Returns logits (1 + N, V): row 0 at
    the last prefix token (the distribution of a depth-1 node), row 1 + i at node i.

    The cache then holds the prefix followed by all N nodes in tree order; `keep_positions` cuts it back
    to the accepted path. Transformers passes a 4D float mask (1, 1, q_len, kv_len) through unchanged
    (`masking_utils._preprocess_mask_arguments`) and takes explicit `position_ids`, so no model code is
    patched. A single row (not K rows) because i.i.d. drafts share prefixes: the trie has <= K L nodes.
    hidden=True returns (logits, states): states (len(prefix) + N, H) the final hidden states of every fed
    position (prefix, then nodes), which an EAGLE drafter reads as the target's features.
    """
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if isinstance(impl, str) and "flash" in impl:
        raise InputError(f"draft-tree verification needs a custom 4D attention mask, which {impl} does not take; "
                         "load the target with attn_implementation='sdpa' or 'eager'")
    device = device or input_device(model)
    past = cache.get_seq_length()
    n_prefix, n_tree = len(prefix_ids), len(tree_ids)
    q_len = n_prefix + n_tree
    allowed = torch.zeros(q_len, past + q_len, dtype=torch.bool)
    allowed[:, :past] = True
    allowed[:n_prefix, past : past + n_prefix] = torch.ones(n_prefix, n_prefix, dtype=torch.bool).tril()
    allowed[n_prefix:, past : past + n_prefix] = True
    allowed[n_prefix:, past + n_prefix :] = tree_ancestors(parents)
    end = past + n_prefix  # position of the first depth-1 node
    positions = list(range(past, end)) + [end - 1 + d for d in depths]
    ids = torch.tensor([prefix_ids + tree_ids], dtype=torch.long, device=device)
    out = model(
        input_ids=ids,
        past_key_values=cache,
        use_cache=True,
        attention_mask=additive_mask(allowed, next(model.parameters()).dtype, device),
        position_ids=torch.tensor([positions], dtype=torch.long, device=device),
        logits_to_keep=n_tree + 1,
        output_hidden_states=hidden,
    )
    if hidden:
        return out.logits[0], layer_features(out.hidden_states, layers)[0]  # (1 + N, V), (len(prefix) + N, H * len(layers))
    return out.logits[0]  # (1 + N, V)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(q_len, kv_len) bool -> the (1, 1, q_len, kv_len) additive float mask transformers passes through."""
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def forward_eagle(
    drafter: torch.nn.Module,
    cache: DynamicCache,
    features: torch.Tensor,
    token_ids: list[int],
    positions: list[int],
    allowed: torch.Tensor | None = None,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One EAGLE drafter forward (`decoding.speculators.eagle_model.EagleDrafter`): inputs (f_j, x_{j+1}) for T
    positions, features (T, H), after what `cache` holds. `allowed` (T, cache length + T) bool: who
    attends to whom (a draft tree's ancestors); None: causal. Returns the predicted features (T, H) and
    their draft logits through the target's LM head (T, V). The cache grows by T."""
    device = device or input_device(drafter)
    ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    mask = None
    if allowed is not None:
        mask = additive_mask(allowed, next(drafter.parameters()).dtype, device)
    pred = drafter(features[None].to(device), ids, past_key_values=cache, attention_mask=mask,
                   position_ids=torch.tensor([positions], dtype=torch.long, device=device), use_cache=True)[0]
    return pred, drafter.lm_logits(pred)


def keep_positions(cache: DynamicCache, length: int, extra: list[int]) -> None:
    """Keep cache positions [0, length) followed by the positions in `extra` (in that order), dropping the
    rest: after a tree forward, the committed prefix plus the accepted nodes' keys and values, made
    contiguous. A node's KV depends only on its ancestors, which are exactly the accepted nodes before
    it, and RoPE was applied at its depth's position, so the gathered cache equals the one a plain
    forward of the accepted path would have written (no recompute needed)."""
    if not extra:
        crop(cache, length)
        return
    index = torch.tensor(list(range(length)) + list(extra), dtype=torch.long)
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel() > 0:
            idx = index.to(layer.keys.device)
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)
