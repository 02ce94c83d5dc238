"""A preallocated KV cache with one length per batch row, and the one forward that writes into it.

Every layer holds keys and values of fixed shape (B, kv_heads, max_len, head_dim). Row b's committed
tokens sit in slots [0, lengths[b]), slot = position id (prompts are right-padded at prefill, so a row's
positions count from its own first token and there are no holes). A forward of T tokens per row writes
its new K/V at slots lengths[b] + t with one indexed store of fixed shape, and attends through an additive
4D mask `slot <= lengths[b] + t`; rollback is assigning new lengths (stale slots are overwritten before
any query can see them). No shape depends on the data, so the forward can be compiled once per width
and captured in a CUDA graph.

Transformers' `StaticLayer` keeps one shared `cumulative_length` (every row the same length) and writes
with `index_copy_` along the sequence axis, so it cannot hold ragged rows; `RowStaticLayer` keeps its
allocation and flags (compileable, static addresses) and replaces only `update`. The model builds no mask
of its own: `masking_utils` passes a 4D mask through unchanged, and explicit `position_ids` skip every
`get_seq_length` call.

Compiled logits equal eager ones (tests/decoding/test_batch_cache.py, 1e-5 at ragged lengths; measured
<= 1.5e-6 on a tiny Llama). A quick check that once saw differences of 0.59 between a compiled and an
eager forward over transformers' `StaticCache` is reproduced by that cache's own state, not by the
compiler: every forward advances the cache's `cumulative_length` in place, so a warm-up call of the
compiled function writes its token and moves the cache on, and the "same" forward afterwards runs one
position later over a different context (0.63 on a tiny Llama; compiled and eager over two identical
caches agree to 1.5e-6). Here a forward never moves the lengths: the caller commits them explicitly.
"""
from __future__ import annotations

import inspect

import torch
from transformers.cache_utils import Cache, StaticLayer

from specdraft.core.errors import InputError
from specdraft.decoding.rounds.kv import layer_features
from specdraft.decoding.rounds.shapes import verify_floor


class RowStaticLayer(StaticLayer):
    """One layer's K/V buffers; writes go to the slots its owner cache set for the current forward."""

    def __init__(self, owner: "RowStaticCache", shape: tuple[int, int, int, int], dtype: torch.dtype,
                 device: torch.device):
        super().__init__(max_cache_len=shape[2])
        self.owner = owner
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.device = device
        self.batch_size, self.num_heads = shape[:2]
        self.k_head_dim = self.v_head_dim = shape[3]
        # fixed data pointers: compiled graphs and CUDA graphs mutate these buffers in place
        torch._dynamo.mark_static_address(self.keys)
        torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        slots = self.owner.slots  # (B, T)
        if slots.device != self.keys.device:  # a model split over devices (device_map): this layer's own
            slots = slots.to(self.keys.device)
        # an indexed store, not `scatter_` along the slots: on CPU, scatter_ into a bfloat16 buffer converts the
        # whole buffer to float32 and back (1.2 ms against 14 us for this store, a (16, 3, 192, 64) layer; in
        # float32 both ~15-30 us), which made every bf16 decode step pay two cache copies per layer
        rows = torch.arange(slots.shape[0], device=slots.device)[:, None, None]
        heads = torch.arange(key_states.shape[1], device=slots.device)[None, :, None]
        at = (rows, heads, slots[:, None, :])  # (B, 1, 1), (1, H, 1), (B, 1, T): element (b, h, t) of the states
        self.keys.index_put_(at, key_states.to(self.keys.dtype))
        self.values.index_put_(at, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return int(self.owner.lengths.max())


def kv_shape(config, batch: int, max_len: int) -> tuple[int, int, int, int]:
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return batch, heads, max_len, head_dim


def full_attention_over(config, max_len: int) -> bool:
    """Whether a model attends over all of `max_len` positions in every layer: no sliding-window layers, and no
    window shorter than the cache (the static cache's mask is causal over the whole cache)."""
    window = getattr(config, "sliding_window", None)
    sliding = any(t != "full_attention" for t in (getattr(config, "layer_types", None) or []))
    return not (sliding or (window is not None and window < max_len))


class RowStaticCache(Cache):
    """Per-row static cache of a decoder-only HF model (Llama-style attention calling `cache.update`)."""

    def __init__(self, config, batch: int, max_len: int, dtype: torch.dtype, device: torch.device,
                 layer_devices: list[torch.device] | None = None, *, forward_kwarg: str):
        window = getattr(config, "sliding_window", None)
        if not full_attention_over(config, max_len):
            # the 4D mask here is causal over the whole cache; a window shorter than the cache would need its own
            raise InputError(f"the batched decoder's static cache is full attention; this model has sliding-window "
                             f"layers (window {window}) shorter than the decode ({max_len} positions); decode it "
                             "one prompt at a time with generate_speculative")
        shape = kv_shape(config, batch, max_len)
        devices = layer_devices or [device] * config.num_hidden_layers
        super().__init__(layers=[RowStaticLayer(self, shape, dtype, d) for d in devices])
        self.max_len = max_len
        # the keyword the model's forward takes this cache under (`cache_kwarg`), fixed with the cache so
        # that compiled code reads a constant attribute and no forward inspects a signature
        self.forward_kwarg = forward_kwarg
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)  # committed slots per row
        self.slots = torch.zeros(batch, 1, dtype=torch.long, device=device)  # where the current forward writes

    def select_rows(self, keep: torch.Tensor) -> "RowStaticCache":
        """A new cache holding only rows `keep` (a copy): an eager decode drops its finished rows so
        that they stop costing work. Not for compiled steps (a new batch size is a new graph)."""
        first = self.layers[0]
        shape = (keep.numel(), first.num_heads, self.max_len, first.k_head_dim)
        new = RowStaticCache.__new__(RowStaticCache)
        Cache.__init__(new, layers=[RowStaticLayer(new, shape, first.keys.dtype, layer.device) for layer in self.layers])
        for old, layer in zip(self.layers, new.layers):
            here = keep.to(old.keys.device)
            layer.keys.copy_(old.keys.index_select(0, here))
            layer.values.copy_(old.values.index_select(0, here))
        new.max_len = self.max_len
        new.forward_kwarg = self.forward_kwarg
        new.lengths = self.lengths.index_select(0, keep)
        new.slots = self.slots.index_select(0, keep)
        return new

    def rollback(self, lengths: torch.Tensor) -> None:
        """Keep slots [0, lengths[b]) of every row: no tensor is sliced or copied."""
        self.lengths.copy_(lengths)


def attention_mask(lengths: torch.Tensor, width: int, max_len: int, dtype: torch.dtype | None) -> torch.Tensor:
    """(B, 1, width, max_len): query t of row b sees slots <= lengths[b] + t. dtype None: a bool mask
    (True = attend), what SDPA takes directly and transformers builds for it itself; else an additive
    float mask (0 / most negative) for the eager attention."""
    slot = torch.arange(max_len, device=lengths.device)
    last = lengths[:, None] + torch.arange(width, device=lengths.device)  # (B, width)
    allowed = (slot[None, None, :] <= last[:, :, None])[:, None]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=lengths.device).masked_fill(~allowed, torch.finfo(dtype).min)


def cache_kwarg(model: torch.nn.Module) -> str:
    """The keyword a decoder-only model's base forward takes its cache under (transformers renamed
    past_key_values to cache): read once when a cache is made for the model (`RowStaticCache.forward_kwarg`)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


def eagle_rows(drafter: torch.nn.Module, cache: RowStaticCache, features: torch.Tensor, ids: torch.Tensor):
    """An EAGLE drafter (`decoding.speculators.eagle_model.EagleDrafter`) over inputs (f_j, x_{j+1}), features (B, T, H)
    and ids (B, T), at slots cache.lengths[b] + t (not advanced). Returns its draft logits (B, T, V) through
    the target's LM head and the predicted features f^ (B, T, H) (also the hidden state a SpecDec++ head
    reads)."""
    width = ids.shape[1]
    positions = cache.lengths[:, None] + torch.arange(width, device=ids.device)
    cache.slots = positions.clamp(max=cache.max_len - 1)
    sdpa = getattr(drafter.config, "_attn_implementation", None) == "sdpa"
    mask = attention_mask(cache.lengths, width, cache.max_len, None if sdpa else drafter.fc.weight.dtype)
    pred = drafter(features, ids, past_key_values=cache, attention_mask=mask, position_ids=positions, use_cache=True)
    return drafter.lm_logits(pred), pred


def model_floor(model: torch.nn.Module, rows: int = 1) -> int:
    """`rounds.shapes.verify_floor` for `model`'s weights (its dtype and the device its embedding sits on) at
    `rows` live rows."""
    weight = model.get_input_embeddings().weight
    return verify_floor(str(weight.dtype).removeprefix("torch."), weight.device.type, rows)


def forward_rows(model: torch.nn.Module, cache: RowStaticCache, ids: torch.Tensor, hidden: bool = False,
                 at: torch.Tensor | None = None, layers: tuple[int, ...] | None = None):
    """Feed ids (B, T) at slots cache.lengths[b] + t (the lengths are not advanced: the caller decides
    what is kept). Returns the logits (B, T, V) and, if asked, the final hidden states (B, T, H), the
    base model's output after its final norm (what the LM head reads), or with `layers` the hidden states
    at those indices concatenated (B, T, H * len(layers)) (what an EAGLE-3 drafter reads). at (B,): the one
    position per row whose logits the caller reads, (B, 1, V) then: a prefill reads one of its T (at B = 16
    over 128 padded positions and a 128k vocabulary, all of them would be 1 GiB of float32). Fixed shapes
    throughout: this is the function `torch.compile` wraps."""
    width = ids.shape[1]
    positions = cache.lengths[:, None] + torch.arange(width, device=ids.device)
    cache.slots = positions.clamp(max=cache.max_len - 1)  # a finished row never writes out of bounds
    sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
    mask = attention_mask(cache.lengths, width, cache.max_len, None if sdpa else model.get_input_embeddings().weight.dtype)
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    out = base(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
               output_hidden_states=layers is not None, **{cache.forward_kwarg: cache})
    states = out.last_hidden_state
    read = states if at is None else states.gather(1, at[:, None, None].expand(-1, 1, states.shape[-1]))
    logits = model.get_output_embeddings()(read)
    if hidden and layers is not None:
        states = layer_features(out.hidden_states, layers)
    # under device_map the head may sit elsewhere: the round's tensors live with the input ids (no-op otherwise)
    return logits.to(ids.device), (states.to(ids.device) if hidden else None)
