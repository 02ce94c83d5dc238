"""When to stop drafting and hand the candidates to the target: fixed K, SpecDec++, hindsight oracle.

One seam, three methods. `DrafterSpeculator` calls
    policy.start(drafter)            a generation begins (the oracle reads its hindsight here)
    policy.start_round(context)      a round begins after `context`
    policy.stop(k, hidden)           decision k: with y_1..y_k drafted, verify them now?
Decision 0 is asked before any drafter forward. Decision k >= 1 is asked after y_k ~ q_k has been
sampled; `hidden` is e_{k-1}, the drafter's final hidden state at y_{k-1}, which the same forward that
gave q_k produced (None for k == 1, and when the policy does not ask for hidden states). A stop
verifies y_1..y_k, y_k included. `max_tokens` caps the round (K, or K_max); the speculator also ends
it at EOS and at the length limit without asking.

This is SpecDec++ Alg. 1 and the §4.2 decision process as the paper writes them, one-token lag
included: the head's prediction for y_k needs e_k, i.e. a forward on y_k, which only pays off if y_{k+1}
is drafted. Deciding after y_k with e_k instead would waste that forward on every stop: a round of k
candidates would cost k + 1 drafter forwards and Lemma 3.1 would not hold. Here a round of k candidates
costs exactly k (see `decoding.rounds.lengths`, which `heads/simulate.py` shares, so the
threshold chosen offline is chosen under the cost the decoder pays).
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from specdraft.decoding.rounds import kv
from specdraft.decoding.compat import check_k, check_threshold
from specdraft.decoding.defaults import DEFAULTS, SPECDECPP_PAPER_THRESHOLD
from specdraft.decoding.policies.decide import decide, head_sigma
from specdraft.core.errors import InputError


class StoppingPolicy(Protocol):
    """A length policy. The rule itself is the tensor method `stop_rows`, over the rows of a batch: the
    batched decoder calls it inside its draft graph, the one-prompt loop calls it through `stop` on a batch
    of one, and the offline simulator (`heads/simulate.py`, via `decoding.policies.decide.decisions`) over
    every start position of its dev sequences at once: one definition, three callers."""

    max_tokens: int  # hard cap on draft tokens per round
    needs_hidden: bool  # whether `stop` reads e_{k-1} (costs output_hidden_states on draft forwards)

    def start(self, drafter: torch.nn.Module) -> None: ...

    def start_round(self, context: list[int]) -> None: ...

    def stop(self, k: int, hidden: torch.Tensor | None) -> bool: ...


class LengthRule(Protocol):
    """The tensor form of a stopping policy (what `stop_rows` callers need).

    round_state(rows, device): the per-round tensor state the rule keeps, fresh at each round's start.
    stop_rows(state, k, sigma, drafting) -> (state, stop): decision k, y_1..y_k drafted (k = 0: none yet,
        asked before any drafter forward). sigma (rows,) float64 = sigmoid(head(e_{k-1})) for k >= 2, else
        None (no prediction exists before e_1: SpecDec++'s one-token lag). drafting (rows,) bool: the rows
        still drafting (their cap and EOS applied). stop (rows,) bool: True where the row verifies y_1..y_k
        now. Pure tensor ops, no host reads: it runs inside a compiled draft graph."""

    max_tokens: int
    needs_hidden: bool
    head: Callable[[torch.Tensor], torch.Tensor] | None

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]: ...

    def stop_rows(self, state: tuple[torch.Tensor, ...], k: int, sigma: torch.Tensor | None,
                  drafting: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]: ...


class OnePromptRule:
    """The one-prompt loop's side of a policy defined by its tensor rule (`LengthRule`): `stop` runs
    `stop_rows` on a batch of one, so the loop that decodes one prompt and the batched loop take the same
    decisions from the same code."""

    def start(self, drafter: torch.nn.Module) -> None:
        pass

    def start_round(self, context: list[int]) -> None:
        self._state = self.round_state(1, torch.device("cpu"))

    def stop(self, k: int, hidden: torch.Tensor | None) -> bool:
        # the round state lives on the host (one row): the head's prediction comes back to it
        sigma = head_sigma(self.head, hidden).cpu() if k >= 2 and self.needs_hidden else None
        self._state, stop = decide(self, self._state, k, torch.ones(1, dtype=torch.bool), sigma=sigma)
        return bool(stop[0])


class FixedK(OnePromptRule):
    """Always draft K tokens (fewer only at EOS or the length limit)."""

    needs_hidden = False
    head = None

    def __init__(self, k: int):
        check_k(k)
        self.max_tokens = k

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return ()

    def stop_rows(self, state, k: int, sigma, drafting: torch.Tensor):
        return state, torch.zeros_like(drafting)  # the cap max_tokens = K ends the round

    def stop(self, k: int, hidden: torch.Tensor | None) -> bool:
        return False  # the cap max_tokens = K ends the round (no tensor to build in the one-prompt loop)

    def __repr__(self) -> str:
        return f"FixedK({self.max_tokens})"


class SpecDecPP(OnePromptRule):
    """SpecDec++ (§4.3, Alg. 1): after sampling y_k, stop when the predicted probability of at least one
    rejection among the predicted candidates, 1 - prod_{i < k} sigmoid(head(e_i)), exceeds h; or at
    K_max. `head` maps hidden (..., H) -> logits (...); it may be None for the offline simulator, which
    brings its own sigmas. The rule is `stop_rows`; `stop` runs it on a batch of one."""

    needs_hidden = True

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor] | None,
                 threshold: float = SPECDECPP_PAPER_THRESHOLD, k_max: int = DEFAULTS.k_max):
        check_threshold(threshold)
        check_k(k_max, "K_max")
        self.head = head
        self.threshold = threshold
        self.max_tokens = k_max

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        # p_hat: predicted P(the candidates read so far are all accepted)
        return (torch.ones(rows, dtype=torch.float64, device=device),)

    def risk(self, p_hat: torch.Tensor, drafting: torch.Tensor) -> torch.Tensor:
        """The predicted probability of a rejection each row's decision compares with h."""
        return 1.0 - p_hat

    def stop_rows(self, state, k: int, sigma, drafting: torch.Tensor):
        (p_hat,) = state
        if k <= 1 or sigma is None:
            return state, torch.zeros_like(drafting)  # no prediction exists before e_1 (y_1 always goes out)
        p_hat = p_hat * sigma
        return (p_hat,), drafting & (self.risk(p_hat, drafting) > self.threshold)

    def __repr__(self) -> str:
        return f"SpecDecPP(h={self.threshold}, K_max={self.max_tokens})"


class LockstepSpecDecPP(SpecDecPP):
    """SpecDec++ for a batch that drafts in lockstep (`decoding.batched`). There a round verifies the
    longest row's drafts for every row, so a row that stops alone saves no work and forgoes drafts that
    would be verified anyway; with per-row stops the round's width is the most optimistic row's, which
    in a large batch is nearly always K_max. Here the batch stops drafting together: after sampling y_k,
    when the mean over the rows still drafting of the predicted probability of a rejection,
    1 - prod_{i < k} sigmoid(head(e_i)), exceeds h. Rows still stop alone at their cap and after EOS. At
    batch 1 this is SpecDecPP decision for decision; like any stopping rule that reads only the drafts, it
    keeps decoding lossless."""

    def risk(self, p_hat: torch.Tensor, drafting: torch.Tensor) -> torch.Tensor:
        mean = ((1.0 - p_hat) * drafting).sum() / drafting.sum().clamp_min(1)
        return mean.expand_as(p_hat)

    def __repr__(self) -> str:
        return f"LockstepSpecDecPP(h={self.threshold}, K_max={self.max_tokens})"


class HindsightOracle(OnePromptRule):
    """Greedy-only analysis mode (SpecDec++ Theorem 4.1): knowing the target's greedy continuation and
    where the drafter's greedy tokens, conditioned on it, disagree with it (S), stop every round right
    before a disagreement. Zero discards, N_target = |S| + 1 (|S| when the last token is itself a
    disagreement), and by Lemma 3.1 N_draft = N - N_target: the lower bound for any stopping policy.

    reference: prompt + the target's greedy tokens (e.g. from `generate_autoregressive`). The hindsight
    is one teacher-forced drafter forward over it in `start`, outside the decode's counters (like the
    target's reference decode); a round that starts right before a disagreement drafts nothing (decision
    0) and spends no drafter forward. Its rule is a `stop_rows` like every other policy's, its round state
    the reference index the round starts at; it runs in the one-prompt loop (`stop`, a batch of one).
    """

    needs_hidden = False
    head = None
    decides_at_zero = True  # a round right before a disagreement drafts nothing
    hindsight = True  # its rounds follow the reference its `start` reads: the one-prompt loop only

    def __init__(self, reference: list[int]):
        self.reference = list(reference)
        self.max_tokens = len(self.reference)  # effectively unbounded: the length limit ends rounds
        # agree[i]: the drafter's greedy token at reference index i is reference[i] (index 0: no token before it)
        self.agree = torch.zeros(0, dtype=torch.bool)
        self.position = 0

    def start(self, drafter: torch.nn.Module) -> None:
        if len(self.reference) < 2:
            raise InputError("the hindsight oracle needs a reference of prompt + at least one generated token")
        with torch.inference_mode():
            logits, _ = kv.forward(drafter, kv.new_cache(), self.reference, last=len(self.reference))
        guess = logits[:-1].argmax(-1).cpu()  # (L - 1,): the drafter's token for reference index 1..L-1
        self.agree = torch.cat([torch.zeros(1, dtype=torch.bool), guess == torch.tensor(self.reference[1:])])

    def start_round(self, context: list[int]) -> None:
        self.position = len(context)
        super().start_round(context)

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return (torch.full((rows,), self.position, dtype=torch.long, device=device),)

    def stop_rows(self, state, k: int, sigma, drafting: torch.Tensor):
        """Stop before y_{k+1} when the reference index it would take, position + k, is past the reference or
        a disagreement."""
        (position,) = state
        i = position + k
        agree = self.agree.to(i.device)
        inside = i < len(agree)
        ok = inside & agree[i.clamp(max=max(len(agree) - 1, 0))] if len(agree) else inside
        return state, drafting & ~ok

    def __repr__(self) -> str:
        return "HindsightOracle()"
