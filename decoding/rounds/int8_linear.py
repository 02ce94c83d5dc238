"""A drafter's linear layers with int8 weights for its one- and two-row steps on a CPU.

A drafter's proposals need not be exact: the target verifies every one, so any drafter is lossless, and what
bounds the speedup on the CPU path is its cost per drafted token (c = t_draft / t_target). A one-row step streams
the drafter's weights from memory; at int8 it streams half the bytes of bf16. On an Intel Xeon with AMX (torch
2.13, 2 threads), Qwen2.5-Coder-0.5B's one-token step took 102 CPU ms with int8 weights against 137 with packed
bf16 ones (c 0.44 -> 0.33 of its 1.5B sibling's), and drafting K = 4 for the 1.5B the pair ran 1.52x its AR
against 1.26x, accepting as many drafts (benchmarks/cpu/bench_draft_weights.py, cpu/RESULTS.md). The weights are
symmetric per output row (one scale a row, the row's largest magnitude over 127), multiplied by
`aten._weight_int8pack_mm`, the kernel gpt-fast's int8 path calls.

That kernel reads each weight row once per input row, so past two rows it loses to the dtype's own layer (by hand,
the 0.5B's step in wall time at 2 threads: 43 ms against packed bf16's 65 at one row, 86 against 69 at five):
wider calls (a batch of three or more rows, a prefill, acceptance-data's teacher-
forced rows) run the layer the int8 copy was made from, kept as it was (packed by `pack_linears` like any other;
a tied output layer stays the input embedding). The int8 copy is the only memory added, half the layers' bf16
bytes (0.5 GB for the 0.5B): a copy of the int8 values in bf16 for the wide calls would have added the tied head
again, and a run's evaluate holds every drafter beside the target. So a drafter's wide calls compute its weights
and its narrow calls those weights rounded to int8: its drafts at batch 1 and 2 come from the int8 model, its
labels and features in acceptance-data from its own weights, which agree with the int8 model's to within that
rounding (on the Qwen pair, 0.654 of int8 drafts accepted against 0.646). Activations stay in the
model's dtype: int8 activations (torch's dynamic quantization) cut the 0.5B's agreement with its fp32 self to
0.60 (outlier channels); int8 weights alone keep 1 - TV at 0.972 against bf16's 0.986. int4 (groupwise, 64) was
faster still at one row (29 ms by the same hand) but kept only 0.82.

Inference only, applied after loading and before packing (`decoding.bundle.loading.load_drafter`); a layer whose
input width is not a multiple of 16 stays as it was (the kernel faults on other widths). The state dict is the
wrapped layer's: a saved model is the plain one.
"""
from __future__ import annotations

import torch

from specdraft.decoding.rounds.packed_linear import PackedLinear

INT8_ROWS = 2  # the widest call the int8 kernel takes; wider ones run the wrapped layer (measured above)
KERNEL_WIDTH = 16  # `_weight_int8pack_mm` needs in_features % 16 == 0 (torch 2.13 CPU: other widths segfault)


def can_quantize(dtype: torch.dtype, device_type: str) -> bool:
    """Whether int8 weights apply: a CPU model in bf16 or fp32 (the kernel's CPU activations)."""
    return device_type == "cpu" and dtype in (torch.bfloat16, torch.float32)


def int8_rows(weight: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight (N, K), scales (N,) in the weight's dtype): symmetric, one scale per output row. Computed
    `chunk` rows at a time: an fp32 copy of a 151,936-row output layer at once would be 0.5 GB of passing memory."""
    q = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    scales = torch.empty(weight.shape[0], dtype=weight.dtype, device=weight.device)
    for start in range(0, weight.shape[0], chunk):
        w = weight.detach()[start:start + chunk].float()
        # the scale rounded to the weight's dtype first, as the kernel reads it: each weight within half a step
        s = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny).to(weight.dtype)
        q[start:start + chunk] = torch.round(w / s.float()[:, None]).clamp(-127, 127).to(torch.int8)
        scales[start:start + chunk] = s
    return q, scales


class Int8Linear(torch.nn.Module):
    """A linear layer (`wide`: an `nn.Linear`, or a `PackedLinear` once packed) with an int8 copy of its weights:
    calls of at most `INT8_ROWS` rows read the copy, wider calls run `wide`."""

    def __init__(self, wide: torch.nn.Module):
        super().__init__()
        self.wide = wide
        self.in_features, self.out_features = wide.in_features, wide.out_features
        q, scales = int8_rows(wide.unpacked().weight if isinstance(wide, PackedLinear) else wide.weight)
        # not persistent: the state dict is the wrapped layer's (see state_dict)
        self.register_buffer("qweight", q, persistent=False)
        self.register_buffer("scales", scales, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] > INT8_ROWS:
            return self.wide(x)
        y = torch.ops.aten._weight_int8pack_mm(rows, self.qweight, self.scales.to(x.dtype))
        if self.wide.bias is not None:
            y = y + self.wide.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    @property
    def weight(self) -> torch.Tensor:
        """The wrapped layer's weight (code that reads a head's weight or its vocabulary size)."""
        return self.wide.unpacked().weight if isinstance(self.wide, PackedLinear) else self.wide.weight

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        # the wrapped layer's keys under this layer's own prefix: a saved model is a plain one
        return self.wide.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 rows <= {INT8_ROWS}"


def quantize_linears(model: torch.nn.Module) -> int:
    """Every linear layer (plain or packed, the output layer included) of a CPU model whose input width the
    kernel takes wrapped in `Int8Linear`, in place; -> how many (0 where `can_quantize` says no)."""
    weight = model.get_input_embeddings().weight
    if not can_quantize(weight.dtype, weight.device.type):
        return 0
    wrapped = 0
    for parent in list(model.modules()):
        if isinstance(parent, Int8Linear):
            continue
        for name, child in list(parent.named_children()):
            if type(child) in (torch.nn.Linear, PackedLinear) and child.in_features % KERNEL_WIDTH == 0:
                setattr(parent, name, Int8Linear(child))
                wrapped += 1
    return wrapped


def is_quantized(model: torch.nn.Module) -> bool:
    return any(isinstance(m, Int8Linear) for m in model.modules())
