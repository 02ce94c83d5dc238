"""The SpecDec++ cost model (§3, §5.2, Eq. 3.1 and 5.1) and the fixed-K analytic speedup.

T_total = t_draft N_draft + t_target N_target                                  (3.1)
latency per token = t_draft (1 + N_discarded/N) + (t_target - t_draft) N_target/N (5.1)
fixed-K speedup over the target alone, per-token acceptance a, cost ratio c = t_draft / t_target:
    (1 - a^(K+1)) / ((1 - a)(K c + 1))
"""
from __future__ import annotations

import os

from dataclasses import dataclass
from typing import Hashable, Iterable, Sequence

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.metrics import GenerationMetrics
from specdraft.decoding.rounds.shapes import prefill_positions, verify_width


@dataclass(frozen=True)
class CostFit:
    t_draft: float  # seconds per draft forward
    t_target: float  # seconds per target forward
    r2: float  # coefficient of determination of the fit on T_total
    n_rows: int
    r2_within: float | None = None  # with groups: the counts' R^2 on the variation within groups alone

    @property
    def cost_ratio(self) -> float:
        return self.t_draft / self.t_target if self.t_target > 0 else float("inf")

    def predict_total(self, n_draft: float, n_target: float) -> float:
        """Eq. 3.1."""
        return self.t_draft * n_draft + self.t_target * n_target

    def predict_latency(self, discard_rate: float, verification_rate: float) -> float:
        """Eq. 5.1: seconds per generated token from the two hardware-independent rates."""
        return self.t_draft + self.t_draft * discard_rate + (self.t_target - self.t_draft) * verification_rate


def nnls2(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Non-negative least squares with two unknowns, exact by cases: the unconstrained fit if both are
    >= 0, else the better of the two one-variable fits (each clamped at 0)."""
    coef = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
    if bool((coef < 0).any()):
        candidates = []
        for j in range(2):  # only column j free, the other at 0
            x = X[:, j]
            c = torch.zeros(2, dtype=torch.float64)
            denom = float(x @ x)
            c[j] = max(0.0, float(x @ y) / denom) if denom > 0 else 0.0
            candidates.append(c)
        coef = min(candidates, key=lambda c: float(((y - X @ c) ** 2).sum()))
    return coef


def fit_costs(rows: Iterable[tuple[float, float, float]], groups: Sequence[Hashable] | None = None) -> CostFit:
    """Non-negative least squares T_total ~ t_draft N_draft + t_target N_target, no intercept (Eq. 3.1),
    over (N_draft, N_target, T_total) rows, e.g. one per generation. R^2 is about the mean of T_total.
    A forward never takes negative time, but noisy times with correlated counts can pull plain least
    squares there, hence NNLS.

    groups (one label per row, e.g. the run's prompt): each group also gets its own constant,
    T_total ~ t_draft N_draft + t_target N_target + a_prompt. Eq. 3.1 counts the decode's forwards; what
    every method pays alike on a prompt (the prefill of both models over a prompt of its own length, the
    context its forwards attend over) is the prompt's constant. The fit is made within groups (every row
    minus its group's mean), `r2` is the whole model's on T_total and `r2_within` the counts' share of the
    variation within prompts, the stricter number."""
    data = torch.tensor(list(rows), dtype=torch.float64)
    if data.dim() != 2 or data.shape[0] < 2 or data.shape[1] != 3:
        raise InputError("fit_costs needs at least two (N_draft, N_target, T_total) rows")
    if groups is not None and len(groups) != data.shape[0]:
        raise InputError(f"fit_costs got {len(groups)} group labels for {data.shape[0]} rows")
    X, y = data[:, :2], data[:, 2]
    Xw, yw = X, y
    if groups is not None:
        index = {g: i for i, g in enumerate(dict.fromkeys(groups))}
        g = torch.tensor([index[x] for x in groups])
        counts = torch.bincount(g, minlength=len(index)).to(torch.float64)[:, None]
        means = torch.zeros(len(index), 3, dtype=torch.float64).index_add_(0, g, data) / counts
        Xw, yw = X - means[g, :2], y - means[g, 2]
    coef = nnls2(Xw, yw)
    ss_res = float(((yw - Xw @ coef) ** 2).sum())  # the group constants fit the group means exactly
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    r2_within = None
    if groups is not None:
        ss_within = float((yw**2).sum())
        r2_within = 1.0 - ss_res / ss_within if ss_within > 0 else 1.0
    return CostFit(t_draft=float(coef[0]), t_target=float(coef[1]), r2=r2, n_rows=data.shape[0],
                   r2_within=r2_within)


def fit_from_metrics(items: Iterable[GenerationMetrics]) -> CostFit:
    return fit_costs((m.n_draft, m.n_target, m.time_total) for m in items)


def expected_tokens_per_round(a: float, k: int) -> float:
    """E[tokens per round] with i.i.d. per-token acceptance a: (1 - a^(K+1)) / (1 - a)."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def analytic_speedup(a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Fixed-K speedup over autoregressive decoding of the target (Leviathan et al. Thm 3.8).

    verify_cost: the target's (K+1)-token forward in units of its single-token forward. The textbook
    model (SpecDec++ §3) takes 1; on hardware that is not memory-bound at batch 1 (a CPU, a tiny model)
    it is measurably more, and passing the measured value separates that from decoder overhead."""
    return expected_tokens_per_round(a, k) / (k * c + verify_cost)


def acceptance_from_mat(mat: float, k: int) -> float:
    """The i.i.d. acceptance a whose expected tokens per round equals a measured MAT (fixed K).

    Measured this way the analytic speedup uses exactly the measured tokens per target call, so the
    implementation efficiency isolates time overheads from acceptance modelling error."""
    if not (1.0 <= mat <= k + 1):
        raise InputError(f"MAT must be in [1, K+1] = [1, {k + 1}], got {mat}")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection; expected_tokens_per_round is increasing in a
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_round(mid, k) < mat else (lo, mid)
    return (lo + hi) / 2


def implementation_efficiency(measured_speedup: float, a: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Measured speedup / analytic speedup: 1.0 means no overhead beyond the cost model."""
    return measured_speedup / analytic_speedup(a, k, c, verify_cost)


# ----------------------------------------------------------------------------------------------------
# The decoder's own measured costs per batch size and width (docs/algorithms.md#the-cost-table)

COST_TABLE_FORMAT = "specdraft-cost-table/1"


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: float, what: str) -> float:
    """Linear interpolation over measured points xs (ascending); InputError outside [xs[0], xs[-1]]: a
    cost is never extrapolated silently."""
    if not xs[0] <= x <= xs[-1]:
        raise InputError(f"the cost table has no {what} = {x:g} (measured {xs[0]}..{xs[-1]}); profile it "
                         f"with that {what} included")
    for i in range(len(xs) - 1):
        if xs[i] <= x <= xs[i + 1]:
            f = (x - xs[i]) / (xs[i + 1] - xs[i])
            return ys[i] + f * (ys[i + 1] - ys[i])
    return ys[0]  # one measured point, x equal to it


def _extend(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """`_interpolate` within [xs[0], xs[-1]]; past xs[-1] the line through the last two points (flat with one)."""
    if x <= xs[-1]:
        return _interpolate(xs, ys, x, "prefill width")
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0
    return ys[-1] + max(0.0, slope) * (x - xs[-1])


@dataclass(frozen=True)
class CostTable:
    """Seconds per decoder step on one device, one compile mode, one (target, drafter) pair:
        verify[B][w]  the target's verify step at batch B over w positions per row (w = 1: a plain
                      autoregressive step; w = k + 1 verifies k drafts), w in `widths`
        draft[B]      one drafter step at batch B, width 1 (y_i fed to get q_{i+1})
        catchup[B]    the drafter's end-of-round catch-up at batch B, width 2 (it yields next round's q_1)
        loop[B]       the decode loop's own work per round beyond those steps (verification and commit ops,
                      the host transfer), from short decodes (`decoding.costs.profile`); () when not calibrated.
                      Signed: negative where the loop runs a round's steps faster than they time alone
        loop_spec[B]  what a round that drafts adds to `loop` whatever its length (its draft graph's call, the
                      acceptance and commit of drafts); () when not calibrated
        loop_draft[B] the loop's own work per draft step (picks, masks) beyond the drafter's forward
        start[B]      a decode call's own start at batch B, once per call, not per round; () when not
                      calibrated. With `prefill`: the call's setup beyond its prefills (caches, state); without
                      (an older table): the setup and the target's prefill of `context` tokens per row
        start_draft[B] what a call with a drafter adds to it (with `prefill`: beyond the drafter's prefill)
        prefill[B][p] the target's prefill step at batch B over p positions per row, p in `prefill_widths`
                      (powers of two from 16 up to the cache); () when not calibrated
        prefill_draft[B][p] the drafter's
        rules         a stopping rule's own work, per rule (its class name): per round (its round state and
                      decision 0) and per draft step (the head's forward on e_i and the decision), beyond fixed
                      K's (`decoding.costs.rules.price_rules`); a round of a rule not listed pays nothing extra
    The fastest of repeated, interleaved calls after a warm-up over a static cache of `cache_length` slots
    holding `context` tokens: attention runs over every slot of the decoder's static cache (masked), so a step's
    cost grows with the cache a decode allocates (`decoding.rounds.shapes.decode_cache_length`; on the
    demo pair at B = 32 a 1-wide verify took 13 / 17 / 21 ms over 64 / 128 / 192 slots), and a table prices
    the decodes of its cache length.
    Under a compile mode only the widths the compiled decoder runs are measured (1 and 2^j + 1, see
    `decoding.rounds.shapes.verify_width`), and `round_cost` prices a round at its padded width."""

    batch_sizes: tuple[int, ...]
    widths: tuple[int, ...]
    verify: tuple[tuple[float, ...], ...]  # [batch index][width index]
    draft: tuple[float, ...]  # [batch index]
    catchup: tuple[float, ...]  # [batch index]
    device: str  # e.g. "cpu: AMD EPYC 7B13" or "cuda: NVIDIA H100 80GB HBM3"
    torch_version: str
    compile: str  # "none" | "default" | "reduce-overhead"
    target_id: str  # the model's identity (config hash, see `decoding.costs.profile.model_identity`)
    drafter_id: str
    context: int = 64  # tokens in the cache while timing
    cache_length: int = 0  # the static cache's slots the steps attended over; 0: not recorded (an older table)
    repeats: int = 0
    loop: tuple[float, ...] = ()  # [batch index], seconds per round; () = not calibrated (0)
    loop_draft: tuple[float, ...] = ()  # [batch index], seconds per draft step; () = not calibrated (0)
    loop_spec: tuple[float, ...] = ()  # [batch index], seconds per drafting round beyond loop; () = not calibrated (0)
    start: tuple[float, ...] = ()  # [batch index], seconds per decode call; () = not calibrated (0)
    start_draft: tuple[float, ...] = ()  # [batch index], seconds a drafter adds to a call's start
    rules: tuple[tuple[str, tuple[float, ...], tuple[float, ...]], ...] = ()  # (rule, per round [B], per draft [B])
    prefill_widths: tuple[int, ...] = ()  # positions per row the prefill steps were timed at
    prefill: tuple[tuple[float, ...], ...] = ()  # [batch index][prefill width index], the target's
    prefill_draft: tuple[tuple[float, ...], ...] = ()  # [batch index][prefill width index], the drafter's
    # the target's dtype the steps ran in ("bfloat16", "float32"; "": not recorded, an older table): a table is
    # never used to price another dtype's decodes (`check_dtype`)
    dtype: str = ""

    def __post_init__(self):
        if not self.batch_sizes or list(self.batch_sizes) != sorted(set(self.batch_sizes)) or self.batch_sizes[0] < 1:
            raise InputError(f"cost table batch sizes must be distinct, ascending and >= 1, got {list(self.batch_sizes)}")
        if not self.widths or list(self.widths) != sorted(set(self.widths)) or self.widths[0] != 1:
            raise InputError(f"cost table widths must be distinct, ascending and start at 1, got {list(self.widths)}")
        shape_ok = (len(self.verify) == len(self.batch_sizes) and all(len(r) == len(self.widths) for r in self.verify)
                    and len(self.draft) == len(self.batch_sizes) == len(self.catchup))
        if not shape_ok:
            raise InputError("cost table rows do not match its batch sizes and widths; re-profile it")
        values = [v for r in self.verify for v in r] + list(self.draft) + list(self.catchup)
        if not all(isinstance(v, (int, float)) and v > 0 and v == v and v != float("inf") for v in values):
            raise InputError("cost table times must be finite seconds > 0; re-profile it")
        if isinstance(self.cache_length, bool) or not isinstance(self.cache_length, int) or self.cache_length < 0:
            raise InputError(f"cost table cache_length must be slots >= 0 (0: not recorded), got {self.cache_length!r}")
        for extra in (self.loop_draft, self.loop_spec, self.start, self.start_draft):
            if extra and (len(extra) != len(self.batch_sizes)
                          or not all(isinstance(v, (int, float)) and 0 <= v < float("inf") for v in extra)):
                raise InputError("cost table loop and start overheads must be one finite number >= 0 per batch size; "
                                 "re-profile it")
        # the per-round term alone may be negative, never so far that a plain target step inside the loop is free
        if self.loop and (len(self.loop) != len(self.batch_sizes) or not all(
                isinstance(v, (int, float)) and -row[0] < v < float("inf") for v, row in zip(self.loop, self.verify))):
            raise InputError("cost table loop must be one finite number per batch size above minus its one-wide "
                             "verify step; re-profile it")
        if self.prefill_widths or self.prefill or self.prefill_draft:
            widths_ok = (list(self.prefill_widths) == sorted(set(self.prefill_widths)) and self.prefill_widths[0] >= 1
                         if self.prefill_widths else False)
            rows_ok = all(len(part) == len(self.batch_sizes) and all(
                len(r) == len(self.prefill_widths) and all(isinstance(v, (int, float)) and 0 < v < float("inf") for v in r)
                for r in part) for part in (self.prefill, self.prefill_draft))
            if not (widths_ok and rows_ok):
                raise InputError("cost table prefill times must be finite seconds > 0 per batch size and prefill width "
                                 "(distinct, ascending), for the target and the drafter; re-profile it")
        for rule in self.rules:
            ok = (isinstance(rule, tuple) and len(rule) == 3 and isinstance(rule[0], str)
                  and all(len(part) == len(self.batch_sizes) and all(isinstance(v, (int, float)) and 0 <= v < float("inf")
                                                                   for v in part) for part in rule[1:]))
            if not ok:
                raise InputError("cost table rule costs must name a rule and give one finite number >= 0 per batch size, "
                                 "per round and per draft; re-price them (decoding.costs.rules.price_rules)")

    def check_dtype(self, dtype: str, source: str) -> None:
        """InputError unless the table's steps ran in `dtype` (the target's dtype where it prices decodes): a
        step's cost moves with its dtype (on a CPU with bf16 units a 5-token verify costs 2.2 one-token forwards
        in fp32 and 0.9 in bf16), so a table of another dtype, or of an unrecorded one, prices the wrong decoder."""
        if self.dtype == dtype:
            return
        timed = f"was profiled in {self.dtype}" if self.dtype else "records no dtype (an older table)"
        raise InputError(f"the cost table {source} {timed}, and the target runs in {dtype} here: profile one in {dtype} "
                         "(leave out --cost-table), or decode in the table's dtype (--dtype)")

    @property
    def max_drafts(self) -> int:
        """The longest round the table can price (K_max): its widest verify less the last committed token."""
        return self.widths[-1] - 1

    def t_verify(self, batch: float, width: int) -> float:
        """Seconds of one verify step at batch `batch` over `width` positions per row; interpolated
        linearly between measured batch sizes and widths, InputError outside them."""
        per_b = [_interpolate(self.widths, row, width, "verify width") for row in self.verify]
        return _interpolate(self.batch_sizes, per_b, batch, "batch size")

    def t_draft(self, batch: float) -> float:
        return _interpolate(self.batch_sizes, self.draft, batch, "batch size")

    def t_catchup(self, batch: float) -> float:
        return _interpolate(self.batch_sizes, self.catchup, batch, "batch size")

    def round_cost(self, batch: float, k: int, rule: str | None = None, feeds: int | None = None) -> float:
        """Seconds of one lockstep round at batch `batch` whose longest row drafts k (k = 0: a plain target
        step). A round of k >= 1 costs k drafter forwards (Lemma 3.1, `decoding.rounds.lengths`): the
        catch-up (width 2, which gave q_1) and k - 1 width-1 steps; then one verify over k + 1 positions,
        padded as the compiled decoder pads it; plus the loop's own work, t_loop + k t_loop_draft, and
        t_loop_spec when k >= 1 (when calibrated), and the stopping rule's, t_rule + k t_rule_draft (`rule`:
        its class name, when priced).
        A round of 0 drafts runs no drafter forward. feeds: the width-1 drafter forwards the round really ran,
        where that is not k - 1 (a compiled draft graph runs its whole segment:
        `decoding.rounds.shapes.round_feeds`)."""
        if k < 0 or k > self.max_drafts:
            raise InputError(f"the cost table prices rounds of 0..{self.max_drafts} drafts, not {k}; profile a "
                             "wider table (max_width)")
        w = verify_width(k, self.max_drafts) if self.compile != "none" else k
        feeds = k - 1 if feeds is None else feeds
        drafting = 0.0 if k == 0 else self.t_catchup(batch) + feeds * self.t_draft(batch)
        per_round, per_draft = self.t_rule(batch, rule)
        return (drafting + self.t_verify(batch, w + 1) + self.t_loop(batch) + per_round
                + (self.t_loop_spec(batch) if k else 0.0) + k * (self.t_loop_draft(batch) + per_draft))

    def t_rule(self, batch: float, rule: str | None) -> tuple[float, float]:
        """(seconds per round, seconds per draft step) of stopping rule `rule`'s own work at `batch`, beyond
        fixed K's; (0, 0) for None or a rule the table has not priced."""
        for name, per_round, per_draft in self.rules:
            if name == rule:
                return (_interpolate(self.batch_sizes, per_round, batch, "batch size"),
                        _interpolate(self.batch_sizes, per_draft, batch, "batch size"))
        return 0.0, 0.0

    def t_loop(self, batch: float) -> float:
        """The loop's own seconds per round at `batch` (0 when the table was not calibrated)."""
        return _interpolate(self.batch_sizes, self.loop, batch, "batch size") if self.loop else 0.0

    def t_loop_spec(self, batch: float) -> float:
        """What a round that drafts adds to the loop's own seconds per round at `batch`, whatever its length (0
        when the table was not calibrated, or by an older calibration that put it all per draft step)."""
        return _interpolate(self.batch_sizes, self.loop_spec, batch, "batch size") if self.loop_spec else 0.0

    def t_loop_draft(self, batch: float) -> float:
        """The loop's own seconds per draft step at `batch` (0 when the table was not calibrated)."""
        return _interpolate(self.batch_sizes, self.loop_draft, batch, "batch size") if self.loop_draft else 0.0

    def t_start(self, batch: float, drafter: bool, prompt_length: float | None = None) -> float:
        """Seconds of a decode call's start at `batch` (the prefills and the call's setup), with or without a
        drafter (0 when the table was not calibrated). A served batch pays it once per request, a static
        batch once per call. prompt_length: the positions the call's prefills run at,
        `prefill_positions(longest prompt)` (or a mean of those over calls; default: the context's). The
        setup plus the prefill steps at those positions (`t_prefill`); a table without prefill steps (an
        older one) scales its start by prompt_length / prefill_positions(context) instead, which misprices a
        prefill whose cost is not linear in its width (compiled, demo pair, target + drafter at B = 1: 5.3 /
        10.9 / 17.8 ms over 16 / 64 / 128 positions; at B = 16: 37 / 130 / 257 ms)."""
        if not self.start:
            return 0.0
        positions = self.prefill_positions(self.context) if prompt_length is None else prompt_length
        extra = _interpolate(self.batch_sizes, self.start_draft, batch, "batch size") if drafter else 0.0
        setup = _interpolate(self.batch_sizes, self.start, batch, "batch size") + extra
        if not self.prefill:
            return setup * positions / self.prefill_positions(self.context)
        return setup + self.t_prefill(batch, positions, drafter)

    def t_prefill(self, batch: float, positions: float, drafter: bool) -> float:
        """Seconds of a call's prefill steps at `batch` over `positions` per row: the target's, and with
        `drafter` the drafter's too; interpolated linearly between timed widths (compiled prefills run at
        exactly those), a prefill shorter than the narrowest priced as it (its cost is nearly flat there), one
        longer than the widest extended along the line through the two widest (`extends_prefill` says when: a
        long prompt is an ordinary prompt, and a prefill's cost is close to linear in its width there; its
        attention's quadratic share makes this a little low)."""
        positions = max(positions, self.prefill_widths[0])
        parts = (self.prefill, self.prefill_draft) if drafter else (self.prefill,)
        return sum(_interpolate(self.batch_sizes, [_extend(self.prefill_widths, r, positions) for r in part], batch,
                                "batch size") for part in parts)

    def extends_prefill(self, positions: float) -> bool:
        """Whether a prefill over `positions` per row lies past the table's widest timed prefill (`t_prefill`
        prices it by linear extension)."""
        return bool(self.prefill_widths) and positions > self.prefill_widths[-1]

    def prefill_positions(self, longest: int) -> int:
        """The positions per row a call's prefill runs at, in this table's compile mode, when its longest
        prompt is `longest` tokens (`decoding.rounds.shapes.prefill_positions`): what `t_start` scales by."""
        return prefill_positions(longest, self.compile)

    def round_costs(self, batch: float, k_max: int | None = None, rule: str | None = None) -> list[float]:
        """[round_cost(batch, k, rule) for k = 0..k_max] (k_max: the table's max_drafts)."""
        top = self.max_drafts if k_max is None else k_max
        return [self.round_cost(batch, k, rule) for k in range(top + 1)]

    def as_dict(self) -> dict:
        return {"format": COST_TABLE_FORMAT, "device": self.device, "torch_version": self.torch_version,
                "dtype": self.dtype, "compile": self.compile, "target_id": self.target_id, "drafter_id": self.drafter_id,
                "context": self.context, "cache_length": self.cache_length, "repeats": self.repeats,
                "batch_sizes": list(self.batch_sizes),
                "widths": list(self.widths), "verify": [list(r) for r in self.verify], "draft": list(self.draft),
                "catchup": list(self.catchup), "loop": list(self.loop), "loop_draft": list(self.loop_draft),
                "loop_spec": list(self.loop_spec),
                "start": list(self.start), "start_draft": list(self.start_draft),
                "prefill_widths": list(self.prefill_widths), "prefill": [list(r) for r in self.prefill],
                "prefill_draft": [list(r) for r in self.prefill_draft],
                "rules": {name: {"round": list(r), "draft": list(d)} for name, r, d in self.rules}}

    @classmethod
    def from_dict(cls, data) -> "CostTable":
        if not isinstance(data, dict) or data.get("format") != COST_TABLE_FORMAT:
            raise InputError(f"not a cost table (format {COST_TABLE_FORMAT!r} expected); re-profile it")
        try:
            return cls(batch_sizes=tuple(int(b) for b in data["batch_sizes"]), widths=tuple(int(w) for w in data["widths"]),
                       verify=tuple(tuple(float(v) for v in r) for r in data["verify"]),
                       draft=tuple(float(v) for v in data["draft"]), catchup=tuple(float(v) for v in data["catchup"]),
                       device=str(data["device"]), torch_version=str(data["torch_version"]), compile=str(data["compile"]),
                       target_id=str(data["target_id"]), drafter_id=str(data["drafter_id"]),
                       dtype=str(data.get("dtype", "")),
                       context=int(data.get("context", 64)), cache_length=int(data.get("cache_length", 0)),
                       repeats=int(data.get("repeats", 0)),
                       loop=tuple(float(v) for v in data.get("loop", ())),
                       loop_draft=tuple(float(v) for v in data.get("loop_draft", ())),
                       loop_spec=tuple(float(v) for v in data.get("loop_spec", ())),
                       start=tuple(float(v) for v in data.get("start", ())),
                       start_draft=tuple(float(v) for v in data.get("start_draft", ())),
                       prefill_widths=tuple(int(w) for w in data.get("prefill_widths", ())),
                       prefill=tuple(tuple(float(v) for v in r) for r in data.get("prefill", ())),
                       prefill_draft=tuple(tuple(float(v) for v in r) for r in data.get("prefill_draft", ())),
                       rules=tuple((str(name), tuple(float(v) for v in r["round"]), tuple(float(v) for v in r["draft"]))
                                   for name, r in data.get("rules", {}).items()))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InputError(f"cost table is malformed ({type(e).__name__}: {e}); re-profile it") from None

    def save(self, path) -> None:
        import json
        from pathlib import Path

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")  # per process: two writers never share one
        tmp.write_text(json.dumps(self.as_dict(), indent=1) + "\n")
        tmp.replace(path)  # atomic: a reader never sees half a table

    @classmethod
    def load(cls, path) -> "CostTable":
        import json
        from pathlib import Path

        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(f"no cost table at {path}; profile one (specdraft predict profiles it)") from None
        except (OSError, ValueError) as e:
            raise InputError(f"cost table {path} is unreadable ({type(e).__name__}); delete it and re-profile") from None
        return cls.from_dict(data)

    def render(self) -> str:
        """The table as text: milliseconds per step, one row per batch size."""
        head = ("  B | draft  catch-up | " + " ".join(f"v(w={w})" for w in self.widths)
                + " | loop/round loop/spec loop/draft | start start+drafter")
        rows = [f"{b:>3} | {d * 1e3:5.2f}  {c * 1e3:8.2f} | " + " ".join(f"{v * 1e3:{len(f'v(w={w})')}.2f}" for v, w in zip(r, self.widths))
                + f" | {self.t_loop(b) * 1e3:10.2f} {self.t_loop_spec(b) * 1e3:9.2f} {self.t_loop_draft(b) * 1e3:10.2f}"
                + f" | {self.t_start(b, False) * 1e3:5.2f} {self.t_start(b, True) * 1e3:13.2f}"
                for b, d, c, r in zip(self.batch_sizes, self.draft, self.catchup, self.verify)]
        rules = [f"  rule {name} (beyond fixed K's; ms per round + per draft): "
                 + ", ".join(f"B={b} {r * 1e3:.2f} + {d * 1e3:.2f}" for b, r, d in zip(self.batch_sizes, per_round, per_draft))
                 for name, per_round, per_draft in self.rules]
        if self.prefill:
            rules.append("  prefill (target + drafter) at " + ", ".join(f"{w}" for w in self.prefill_widths) + " positions: "
                         + "; ".join(f"B={b} " + " ".join(f"{(t + d) * 1e3:.1f}" for t, d in zip(rt, rd))
                                     for b, rt, rd in zip(self.batch_sizes, self.prefill, self.prefill_draft)))
        slots = f", cache {self.cache_length} slots" if self.cache_length else ""
        dtype = f", {self.dtype}" if self.dtype else ""
        return "\n".join([f"cost table (ms per step; {self.device}{dtype}, torch {self.torch_version}, "
                          f"compile {self.compile}{slots})",
                          head] + rows + rules)
