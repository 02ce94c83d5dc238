"""Sampling transforms shared by drafting, verification and acceptance-label generation.

One function turns logits into the distribution that is actually sampled from. Speculative sampling is
lossless with respect to *this* distribution, so the drafter's q, the target's p and the SpecDec++
labels must all go through it with the same settings (SpecDec++ §4.4; pitfall: labelling at T=1
while serving with another transform).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdraft.core.errors import InputError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0  # 0 means greedy (a one-hot distribution on the argmax)
    top_k: int = 0  # 0 disables top-k
    top_p: float = 1.0  # 1.0 disables nucleus filtering

    def __post_init__(self):
        if not (self.temperature >= 0):
            raise InputError(f"temperature must be >= 0, got {self.temperature}; use 0 for greedy")
        if self.top_k < 0:
            raise InputError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}; use 1.0 to disable it")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def tag(self) -> str:
        """A short directory-safe name: "greedy", "T1", "T0.7_k50_p0.9"."""
        if self.greedy:
            return "greedy"
        return f"T{self.temperature:g}" + (f"_k{self.top_k}" if self.top_k else "") + (
            f"_p{self.top_p:g}" if self.top_p < 1.0 else "")

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    def matches(self, transform: dict) -> bool:
        """Whether a recorded {temperature, top_k, top_p} (e.g. a head's label transform) is this one.
        Under greedy decoding top-k and top-p change nothing, so any greedy transform matches."""
        other = SamplingConfig(**{k: transform[k] for k in ("temperature", "top_k", "top_p") if k in transform})
        return other.tag == self.tag


def warp_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p; filtered entries become -inf. logits: (..., V)."""
    logits = logits.float()
    if cfg.greedy:
        return logits  # greedy is handled in `probs`; the argmax does not depend on warping
    logits = logits / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= cfg.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def probs(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution sampled from under `cfg`, (..., V) float32. Greedy gives a one-hot argmax."""
    if cfg.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return warp_logits(logits, cfg).softmax(-1)


def probs_on_cpu(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """`probs(logits, cfg)` on the CPU, for the decode loops that verify and sample there.

    Under greedy only the argmax indices cross to the host (a few bytes, not a (..., V) one-hot built on
    the device and copied back) and the one-hot is built on the CPU; a profile of a batch-1 round on a GPU
    showed the V-sized copies and the device one-hot kernels in every draft step and verification."""
    if cfg.greedy:
        index = logits.argmax(-1).cpu()
        return torch.nn.functional.one_hot(index, logits.shape[-1]).float()
    return probs(logits, cfg).cpu()


def sample_inverse(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of p (..., V) by the inverse CDF at uniforms u (...,) in [0, 1): the first index whose
    cumulative probability exceeds u times the row's total, so a token of probability 0 is never drawn (its
    cumulative sum equals its predecessor's exactly). Pure tensor ops, no generator: a compiled graph samples
    with uniforms drawn outside it (`decoding.batched.draft`)."""
    cdf = p.float().cumsum(-1)
    return torch.searchsorted(cdf, (u.float() * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1).clamp_max(p.shape[-1] - 1)


def sample(p: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row from probabilities p (..., V) -> (...,) long."""
    flat = p.reshape(-1, p.shape[-1])
    out = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return out.reshape(p.shape[:-1])
