"""bf16 linear layers on a CPU with their weights stored once in oneDNN's blocked layout ("prepacked").

torch's eager bf16 `F.linear` hands oneDNN the weight in its row-major layout at every call, and the kernel reads
it transposed: on an Intel Xeon with AMX (torch 2.13, one thread) a one-row product over Qwen2.5-Coder-1.5B's MLP
weights ran at 15 GB/s, the same weights reordered once into oneDNN's blocked layout at 27 GB/s (1.6-1.85x), and
a one-token step of the 1.5B 1.26x faster (cpu/RESULTS.md). This is what inductor's freezing pass does to a
compiled CPU model's linears (`mkldnn._reorder_linear_weight` and `mkldnn._linear_pointwise`,
torch/_inductor/fx_passes/mkldnn_fusion.py), done eagerly at load (`load_causal_lm(pack=True)`).

On by default in the loader (`load_causal_lm(pack=True)`), so every inference stage runs the layout. Its state
dict is the plain layer's (`weight`, bit for bit), so `save_pretrained` of a packed model writes a model any loader
reads: before it did, a saved packed drafter had no linear weights, each load of it initialised them at random,
and a distill-data run with it sampled other rows when run twice (what kept packing off in the stages at first).

Numerics: the blocked kernel sums in another order than eager's, so a packed model's logits differ from the same
model's eager ones in the last bits; what the decoder's losslessness needs is that the packed model agrees with
itself across step widths, and on that Xeon it does more than eager does: Qwen2.5-Coder-0.5B's `width_classes`
were {1}, {2..16} eager and one class for every width 1..16 packed. Greedy speculative equals greedy AR is asserted
on packed models as on any other (tests/decoding/test_packed_linear.py).

Only inference: a packed layer has no weight parameter to train, and `unpack_linears` gives the plain layers back
(exactly: the blocked weight times the identity) for code that widens or saves a model.
"""
from __future__ import annotations

import torch


def can_pack(dtype: torch.dtype, device_type: str) -> bool:
    """Whether `pack_linears` applies: bf16 on a CPU whose oneDNN computes bf16 natively (avx512_bf16 or AMX);
    elsewhere oneDNN's bf16 path converts every element and the layout buys nothing."""
    return (dtype == torch.bfloat16 and device_type == "cpu" and torch.backends.mkldnn.is_available()
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


class PackedLinear(torch.nn.Module):
    """An `nn.Linear` whose bf16 weight lives in oneDNN's blocked layout. The packed tensor is a plain attribute,
    not a parameter or buffer: `.float()` or `.to(dtype)` must not convert its blocked bytes elementwise into a
    wrong fp32 weight; an input of another dtype is refused instead."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # the batch size hint only guides oneDNN's choice of layout; 1 is a decode step's
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"a packed bf16 linear got a {x.dtype} input; unpack_linears(model) before widening it")
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed, self.bias, "none", [], "")
        return y.reshape(*x.shape[:-1], self.out_features)

    def unpacked(self) -> torch.nn.Linear:
        """The plain layer, weight bit for bit: the identity's rows through the packed product are the weight's
        columns (each output one bf16 weight times 1, summed with zeros)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        with torch.inference_mode():
            weight = torch.ops.mkldnn._linear_pointwise(eye, self.packed, None, "none", [], "").t().contiguous()
        plain = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                                dtype=torch.bfloat16, device="meta")
        plain.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
        if self.bias is not None:
            plain.bias = torch.nn.Parameter(self.bias.detach().clone(), requires_grad=False)
        return plain

    # The state dict is an nn.Linear's: `weight` plain, bit for bit. The packed tensor is no parameter, so without
    # this `save_pretrained` of a packed model wrote no linear weights at all, and every later load of it
    # initialised them at random (the "reproducibility" failure that kept packing off in the stages).
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.unpacked().weight.detach()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        weight = state_dict.get(prefix + "weight")
        if weight is None:
            missing_keys.append(prefix + "weight")
        elif tuple(weight.shape) != (self.out_features, self.in_features):
            error_msgs.append(f"size mismatch for {prefix}weight: copying a param with shape {tuple(weight.shape)}, "
                              f"the packed layer is {(self.out_features, self.in_features)}")
        else:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(torch.bfloat16), 1)
        super()._load_from_state_dict({k: v for k, v in state_dict.items() if k != prefix + "weight"}, prefix,
                                      local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def __deepcopy__(self, memo) -> "PackedLinear":
        # oneDNN's blocked tensor has no storage that copy can reach: repack a plain copy
        return PackedLinear(self.unpacked())

    @property
    def weight_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _swap(model: torch.nn.Module, kind: type, make) -> int:
    """Replace every submodule of type `kind` by make(it); -> how many."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is kind:
                setattr(parent, name, make(child))
                swapped += 1
    return swapped


def pack_linears(model: torch.nn.Module) -> int:
    """Every `nn.Linear` of a bf16 CPU model packed in place but the output layer, which stays plain: code reads
    its weight (an EAGLE head's initialisation, the vocabulary's size), it is the input embedding itself where the
    two are tied, and it gained least (1.2x: its 151,936 rows stream from memory at either layout); -> how many
    were packed (0, the model untouched, where `can_pack` says no for its weights' dtype and device)."""
    weight = model.get_input_embeddings().weight
    if not can_pack(weight.dtype, weight.device.type):
        return 0
    head = model.get_output_embeddings()
    head = getattr(head, "wide", head)  # an int8 drafter's head (rounds/int8_linear.py) wraps the plain layer
    return _swap(model, torch.nn.Linear, lambda lin: lin if lin is head else PackedLinear(lin))


def unpack_linears(model: torch.nn.Module) -> int:
    """The inverse of `pack_linears`, in place; -> how many layers were unpacked."""
    return _swap(model, PackedLinear, PackedLinear.unpacked)


def is_packed(model: torch.nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in model.modules())
