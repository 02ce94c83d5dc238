"""How well an acceptance head fits its soft labels P in [0, 1] (SpecDec++ App. D.3).

All functions take head logits x (or probabilities) and labels P as 1-D tensors over the Y positions.
- binary KL(P || sigma) = P log(P / sigma) + (1 - P) log((1 - P) / (1 - sigma)), unweighted, mean over
  positions; computed as BCE(P, x) - H(P) from logits, with 0 log 0 = 0. The paper's train/eval KL.
- rejection AUROC: how well 1 - sigma ranks rejections above acceptances. With soft labels each
  position counts as a rejected example with weight 1 - P and an accepted one with weight P (exactly
  what a Monte Carlo draw of the accept/reject event would give in expectation); the AUROC is the
  weighted Mann-Whitney statistic over all (rejected, accepted) pairs, ties (including a position
  paired with itself) counting one half. With 0/1 labels it is the ordinary AUROC.
- ECE: `n_bins` equal-width bins of sigma; sum over bins of (bin share) * |mean sigma - mean P|.
- Brier: mean (sigma - P)^2.
`constant_baseline` scores the predictor that always says the mean label, the bar a head must clear;
`overlap_reference` scores predicting 1 - TV(p_i, q_i), which knows the target's distribution but not
which token was drafted: how much of P is predictable at all before a head sees anything.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _entropy(p: torch.Tensor) -> torch.Tensor:
    return -(torch.xlogy(p, p) + torch.xlogy(1 - p, 1 - p))


def binary_kl_terms(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Elementwise KL(P || sigma(x)) in nats (float64; broadcasting labels against logits)."""
    x, p = logits.detach().double(), labels.detach().double()
    bce = -(p * F.logsigmoid(x) + (1 - p) * F.logsigmoid(-x))
    return (bce - _entropy(p)).clamp(min=0)  # >= 0 exactly; the clamp only removes rounding


def binary_kl(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean KL(P || sigma(x)) in nats."""
    return float(binary_kl_terms(logits, labels).mean())


def rejection_auroc(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Weighted AUROC of score 1 - sigma for the rejection event; nan if one class has no weight."""
    score = -logits.double()  # monotone in 1 - sigma(x)
    w_rej, w_acc = 1 - labels.double(), labels.double()
    total_rej, total_acc = w_rej.sum(), w_acc.sum()
    if total_rej <= 0 or total_acc <= 0:
        return math.nan
    uniq, inverse = torch.unique(score, sorted=True, return_inverse=True)
    acc_at = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse, w_acc)  # accepted weight per score
    acc_below = acc_at.cumsum(0) - acc_at  # accepted weight with a strictly lower score
    wins = (w_rej * (acc_below[inverse] + 0.5 * acc_at[inverse])).sum()
    return float(wins / (total_rej * total_acc))


def expected_calibration_error(logits: torch.Tensor, labels: torch.Tensor, n_bins: int = 10) -> float:
    sigma, p = torch.sigmoid(logits.double()), labels.double()
    bins = (sigma * n_bins).long().clamp(max=n_bins - 1)
    gap = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bins, sigma - p)  # sum(sigma - P) per bin
    return float((gap.abs() / len(sigma)).sum())  # sum_b (n_b/n) |mean_b sigma - mean_b P|


def brier(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float(((torch.sigmoid(logits.double()) - labels.double()) ** 2).mean())


def head_metrics(logits: torch.Tensor, labels: torch.Tensor, n_bins: int = 10) -> dict[str, float]:
    logits, labels = logits.detach().flatten().cpu(), labels.detach().flatten().cpu()
    return {
        "kl": binary_kl(logits, labels),
        "auroc_reject": rejection_auroc(logits, labels),
        "ece": expected_calibration_error(logits, labels, n_bins),
        "brier": brier(logits, labels),
        "mean_pred": float(torch.sigmoid(logits.double()).mean()),
        "mean_label": float(labels.double().mean()),
    }


def constant_baseline(labels: torch.Tensor, constant: float | None = None, n_bins: int = 10) -> dict[str, float]:
    """Metrics of always predicting `constant` (default: the mean of `labels`)."""
    labels = labels.detach().flatten().cpu().double()
    c = float(labels.mean()) if constant is None else constant
    c = min(max(c, 1e-12), 1 - 1e-12)  # keep the logit finite for all-0 / all-1 label sets
    logits = torch.full_like(labels, math.log(c / (1 - c)))
    return head_metrics(logits, labels, n_bins)


def overlap_reference(labels: torch.Tensor, one_minus_tv: torch.Tensor, n_bins: int = 10) -> dict[str, float]:
    """Metrics of predicting P_i by 1 - TV(p_i, q_i) = E_{Y ~ q}[P_i] (clipped away from 0 and 1)."""
    sigma = one_minus_tv.detach().flatten().cpu().double().clamp(1e-6, 1 - 1e-6)
    return head_metrics(torch.log(sigma / (1 - sigma)), labels, n_bins)
