"""torch.compile applied from outside to the decoder's named step functions (gpt-fast's shape); the fixed
shapes that make a few graphs serve every call are decoding/rounds/shapes.py.

`decoding.batched` writes its steps as plain functions (the target's forward, a segment of the draft loop,
verify-and-commit); a `StepCompiler` turns each into a graph per model and keeps what it compiled, and
the static caches those graphs were built against, for its own life: the caller that decodes many times
(`specdraft generate`, evaluate, a benchmark) keeps one compiler, so compilation is paid once. No state
lives at module level. Mode "none" returns the functions as they are.
"""
from __future__ import annotations

import re
import types
import weakref
from typing import Callable, Hashable

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.rounds.packed_linear import is_packed, unpack_linears
from specdraft.decoding.defaults import COMPILE_MODES
from specdraft.decoding.rounds.static_cache import RowStaticCache, cache_kwarg
from specdraft.decoding.speculators.eagle_model import EagleDrafter


class StepCompiler:
    """What a decode compiles, per model: `apply(fn, model, name)` is `fn` compiled once per (model, name)
    (a size that changes between calls becomes symbolic: `compile_for_model`; under CUDA graphs each distinct
    input shape is one capture), `cache(model, batch, max_len)` a RowStaticCache reused across
    calls (its buffers keep the addresses the graphs, and CUDA graphs, were built against). A compiled step
    holds its model for the life of the compiler."""

    def __init__(self, mode: str = "none", dynamic_shapes: bool = True):
        if mode not in COMPILE_MODES:
            raise InputError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
        self.mode = mode
        self.dynamic_shapes = dynamic_shapes  # False: one graph per size (benchmarks/decoder/bench_compile_shapes.py)
        self._steps: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()
        self._caches: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()
        self._free: dict[Hashable, Callable] = {}  # functions of no model (the round's tails)

    @property
    def eager(self) -> bool:
        return self.mode == "none"

    def apply(self, fn: Callable, model: torch.nn.Module | None, name: Hashable, graphs: bool = False) -> Callable:
        """`fn` compiled (eager mode: `fn` itself), kept under (model, name): `name` must tell apart every
        function a caller compiles for one model (e.g. a draft segment's bounds and its policy). graphs:
        the function's outputs may live in a CUDA graph's pool (reduce-overhead), i.e. nothing reads them
        after the next call of a graph; otherwise inductor's default mode (outputs that are the decode's
        state)."""
        if self.eager:
            return fn
        table = self._free if model is None else self._steps.setdefault(model, {})
        if name not in table:
            mode = self.mode if graphs else "default"
            compiled = compile_for_model(fn, model, mode, self.dynamic_shapes)
            table[name] = fresh_outputs(compiled) if mode == "reduce-overhead" else compiled
        return table[name]

    def cache(self, model: torch.nn.Module, batch: int, max_len: int) -> RowStaticCache:
        """A zero-length RowStaticCache for (model, batch, max_len); compiled: reused across calls (a few
        shapes per model). Eager: a new one (no graph depends on its addresses)."""
        if self.eager:
            return row_cache(model, batch, max_len)
        table = self._caches.setdefault(model, {})
        key = (batch, max_len)
        if key not in table:
            if len(table) >= 4:
                table.pop(next(iter(table)))
            table[key] = row_cache(model, batch, max_len)
        cache = table[key]
        cache.lengths.zero_()
        return cache


def row_cache(model: torch.nn.Module, batch: int, max_len: int) -> RowStaticCache:
    weight = model.get_input_embeddings().weight
    config = model.body.config if isinstance(model, EagleDrafter) else model.config  # EAGLE: its own layers
    kwarg = "past_key_values" if isinstance(model, EagleDrafter) else cache_kwarg(model)  # EAGLE: its own forward
    return RowStaticCache(config, batch, max_len, weight.dtype, weight.device, layer_devices(model), forward_kwarg=kwarg)


def layer_devices(model: torch.nn.Module) -> list[torch.device] | None:
    """The device of each decoder layer (a model placed by device_map spans several); None when the
    layers cannot be found (then every cache layer sits with the input embedding)."""
    base = model.body if isinstance(model, EagleDrafter) else (
        model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None))
    layers = getattr(base, "layers", None)
    if layers is None:
        return None
    devices = [next(layer.parameters()).device for layer in layers]
    return devices if len(devices) == len(layers) else None


def compile_for_model(fn: Callable, model: torch.nn.Module | None, mode: str,
                      dynamic_shapes: bool = True) -> Callable:
    """torch.compile of `fn`, a closure over `model` alone, with `compile_options` and the weights in the
    graph. dynamo keeps its graphs with the function's code object, which every closure of `fn` shares, and
    the guards kept (`argument_guards`) do not tell models (nor policies) apart: each compiled function
    gets a code object of its own.

    Shapes are dynamo's automatic dynamic ones (`dynamic=None`): a function's first call compiles for its
    shapes, and a size that differs at a later call (a batch size, a verify width, a cache length) recompiles
    once as a symbol, which later sizes reuse (sizes 0 and 1 stay specialized). Each compiled size had been a
    graph and a compile of its own (`dynamic=False`); a compile of the ~1B target on an H200 took 35 s cold,
    so a batch curve over B = 1-64 ran out of its budget compiling. benchmarks/decoder/bench_compile_shapes.py (demo
    pair, CPU, cold cache, AR and K = 4 at B = 1, 4, 8): the same tokens; 20 graphs and 651 s against 30 and
    829 s; B = 4's symbolic recompile costs more than its static compile would (AR 186 against 132 s), and B = 8
    then compiles nothing (0.3 s a decode against 115-129 s). `dynamic_shapes=False` keeps one graph per size."""
    import torch._dynamo.config as dynamo_config
    # one graph per shape the caller runs where a size stays specialized (the first shapes, sizes 0 and 1),
    # far more than dynamo's default 8:
    # past the limit dynamo runs new shapes eagerly with no more than a log line, and a benchmark then compares
    # compiled rounds with eager ones (64 was passed by bench_batch_decoder over B = 1, 2, 4, 8, 16). Up to the
    # most dynamo keeps of one function in all (accumulated_recompile_limit, 256 in torch 2.13)
    limit = max(dynamo_config.recompile_limit, getattr(dynamo_config, "accumulated_recompile_limit", 256))
    dynamo_config.recompile_limit = limit
    dynamo_config.cache_size_limit = limit
    if model is not None and is_packed(model):
        # inductor cannot trace oneDNN's opaque packed weights; it packs a CPU graph's linears itself where its
        # freezing pass is on. In place: the model's compiled steps read the plain layers from now on
        unpack_linears(model)
    fn = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    device = model.get_input_embeddings().weight.device if model is not None else torch.device("cpu")
    options = compile_options(mode, device) if model is not None else {"guard_filter_fn": argument_guards}
    return weights_in_graph(torch.compile(fn, dynamic=None if dynamic_shapes else False, options=options))


def fail_past_recompile_limit() -> None:
    """Make dynamo raise, process-wide, where past its recompile limit it would run a new shape eagerly: what a
    benchmark calls, whose compiled timings must all be of graphs (a decoder serving keeps dynamo's fallback)."""
    import torch._dynamo.config as dynamo_config
    dynamo_config.fail_on_recompile_limit_hit = True


def weights_in_graph(compiled: Callable) -> Callable:
    """Trace with the model's weights as constants of the graph (dynamo's `install_free_tensors`) rather
    than graph inputs that dynamo's code before each call gathers from the modules (~150 tensors for the
    demo target: 0.1-0.2 ms a call, 5% of its compiled one-token step). A config patch around the call,
    not a process-wide setting: dynamo reads it when it traces (the first call of each shape), and other
    compiles in the process keep their defaults. Set and restored by hand rather than with `dynamo_config.patch`,
    whose context object costs more than the set itself, on every compiled call of a decode (~5 a round)."""
    import torch._dynamo.config as dynamo_config

    def step(*args):
        before = dynamo_config.install_free_tensors
        dynamo_config.install_free_tensors = True
        try:
            return compiled(*args)
        finally:
            dynamo_config.install_free_tensors = before
    return step


def compile_options(compile: str, device: torch.device) -> dict:
    """Inductor's options for `compile` (the mode's own settings), plus what keeps a small step's call
    overhead small. On the demo-shaped target's one-token step (16 x 128, CPU, 1 thread, variants
    interleaved in one process; eager 4.3 ms): the mode's defaults 2.76 ms, keeping only the guards on the
    step's arguments 2.30 ms, with the C++ wrapper as well 1.79-1.93 ms (a second run: 2.99 -> 2.25 ms).
    The C++ wrapper adds ~30-60 s to a first compile (inductor's cache keeps it for later processes).
      - guards: only those on the step's arguments (`argument_guards`)
      - cpp_wrapper on CPU: the generated code calls its kernels from C++ instead of Python. On a GPU,
        reduce-overhead's CUDA graphs already replay the kernels without the wrapper.
    Tried and left out (no gain beyond the spread here): inductor's freezing (with and without mkldnn
    weight prepacking) and max_autotune's CPU GEMM templates."""
    options = dict(torch._inductor.list_mode_options(compile))
    options["guard_filter_fn"] = argument_guards
    if device.type == "cpu":
        options["cpp_wrapper"] = True
    return options


def argument_guards(entries) -> list[bool]:
    """Dynamo's guards a compiled step keeps: those on its arguments (the cache's tensors and buffers, the
    input's shape, the `hidden` flag), which pick the graph for a width or a batch size. Dropped: the
    thousands of guards on the model (parameters, config, module attributes; the step's closure variable
    `model`) and on library globals, and the Python-level identity checks (a cache's layers point back at
    it), which cost more to evaluate than a small model's forward. Sound because a compiled step belongs
    to one model and one name (`StepCompiler.apply`; its code object is its own) that is not changed while
    it decodes."""
    return [not e.is_global and e.guard_type != "LAMBDA_GUARD" and re.search(r"\bmodel\b", e.name) is None
            for e in entries]


def fresh_outputs(compiled: Callable) -> Callable:
    """A CUDA-graph step: each call starts a new graph iteration, and its outputs are copied out of the
    graph's memory pool, which the next replay overwrites (the round reads q_1 from the catch-up after
    other steps ran). The copies are (B, T, V) and (B, T, H): small next to the forward."""
    def step(*args):
        torch.compiler.cudagraph_mark_step_begin()
        logits, states = compiled(*args)
        return logits.clone(), (states.clone() if states is not None else None)
    return step
