"""Length policies that price a round with the decoder's measured cost at the batch in use
(docs/predict.md, "The stop rule", derives them; docs/algorithms.md, "Batch-aware rule", "Engine rules"):

    BatchAwareSpecDec          per row: stop where the row's expected tokens per unit of round cost stop rising
    LockstepBatchAwareSpecDec  the batch's expected tokens over the batch's round cost: all rows stop together
    GlobalVerifyBudget         vLLM #47808's rule: draft to the cap, then verify the top-N drafts of the batch
                               by survival, N maximising expected tokens / cost (`budget_widths`)
    KPerBatchSize              vLLM #32374's rule: one K per batch size, the table filled from the cost model
                               (`k_per_batch_size`)

Every policy follows the tensor protocol of `decoding.policies.stopping` (max_tokens, needs_hidden, head,
round_state(rows, device), stop_rows(state, k, sigma, drafting)): pure tensor ops, no host reads. The
batch size a round is priced at is drafting.shape[0]: rows kept in the batch tensor cost compute.

Survival (SpecDec++ section 4.3): s_j = prod_{i <= j} p_i, the predicted P(y_1..y_j all accepted); a round
that verifies k candidates emits 1 + sum_{j <= k} s_j tokens in expectation. p_i is the head's prediction
made a probability: a head trained with weighted BCE (w_rej > w_acc; docs/algorithms.md, "Acceptance
head") is biased low by design, its optimum is sigma = w_acc P / (w_acc P + w_rej (1 - P)), so p = r sigma
/ (r sigma + 1 - sigma) with r = w_rej / w_acc (`Prior.calibrate`; SpecDec++'s fixed-h rule keeps the raw
sigma its h was tuned on). At decision k the head has read e_1..e_{k-1} (SpecDec++'s one-token lag), so
p_k and everything past it is unknown: the policies price those with the `Prior`'s acceptance curve a_j,
the dev acceptance of a round's j-th draft given the earlier ones were accepted (`Bundle.prior_for`),
s_{k+m} ~ s_{k-1} a_k ... a_{k+m}. Accepted runs predict more acceptance (a_j rises with j on the demo
drafters); a single mean would price every unread draft at the unconditional rate and draft too little.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.compat import check_k
from specdraft.decoding.policies.stopping import OnePromptRule
from specdraft.decoding.rounds.shapes import round_feeds, verify_width


class RoundPrices(Protocol):
    """What the batch-aware rules read of a cost table (decoding.costs.model.CostTable): read, not imported,
    since the tables' package (which profiles the loops) sits above the loops that run these policies."""

    batch_sizes: tuple[int, ...]
    compile: str
    max_drafts: int

    def round_cost(self, batch: float, k: int, rule: str | None = None, feeds: int | None = None) -> float: ...

    def round_costs(self, batch: float, k_max: int | None = None, rule: str | None = None) -> list[float]: ...

    def t_verify(self, batch: float, width: int) -> float: ...

    def t_draft(self, batch: float) -> float: ...

    def t_catchup(self, batch: float) -> float: ...


@dataclass(frozen=True)
class Prior:
    """What a batch-aware policy assumes of what its head has not read (module docstring).
    acceptance: a_1, a_2, ...: the acceptance of a round's j-th draft given the earlier ones (past the
    list: its last value); odds: the head's w_rej / w_acc, which `calibrate` undoes."""

    acceptance: tuple[float, ...]
    odds: float = 1.0

    def __post_init__(self):
        a = self.acceptance
        if (not isinstance(a, tuple) or not a
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= 1.0 for x in a)):
            raise InputError(f"a prior's acceptance must be a non-empty tuple of probabilities in [0, 1], got {a!r}")
        if isinstance(self.odds, bool) or not isinstance(self.odds, (int, float)) or not self.odds > 0 or math.isinf(self.odds):
            raise InputError(f"a prior's odds (the head's w_rej / w_acc) must be a number > 0, got {self.odds!r}")

    @classmethod
    def of(cls, prior: "Prior | float") -> "Prior":
        """A Prior as given, or a single acceptance for every position of an uncalibrated head."""
        if isinstance(prior, Prior):
            return prior
        if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0.0 <= prior <= 1.0:
            raise InputError(f"prior must be a Prior or an acceptance probability in [0, 1], got {prior!r}")
        return cls((float(prior),))

    def at(self, j: int) -> float:
        """a_j, j >= 1."""
        return float(self.acceptance[min(j, len(self.acceptance)) - 1])

    def __str__(self) -> str:
        a = self.acceptance
        curve = f"{a[0]:.3g}" if len(a) == 1 else f"{a[0]:.3g}..{a[-1]:.3g} over drafts 1..{len(a)}"
        return f"prior acceptance {curve}, head odds {self.odds:g}"

    def calibrate(self, sigma: torch.Tensor) -> torch.Tensor:
        """The head's sigma as the acceptance probability weighted BCE biased it away from."""
        if self.odds == 1.0:
            return sigma
        return self.odds * sigma / (self.odds * sigma + 1.0 - sigma)


BEST_K = "best-k"  # reference_rate: the cost model's best fixed-K rate at the batch size (`row_rate`)


def _check_k_max(k_max: int | None, table: RoundPrices) -> int:
    # read, not imported: the cost tables (decoding/costs/) sit above the loops that run these policies
    if not callable(getattr(table, "round_cost", None)) or not isinstance(getattr(table, "max_drafts", None), int):
        raise InputError(f"a batch-aware policy needs a cost table (decoding.costs.model.CostTable), got "
                         f"{type(table).__name__}")
    k_max = table.max_drafts if k_max is None else k_max
    check_k(k_max, "K_max")
    if k_max > table.max_drafts:
        raise InputError(f"K_max = {k_max} is beyond the cost table's widest verify ({table.max_drafts} drafts); "
                         "profile it with max_width = K_max + 1")
    return k_max


class BatchAwareSpecDec(OnePromptRule):
    """Per row: after decision k, stop row b when no longer round is predicted to earn more tokens per
    second than stopping now,

        stop_b  iff  max_{k < k' <= K_max} [T_b(k') - lam C_B(k')] < T_b(k) - lam C_B(k)

    with T_b(k) = 1 + sum_{j <= k} s_bj the row's expected tokens (unknown s priced with `prior`), C_B(k)
    the cost table's round at batch B (`CostTable.round_cost`: k = 0 is a plain target step) and lam the
    rate it must beat, tokens per second per row: by default (`reference_rate` BEST_K) the cost model's best
    fixed-K rate at B (`row_rate`; the renewal-reward form, one Dinkelbach step from the best fixed K: under
    the model, a policy maximising E[T - lam C] per round has a rate >= lam, so >= the best fixed K and
    >= batched AR), or a number given, or None: the round's own T_b(k) / C_B(k) (stops a round that goes
    well too early: it weighs the tokens already banked). With costs linear in k and a fixed lam it is
    SpecDec++'s fixed-h rule, h = 1 - lam t_draft / prior^2 (docs/predict.md). Decision 0 is asked before
    any drafter forward, so a row may verify no drafts: a plain target step whenever drafting is predicted
    not to pay at B."""

    needs_hidden = True
    lockstep = False
    decides_at_zero = True  # decision 0 may stop rows before any draft (`decoding.batched.draft` reads it)

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor] | None, table: RoundPrices, prior: Prior | float,
                 k_max: int | None = None, reference_rate: float | str | None = BEST_K):
        self.head = head
        self.table = table
        self.max_tokens = _check_k_max(k_max, table)
        self.prior = Prior.of(prior)
        if reference_rate not in (None, BEST_K) and not (isinstance(reference_rate, (int, float))
                                                         and not isinstance(reference_rate, bool) and reference_rate > 0):
            raise InputError(f"reference_rate must be tokens per second per row > 0, {BEST_K!r} or None (the round's "
                             f"own), got {reference_rate!r}")
        self.reference_rate = reference_rate
        self._costs: dict[int, list[float]] = {}
        self._rates: dict[int, float] = {}
        self._bars: dict[tuple[int, int], float] = {}

    def costs(self, batch: int) -> list[float]:
        """C_B(k), k = 0..K_max, as the decoder in the table's compile mode runs a round whose longest row drafts
        k: Python floats, constants of a compiled draft graph (one per batch size). Compiled, a round drafts in
        whole segments (`decoding.rounds.shapes.round_feeds`: k = 1..4 of 8 all pay 4 feeds) and verifies at a padded
        width, so C_B is a staircase: a draft inside a segment already paid for costs only the rule's and the
        loop's per-draft work, and the rule drafts on to the segment's end unless the survival is near zero.
        Priced with the eager k - 1 feeds instead, it would stop mid-segment, inside feeds already paid for (on
        the demo pair, compiled, that ran 0.89-0.90x the best fixed K at B = 8 / 16)."""
        if batch not in self._costs:
            compiled = self.table.compile != "none"
            # the rule's own work (the head on every draft, these decisions) is part of what drafting costs
            self._costs[batch] = [self.table.round_cost(batch, k, type(self).__name__, round_feeds(self, k, compiled))
                                  for k in range(self.max_tokens + 1)]
        return self._costs[batch]

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(p_hat, known, tokens, alive), float64 / bool (rows,): p_hat = s_{k-1}; known = 1 + sum_{j<k} s_j;
        tokens = the row's T at its last decision (frozen once it stops); alive = it drafted y_k."""
        ones = torch.ones(rows, dtype=torch.float64, device=device)
        return ones, ones.clone(), ones.clone(), torch.ones(rows, dtype=torch.bool, device=device)

    def _advance(self, state, k: int, sigma: torch.Tensor | None):
        """Read sigma_{k-1} into the rows that drafted y_k; their T(k) = known + s_{k-1} a_k."""
        p_hat, known, tokens, alive = state
        if k >= 2:
            if sigma is None:
                raise InputError(f"decision {k} needs sigma = sigmoid(head(e_{k - 1})); the loop passed None")
            p_hat = torch.where(alive, p_hat * self.prior.calibrate(sigma.double()), p_hat)
            known = torch.where(alive, known + p_hat, known)
        if k >= 1:
            tokens = torch.where(alive, known + p_hat * self.prior.at(k), tokens)
        return p_hat, known, tokens, alive

    def _bar_at(self, k: int, batch: int) -> float:
        """theta_k, a Python float: decision k stops when s_{k-1} (a row's; the drafting rows' sum in lockstep) is
        below rate * theta_k. The rule's test, max_{k'} [s_{k-1} more(k') - rate dcost(k')] < 0 over k' = k + 1..K_max,
        with more(k') = (T(k') - T(k)) / s_{k-1} = sum_{k < j <= k'} a_k .. a_j (at k = 0: a_1 .. a_j) and dcost(k')
        = C_B(k') - C_B(k), holds iff s_{k-1} < rate dcost(k') / more(k') for every k' (more > 0, rate > 0): one
        comparison per decision instead of a (rows, K_max - k) tensor of gains. A k' with more = 0 (a prior of 0)
        never earns: it bars nothing when it costs more (+inf), everything when it does not (-inf). Built once
        per (k, B): constants of a compiled draft graph."""
        key = (k, batch)
        if key not in self._bars:
            costs = self.costs(batch)
            bar, total = math.inf, 0.0
            survive = self.prior.at(k) if k >= 1 else 1.0
            for i in range(1, self.max_tokens - k + 1):
                survive *= self.prior.at(k + i)
                total += survive
                dcost = costs[k + i] - costs[k]
                bar = min(bar, dcost / total if total > 0 else (math.inf if dcost > 0 else -math.inf))
            self._bars[key] = bar
        return self._bars[key]

    def row_rate(self, batch: int) -> float:
        """The fixed rate lam a row's round must beat, tokens per second per row: `reference_rate` as given, or
        under BEST_K the cost model's best fixed K at this batch size, max_K E[T(K)] / C_B(K) over K = 0..K_max
        with E[T(K)] from the prior's acceptance curve (`expected_round_tokens`; K = 0 is batched AR)."""
        if self.reference_rate != BEST_K:
            return float(self.reference_rate)
        if batch not in self._rates:
            costs = self.costs(batch)
            self._rates[batch] = max(expected_round_tokens(self.prior.acceptance, k) / costs[k]
                                     for k in range(self.max_tokens + 1))
        return self._rates[batch]

    def _stops(self, k: int, batch: int, tokens: torch.Tensor, p_hat: torch.Tensor,
               rows: torch.Tensor | None = None) -> torch.Tensor:
        """Whether no longer round k' = k + 1..K_max is predicted to beat stopping at k: T(k') - T(k) < lam (C(k') -
        C(k)) for every k' (`_bar_at`), elementwise over `tokens` / `p_hat`. rows: the rows whose tokens `tokens`
        sums (a lockstep batch's), which a fixed per-row rate is multiplied by."""
        if self.reference_rate is None:
            rate = tokens / self.costs(batch)[k]
        else:
            rate = self.row_rate(batch) * (1.0 if rows is None else rows)
        return p_hat < rate * self._bar_at(k, batch)

    def zero_stop(self, batch: int) -> bool | None:
        """Decision 0 at `batch` rows, the same for every row (each starts a round with p_hat = 1 and T(0) = 1),
        or None where it depends on the rows (lockstep with the own rate: the batch's tokens over the rows that
        draft). A compiled decode makes it without reading a tensor (`decoding.batch_draft.zero_decision`)."""
        if self.reference_rate is None and self.lockstep:
            return None
        rate = 1.0 / self.costs(batch)[0] if self.reference_rate is None else self.row_rate(batch)
        return 1.0 < rate * self._bar_at(0, batch)

    def stop_rows(self, state, k: int, sigma: torch.Tensor | None, drafting: torch.Tensor):
        p_hat, known, tokens, alive = self._advance(state, k, sigma)
        if k >= self.max_tokens:
            stop = drafting.clone()
        else:
            stop = drafting & self._stops(k, drafting.shape[0], tokens, p_hat)
        return (p_hat, known, tokens, drafting & ~stop), stop

    def __repr__(self) -> str:
        lam = "own rate" if self.reference_rate is None else f"lam {self.reference_rate}"
        return f"{type(self).__name__}({self.prior}, K_max={self.max_tokens}, {lam}, {self.table.compile})"


class LockstepBatchAwareSpecDec(BatchAwareSpecDec):
    """The batch drafts in lockstep and pays for its longest row (`decoding.batched`): stop every drafting
    row together when the batch's expected tokens, sum_b T_b(k) (rows that stopped keep their T), per
    unit of the round's cost C_B(k) are predicted to fall with any longer round. At batch 1 it is
    BatchAwareSpecDec decision for decision."""

    lockstep = True

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The per-row state (BatchAwareSpecDec.round_state) and the rows that may draft this round, (1,)
        float64, counted at decision 0: a fixed per-row rate is owed by each of them."""
        return (*super().round_state(rows, device), torch.zeros(1, dtype=torch.float64, device=device))

    def stop_rows(self, state, k: int, sigma: torch.Tensor | None, drafting: torch.Tensor):
        p_hat, known, tokens, alive = self._advance(state[:4], k, sigma)
        # counted once per round, and only for a fixed rate (the own rate never reads it)
        rows = drafting.sum().double()[None] if k == 0 and self.reference_rate is not None else state[4]
        if k >= self.max_tokens:
            stop = drafting.clone()
        else:
            batch_tokens = tokens.sum()
            growth = (p_hat * drafting).sum()  # only rows still drafting earn from a longer round
            stop = drafting & self._stops(k, drafting.shape[0], batch_tokens, growth, rows[0])
        return (p_hat, known, tokens, drafting & ~stop, rows), stop


def budget_widths(survival: torch.Tensor, table: RoundPrices, drafted: int | None = None) -> torch.Tensor:
    """vLLM #47808's global verify budget in our decoder's terms. survival (rows, W) float: s_bj for the
    drafts y_1..y_W of each row (0 where a row drafted no y_j), non-increasing along a row. The N drafts of
    highest survival across the batch are verified (a row's are a prefix of it: ties go to the earlier
    position), N = 0..rows W chosen to maximise expected tokens (rows + sum of their survival) over the
    round's cost at batch `rows`: the drafting already done (`drafted` steps, default W: the loop drafted to
    the cap) plus the verify at the width the chosen drafts need (the longest row's, padded as the compiled
    decoder pads it; vLLM prices a flat token count instead, our verify is a (rows, w + 1) tensor).
    Returns (rows,) long: the drafts each row verifies. Pure tensor ops."""
    if survival.dim() != 2:
        raise InputError(f"survival must be (rows, W), got shape {tuple(survival.shape)}")
    rows, W = survival.shape
    drafted = W if drafted is None else drafted
    if W > table.max_drafts or drafted > table.max_drafts:
        raise InputError(f"the cost table prices rounds of at most {table.max_drafts} drafts, not {max(W, drafted)}")
    device = survival.device
    s = survival.double().clamp(0.0, 1.0)
    # flatten position-major so that a stable sort breaks ties toward earlier positions (prefixes)
    flat = s.t().reshape(-1)
    order = torch.sort(flat, descending=True, stable=True).indices
    row_of = order % rows
    counts = torch.nn.functional.one_hot(row_of, rows).to(torch.long).cumsum(0)  # (rows W, rows) after N = 1..
    counts = torch.cat([torch.zeros(1, rows, dtype=torch.long, device=device), counts])  # N = 0..rows W
    width = counts.amax(-1)
    drafting = 0.0 if drafted == 0 else table.t_catchup(rows) + (drafted - 1) * table.t_draft(rows)
    pad = table.compile != "none"
    verify = torch.tensor([table.t_verify(rows, (verify_width(w, table.max_drafts) if pad else w) + 1)
                           for w in range(W + 1)], dtype=torch.float64, device=device)
    tokens = rows + torch.cat([torch.zeros(1, dtype=torch.float64, device=device), flat[order].cumsum(0)])
    rate = tokens / (drafting + verify[width])
    return counts[rate.argmax()]


class GlobalVerifyBudget(OnePromptRule):
    """vLLM #47808 (`enable_adaptive_verification`) on our heads and decoder: every row drafts to K (no
    early stop), the survival of each draft is kept in the round state, and after drafting the loop calls
    `widths(state)` (= `budget_widths`) for the drafts each row verifies. Survival is the calibrated
    heads' (module docstring); the last draft's, whose sigma the lag leaves unread, is priced with the
    prior's a_K."""

    needs_hidden = True

    def __init__(self, head: Callable[[torch.Tensor], torch.Tensor] | None, table: RoundPrices, prior: Prior | float,
                 k: int | None = None):
        self.head = head
        self.table = table
        self.max_tokens = _check_k_max(k, table)
        self.prior = Prior.of(prior)

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(p_hat (rows,), survival (rows, K), alive (rows,) bool)."""
        return (torch.ones(rows, dtype=torch.float64, device=device),
                torch.zeros(rows, self.max_tokens, dtype=torch.float64, device=device),
                torch.ones(rows, dtype=torch.bool, device=device))

    def stop_rows(self, state, k: int, sigma: torch.Tensor | None, drafting: torch.Tensor):
        p_hat, survival, alive = state
        if k >= 1:
            column = torch.arange(self.max_tokens, device=survival.device)[None]
            if k >= 2:  # sigma_{k-1} makes s_{k-1} exact
                p_hat = torch.where(alive, p_hat * self.prior.calibrate(sigma.double()), p_hat)
                survival = torch.where(alive[:, None] & (column == k - 2), p_hat[:, None], survival)
            # s_k until the next decision reads sigma_k
            survival = torch.where(alive[:, None] & (column == k - 1), (p_hat * self.prior.at(k))[:, None], survival)
        return (p_hat, survival, drafting), torch.zeros_like(drafting)

    def widths(self, state, drafted: int | None = None) -> torch.Tensor:
        return budget_widths(state[1], self.table, drafted)

    def __repr__(self) -> str:
        return f"GlobalVerifyBudget(K={self.max_tokens}, {self.table.compile})"


def expected_round_tokens(acceptance: Sequence[float], k: int) -> float:
    """1 + sum_{j <= k} prod_{i <= j} a_i: expected tokens of a round of k drafts whose j-th draft is
    accepted with probability a_j given the earlier ones were (a_j past the list: its last value)."""
    total, survive = 1.0, 1.0
    for j in range(k):
        survive *= acceptance[min(j, len(acceptance) - 1)]
        total += survive
    return total


def k_per_batch_size(table: RoundPrices, acceptance: Sequence[float], batch_sizes: Sequence[int] | None = None,
                     k_max: int | None = None) -> dict[int, int]:
    """vLLM #32374's `num_speculative_tokens_per_batch_size`, filled from the cost model: per batch size B
    the K in 0..K_max with the most expected tokens per second, expected_round_tokens(acceptance, K) /
    round_cost(B, K). acceptance: the mean acceptance of the j-th draft of a round given the earlier ones
    (a single value: i.i.d.). K = 0 is plain decoding."""
    if not acceptance or not all(0.0 <= float(a) <= 1.0 for a in acceptance):
        raise InputError(f"acceptance must be a non-empty list of probabilities, got {list(acceptance)!r}")
    k_max = _check_k_max(k_max, table)
    sizes = table.batch_sizes if batch_sizes is None else batch_sizes
    out = {}
    for b in sizes:
        costs = table.round_costs(b, k_max)
        rates = [expected_round_tokens(acceptance, k) / costs[k] for k in range(k_max + 1)]
        out[int(b)] = max(range(k_max + 1), key=lambda k: (rates[k], -k))  # ties: the shorter round
    return out


class KPerBatchSize(OnePromptRule):
    """A fixed K per batch size (vLLM #32374): a batch of B rows drafts the K of the largest listed batch
    size <= B (the smallest listed one below it). Head-free."""

    needs_hidden = False
    head = None
    decides_at_zero = True  # a batch size whose K is 0 drafts nothing

    def __init__(self, ks: Mapping[int, int]):
        if not ks:
            raise InputError("KPerBatchSize needs at least one (batch size: K) entry")
        for b, k in ks.items():
            if isinstance(b, bool) or not isinstance(b, int) or b < 1 or isinstance(k, bool) or not isinstance(k, int) or k < 0:
                raise InputError(f"KPerBatchSize entries must be batch size >= 1: K >= 0, got {b!r}: {k!r}")
        self.ks = dict(sorted(ks.items()))
        self.max_tokens = max(self.ks.values())

    def k_for(self, batch: int) -> int:
        chosen = next(iter(self.ks.values()))
        for b, k in self.ks.items():
            if b <= batch:
                chosen = k
        return chosen

    def round_state(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        return ()

    def zero_stop(self, batch: int) -> bool:
        """Decision 0 at `batch` rows (`BatchAwareSpecDec.zero_stop`): a batch size whose K is 0 drafts nothing."""
        return self.k_for(batch) == 0

    def stop_rows(self, state, k: int, sigma: torch.Tensor | None, drafting: torch.Tensor):
        return state, drafting & (k >= self.k_for(drafting.shape[0]))

    def __repr__(self) -> str:
        return f"KPerBatchSize({self.ks})"
