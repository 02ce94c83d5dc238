"""The memory floor of a decode step: the bytes a one-token step must read, over the copy bandwidth measured on the
same device in the same run (gpu/bench_gpu_floor.py on a GPU, cpu/bench_verify_floor.py per dtype on a CPU)."""
from __future__ import annotations

import torch

from specdraft.decoding.rounds.packed_linear import PackedLinear
from specdraft.decoding.timing import timed_call


def copy_bandwidth(device: str, mib: int, reps: int) -> float:
    """Bytes per second of the fastest of `reps` copies of `mib` MiB, bytes read and written both counted (as
    GPU vendors count a copy). On a CPU a copy's time is this process's CPU time (`timed_call`)."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # the first touch maps the pages
    best = min(timed_call(lambda: dst.copy_(src), device)[1].time for _ in range(reps))
    return 2 * src.numel() / best


def streamed_bytes(model: torch.nn.Module) -> int:
    """The bytes a one-token step reads: every parameter once, but for an untied input embedding (a row a token)."""
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embedding
    packed = sum(m.weight_bytes for m in model.modules() if isinstance(m, PackedLinear))  # not parameters
    return packed + sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not embedding)
