"""Weighted binary cross-entropy with soft labels (SpecDec++ §4.4).

    loss_i = -w_acc P_i log sigma(x_i) - w_rej (1 - P_i) log(1 - sigma(x_i)),   w_acc = 1 in the paper

computed from logits x with logsigmoid (log(1 - sigma(x)) = logsigmoid(-x)), so it stays finite for
any logit. w_rej > 1 counters the class imbalance (most draft tokens are accepted).

Normaliser: the mean over the positions in `mask` (the Y positions of the token-mixed sequences),
i.e. sum / count. The paper writes a plain sum; the mean only rescales the gradient by the batch's
position count, which keeps the learning rate independent of the batch size. The weights are not
part of the normaliser (dividing by sum of weights would undo w_rej's effect on the optimum).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def weighted_bce_terms(logits: torch.Tensor, labels: torch.Tensor, w_rej: float, w_acc: float = 1.0) -> torch.Tensor:
    """Per-position loss, same shape as logits."""
    labels = labels.to(logits.dtype)
    return -w_acc * labels * F.logsigmoid(logits) - w_rej * (1.0 - labels) * F.logsigmoid(-logits)


def weighted_bce(
    logits: torch.Tensor,
    labels: torch.Tensor,
    w_rej: float,
    w_acc: float = 1.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean weighted BCE over masked positions (all positions when mask is None); 0 if none are masked."""
    terms = weighted_bce_terms(logits, labels, w_rej, w_acc)
    if mask is None:
        return terms.mean()
    mask = mask.to(terms.dtype)
    return (terms * mask).sum() / mask.sum().clamp(min=1.0)
