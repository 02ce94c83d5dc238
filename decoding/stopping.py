"""When to stop drafting and hand the candidates to the target: fixed K, SpecDec++, hindsight oracle.

One seam. Before drafting token k+1 of a round (k tokens drafted so far) the speculator asks
`policy.stop(k, q_next, hidden)`:
    k       tokens drafted in this round so far (0 before the first)
    q_next  (V,) the drafter's distribution for token k+1 (already computed)
    hidden  (H,) the drafter's final hidden state e_k at draft token y_k (None when k == 0 or when
            the policy does not ask for hidden states)
`max_tokens` caps the round (K, or K_max); the speculator also stops at EOS and at the length limit.

SpecDec++ (paper Alg. 1) without the reference code's one-token lag: after drafting y_k the drafter is
fed y_k anyway (that forward yields q_{k+1}), and the decision to stop after y_k already uses e_k.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from decoding.compat import check_k, check_threshold


class StoppingPolicy(Protocol):
    max_tokens: int  # hard cap on draft tokens per round
    needs_hidden: bool  # whether `stop` reads e_k (costs output_hidden_states on draft forwards)

    def start_round(self, context: list[int]) -> None: ...

    def stop(self, k: int, q_next: torch.Tensor, hidden: torch.Tensor | None) -> bool: ...


class FixedK:
    """Always draft K tokens (fewer only at EOS or the length limit)."""

    needs_hidden = False

    def __init__(self, k: int):
        check_k(k)
        self.max_tokens = k

    def start_round(self, context: list[int]) -> None:
        pass

    def stop(self, k: int, q_next: torch.Tensor, hidden: torch.Tensor | None) -> bool:
        return False  # the cap max_tokens = K ends the round

    def __repr__(self) -> str:
        return f"FixedK({self.max_tokens})"


def _module_device_dtype(module: Callable) -> tuple[torch.device | None, torch.dtype | None]:
    param = next(module.parameters(), None) if isinstance(module, torch.nn.Module) else None
    return (param.device, param.dtype) if param is not None else (None, None)


class SpecDecPP:
    """Stop when the predicted probability of at least one rejection, 1 - prod_i sigmoid(head(e_i)),
    exceeds h (SpecDec++ §4.3), or at K_max. `head` maps hidden (..., H) -> logits (...)."""

    needs_hidden = True

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor], threshold: float = 0.7, k_max: int = 20):
        check_threshold(threshold)
        check_k(k_max, "K_max")
        self.head = head
        self.threshold = threshold
        self.max_tokens = k_max
        self._device, self._dtype = _module_device_dtype(head)
        self.p_all_accepted = 1.0

    def start_round(self, context: list[int]) -> None:
        self.p_all_accepted = 1.0  # predicted P(y_1..y_k all accepted)

    def stop(self, k: int, q_next: torch.Tensor, hidden: torch.Tensor | None) -> bool:
        if k == 0:
            return False  # no prediction exists before the first draft token
        e = hidden.to(device=self._device or hidden.device, dtype=self._dtype or hidden.dtype)
        self.p_all_accepted *= float(torch.sigmoid(self.head(e).float()).reshape(()))
        return 1.0 - self.p_all_accepted > self.threshold

    def __repr__(self) -> str:
        return f"SpecDecPP(h={self.threshold}, K_max={self.max_tokens})"


class HindsightOracle:
    """Greedy-only analysis mode (SpecDec++ Theorem 4.1): knowing the target's greedy continuation,
    stop exactly before the drafter's next greedy token would disagree with it. Zero discards and
    N_target = |S| + 1 (S = disagreement positions), the lower bound for any stopping policy.

    reference: prompt + the target's greedy tokens (e.g. from `generate_autoregressive`).
    """

    needs_hidden = False

    def __init__(self, reference: list[int]):
        self.reference = list(reference)
        self.max_tokens = len(self.reference)  # effectively unbounded: the length limit ends rounds
        self.position = 0

    def start_round(self, context: list[int]) -> None:
        self.position = len(context)

    def stop(self, k: int, q_next: torch.Tensor, hidden: torch.Tensor | None) -> bool:
        i = self.position + k  # index of the token the drafter would propose next
        return i >= len(self.reference) or int(q_next.argmax()) != self.reference[i]

    def __repr__(self) -> str:
        return "HindsightOracle()"
