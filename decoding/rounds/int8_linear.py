"""A drafter's linear layers with int8 weights for its one- and two-row steps on a CPU.

A drafter's proposals need not be exact: the target verifies every one, so any drafter is lossless, and what
bounds the speedup on the CPU path is its cost per drafted token (c = t_draft / t_target). A one-row step streams
the drafter's weights from memory; at int8 it streams half the bytes of bf16. On an Intel Xeon with AMX (torch
2.13, 2 threads), Qwen2.5-Coder-0.5B's one-token step took 43 ms with int8 weights against 65 ms with packed bf16
ones, and with it drafting K = 4 for the 1.5B the pair ran 1.58x AR against 1.30x, accepting as many drafts
(benchmarks/cpu/bench_draft_weights.py). The weights are symmetric per output channel (one scale a row, the
row's largest magnitude over 127), computed by `aten._weight_int8pack_mm`, the kernel gpt-fast's int8 path calls.

That kernel reads each weight row once per input row, so past two rows it loses to the dtype's own layer (at 5
rows it took 86 ms against 69): wider calls (a batch of three or more rows, a prefill, acceptance-data's teacher-
forced rows) run a layer of the model's dtype holding the same int8 values (packed where the original was), so
every call computes one model, the int8 one, and the heads' features and labels are the served drafter's. A tied
output layer gets a copy of its own (the input embedding keeps the unrounded weights). Activations stay in the
model's dtype: int8 activations (torch's dynamic quantization) cut the 0.5B's agreement with its fp32 self to
0.60 (outlier channels); int8 weights alone keep 1 - TV at 0.972 against bf16's 0.986. int4 (groupwise, 64) was
faster still at one row (29 ms) but kept only 0.82.

Inference only, applied after loading (`decoding.bundle.loading.load_drafter`); a layer whose input width is not
a multiple of 16 stays as it was (the kernel faults on other widths). The state dict is the wide layer's: a saved
model holds the int8 values in its dtype.
"""
from __future__ import annotations

import torch

from specdraft.decoding.rounds.packed_linear import PackedLinear

INT8_ROWS = 2  # the widest call the int8 kernel takes; wider ones run the wide layer (measured above)
KERNEL_WIDTH = 16  # `_weight_int8pack_mm` needs in_features % 16 == 0 (torch 2.13 CPU: other widths segfault)


def can_quantize(dtype: torch.dtype, device_type: str) -> bool:
    """Whether int8 weights apply: a CPU model in bf16 or fp32 (the kernel's CPU activations)."""
    return device_type == "cpu" and dtype in (torch.bfloat16, torch.float32)


def int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight (N, K), scales (N,) in the weight's dtype): symmetric, one scale per output row."""
    w = weight.detach().float()
    # the scale rounded to the weight's dtype first, as the kernel reads it: each weight then within half a step
    scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny).to(weight.dtype)
    q = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return q, scales


class Int8Linear(torch.nn.Module):
    """A linear layer with int8 weights: calls of at most `INT8_ROWS` rows read them as int8, wider calls run
    `wide`, a layer of the model's dtype holding the same values (a `PackedLinear` where `layer` was one)."""

    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        weight = layer.unpacked().weight if isinstance(layer, PackedLinear) else layer.weight
        q, scales = int8_rows(weight)
        wide = torch.nn.Linear(self.in_features, self.out_features, bias=layer.bias is not None,
                               dtype=weight.dtype, device="meta")
        wide.weight = torch.nn.Parameter((q.float() * scales.float()[:, None]).to(weight.dtype), requires_grad=False)
        if layer.bias is not None:
            wide.bias = torch.nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
        self.wide = PackedLinear(wide) if isinstance(layer, PackedLinear) else wide
        # not persistent: the state dict is the wide layer's (see state_dict)
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
        """The weight in the model's dtype (code that reads a head's weight or its vocabulary size)."""
        return self.wide.unpacked().weight if isinstance(self.wide, PackedLinear) else self.wide.weight

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        # the wide layer's keys under this layer's own prefix: a saved model is a plain one
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
