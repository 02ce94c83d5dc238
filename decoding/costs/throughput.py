"""Served throughput predicted before deployment (`specdraft predict`): a drafter's acceptance statistics
(the bundle's acceptance summary) priced with the decoder's measured cost table (`CostTable`), per batch
size and length policy. Pure tensor code: no model runs here.

The acceptance summary (`acceptance/<drafter>/acceptance_summary.json` in a bundle, format ACCEPTANCE_FORMAT), written by
train-heads for each drafter and label transform and copied by export for the drafter's default head:
    sequences   up to MAX_SEQUENCES dev responses of acceptance-data, each {"accept": [P_i], "sigma": [s_i]}:
                P_i = min(1, p(Y_i)/q(Y_i)) the acceptance probability of the drafter's token at position i
                of the target's response, s_i = sigmoid(head(e_i)) the default head's prediction there
                (what heads/simulate.py simulates from), rounded to 4 decimals, at most MAX_POSITIONS each
    mean_accept, mean_sigma   over every dev position (`summary_prior` gives the batch-aware policies their
                prior: the acceptance curve of these sequences and the head's weighting)
    head, threshold, k_max, label_transform, dev_sequences, positions: where the numbers come from

The simulator (`simulate_policy`): B rows decode side by side, each walking through a dev sequence
(random start, the next sequence when one ends: a server whose batch stays full; every sequence in turn, in a
seeded order, `_SequenceOrder`). A round asks the policy's `stop_rows` exactly as the batched loop does
(`decide_round`: decision k reads sigma of e_{k-1}), caps every row at its sequence's end, and draws each
row's accepted prefix from its P_i (seeded); the round costs `CostTable.round_cost(B, longest row's k)` (rows
draft in lockstep and verify at the longest width), and its tokens are counted in expectation,
1 + sum_{j <= k} prod_{i <= j} P_i per row (less variance than the draw, the same mean). tokens/s = sum of tokens / sum of round costs; batched AR = B / round_cost(B, 0)
(a plain target step and the loop's own work per round). `new_tokens` simulates static batches instead, as
`generate_batch` decodes them (`simulate_policy`): what bench_predict.py compares with measurement.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.rounds.shapes import round_feeds
from specdraft.decoding.policies.batch_aware import Prior, k_per_batch_size
from specdraft.decoding.policies.decide import decide_round
from specdraft.decoding.policies.spec import PolicySpec, build_policy
from specdraft.decoding.costs.model import CostTable

ACCEPTANCE_FORMAT = "specdraft-acceptance-summary/1"
ACCEPTANCE_FILE = "acceptance_summary.json"  # train-heads' name, beside a drafter's heads
MAX_SEQUENCES = 64  # enough rounds for a prediction, small enough to ship (~100 kB)
MAX_POSITIONS = 256


@dataclass(frozen=True)
class AcceptanceSummary:
    accept: list[list[float]]  # per sequence, P_i
    sigma: list[list[float]]  # per sequence, the head's sigmoid at the same positions
    mean_accept: float
    mean_sigma: float
    head: str = ""
    threshold: float = 0.7
    k_max: int = 20
    label_transform: dict = field(default_factory=dict)
    dev_sequences: int = 0
    positions: int = 0

    def __post_init__(self):
        if not self.accept or len(self.accept) != len(self.sigma):
            raise InputError("acceptance summary: no sequences, or accept and sigma differ in count; re-run train-heads")
        for a, s in zip(self.accept, self.sigma):
            if not a or len(a) != len(s) or not all(0.0 <= x <= 1.0 for x in a + s):
                raise InputError("acceptance summary: a sequence is empty, ragged or not probabilities; re-run train-heads")

    def as_dict(self) -> dict:
        d = asdict(self)
        return {"format": ACCEPTANCE_FORMAT, **{k: d[k] for k in d if k not in ("accept", "sigma")},
                "sequences": [{"accept": a, "sigma": s} for a, s in zip(self.accept, self.sigma)]}

    @classmethod
    def from_dict(cls, data) -> "AcceptanceSummary":
        if not isinstance(data, dict) or data.get("format") != ACCEPTANCE_FORMAT:
            raise InputError(f"not an acceptance summary (format {ACCEPTANCE_FORMAT!r}); re-run train-heads and export")
        try:
            seqs = data["sequences"]
            return cls(accept=[[float(x) for x in s["accept"]] for s in seqs],
                       sigma=[[float(x) for x in s["sigma"]] for s in seqs],
                       mean_accept=float(data["mean_accept"]), mean_sigma=float(data["mean_sigma"]),
                       head=str(data.get("head", "")), threshold=float(data.get("threshold", 0.7)),
                       k_max=int(data.get("k_max", 20)), label_transform=dict(data.get("label_transform", {})),
                       dev_sequences=int(data.get("dev_sequences", len(seqs))), positions=int(data.get("positions", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"acceptance summary is malformed ({type(e).__name__}: {e}); re-run train-heads and export") from None

    @classmethod
    def load(cls, path) -> "AcceptanceSummary":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise InputError(f"no acceptance summary at {path}; re-run train-heads and export") from None
        except ValueError:
            raise InputError(f"acceptance summary {path} is not JSON; re-export the bundle") from None

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), separators=(",", ":")) + "\n")


def summarize_acceptance(accept: Sequence[torch.Tensor], sigma: Sequence[torch.Tensor], **info) -> AcceptanceSummary:
    """The summary of dev sequences (per sequence P_i and sigma_i tensors): the means over every position,
    the first MAX_SEQUENCES sequences (in dev order: deterministic) cut at MAX_POSITIONS, 4 decimals."""
    if len(accept) == 0 or len(accept) != len(sigma):
        raise InputError("summarize_acceptance needs as many sigma sequences as accept sequences, at least one")
    keep = [i for i in range(len(accept)) if len(accept[i])][:MAX_SEQUENCES]
    all_a, all_s = torch.cat([a.double() for a in accept]), torch.cat([s.double() for s in sigma])

    def rounded(x: torch.Tensor) -> list[float]:
        return [round(float(v), 4) for v in x[:MAX_POSITIONS]]
    return AcceptanceSummary(accept=[rounded(accept[i]) for i in keep], sigma=[rounded(sigma[i]) for i in keep],
                             mean_accept=round(float(all_a.mean()), 6), mean_sigma=round(float(all_s.mean()), 6),
                             dev_sequences=len(accept), positions=int(all_a.numel()), **info)


@dataclass(frozen=True)
class Prediction:
    method: str
    batch: int
    tokens_per_s: float
    speedup: float  # over batched AR at the same batch size
    mean_k: float  # drafts verified per row per round
    mat: float  # tokens per row per round (= per target call)


def _windows(accept: list[torch.Tensor], sigma: list[torch.Tensor], seq: torch.Tensor, pos: torch.Tensor,
             width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's next `width` positions of its dev sequence from `pos`: (P_i, sigma_i, positions left);
    past the sequence's end P = 0 and sigma = 1."""
    rows = len(seq)
    a_win = torch.zeros(rows, width, dtype=torch.float64)
    s_win = torch.ones(rows, width, dtype=torch.float64)
    left = torch.zeros(rows, dtype=torch.long)
    for b in range(rows):
        a, s, j = accept[int(seq[b])], sigma[int(seq[b])], int(pos[b])
        n = min(width, len(a) - j)
        a_win[b, :n], s_win[b, :n] = a[j:j + n], s[j:j + n]
        left[b] = len(a) - j
    return a_win, s_win, left


class _SequenceOrder:
    """Which dev sequence a row takes next: every sequence in turn, in a seeded order shuffled again each pass.
    Drawn with replacement, a row's sequence is the prediction's widest noise at small B: 40 static batches at
    B = 1 draw 40 responses, and predicted MAT moved from -4% to +10% of measured over seeds on the real
    target's 16 decoded prompts; walked in turn over whole passes, each response is decoded equally often and
    the MAT predicted from the decoded prompts' own greedy agreement is the counted one (bench_predict_mat.py)."""

    def __init__(self, accept: list[torch.Tensor], generator: torch.Generator):
        self.accept, self.generator, self.queue = accept, generator, []

    def take(self) -> int:
        if not self.queue:
            self.queue = torch.randperm(len(self.accept), generator=self.generator).tolist()
        return self.queue.pop()

    def draw(self, rows: int, anywhere: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequence, position) of `rows` new rows: the next sequences, at a random position or their start."""
        seq = torch.tensor([self.take() for _ in range(rows)], dtype=torch.long)
        pos = torch.tensor([int(torch.randint(0, len(self.accept[int(s)]), (1,), generator=self.generator))
                            if anywhere else 0 for s in seq], dtype=torch.long)
        return seq, pos

    def whole_passes(self, batches: int, batch: int) -> int:
        """`batches` static batches of `batch` rows rounded up to take every sequence equally often."""
        whole = math.lcm(len(self.accept), batch) // batch
        return -(-batches // whole) * whole


def _at_sequence_ends(accept: list[torch.Tensor], seq: torch.Tensor, pos: torch.Tensor, out: torch.Tensor,
                      new_tokens: int | None, order: _SequenceOrder) -> None:
    """Rows that reached their sequence's end, in place: in a static batch (new_tokens) a response that
    ended (shorter than MAX_POSITIONS: its EOS) finishes the row; otherwise the row goes on with the next
    sequence of `order`."""
    for b in range(len(seq)):
        if int(pos[b]) >= len(accept[int(seq[b])]):
            if new_tokens is not None and len(accept[int(seq[b])]) < MAX_POSITIONS:
                out[b] = new_tokens
            else:
                seq[b], pos[b] = order.take(), 0


def simulate_policy(policy, summary: AcceptanceSummary, table: CostTable, batch: int, rounds: int,
                    generator: torch.Generator, finish: Callable | None = None, new_tokens: int | None = None,
                    drop_half: bool | None = None, drafter: bool = True,
                    prompt_length: float | None = None) -> tuple[float, float, float]:
    """(tokens/s, mean drafts per row-round, tokens per row-round) of `policy` at `batch` (module docstring).
    finish(state, steps) -> (rows,) drafts: a rule that decides after drafting (the global verify budget).

    new_tokens None: a batch kept full (served), `rounds` rounds, tokens counted in expectation.
    new_tokens n: static batches as `generate_batch` decodes them, `rounds` batches rounded up to whole passes
    over the sequences (`_SequenceOrder`): each row decodes from the start of the next dev sequence until n
    tokens or the sequence's end (the response's EOS; a sequence
    cut at MAX_POSITIONS goes on into a further one), the batch runs until every row is done, finished
    rows are masked but keep costing compute until (drop_half; default: an eager table) half the rows are
    done and the finished ones leave, as the eager decoder drops them; tokens are the drawn ones; each
    batch also pays the call's start (`CostTable.t_start`: prefills and setup, at `prompt_length`, the width
    of the batch's prefill, when given; `drafter` False: a call without one, batched AR).

    Common random numbers: the sequences come from a generator forked from `generator` before anything else
    is drawn, so methods simulated from equally seeded generators decode the same responses in the same
    order and differ only by their rounds."""
    k_max = policy.max_tokens
    static = new_tokens is not None
    pick = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
    drop_half = (table.compile == "none") if drop_half is None else drop_half
    accept = [torch.tensor(a, dtype=torch.float64) for a in summary.accept]
    sigma = [torch.tensor(s, dtype=torch.float64) for s in summary.sigma]
    width = max(k_max, 2)

    order = _SequenceOrder(accept, pick)
    rounds = order.whole_passes(rounds, batch) if static else rounds
    seq, pos = order.draw(batch, anywhere=not static)
    out = torch.zeros(batch, dtype=torch.long)
    tokens = cost = drafts = row_rounds = 0.0
    done_batches = done_rounds = 0
    # a static batch is one decode call: it pays the call's start (prefills, setup; a calibrated table's)
    start = table.t_start(batch, drafter, prompt_length) if static else 0.0
    cost += start
    while (done_batches if static else done_rounds) < rounds:
        rows = len(seq)
        a_win, s_win, left = _windows(accept, sigma, seq, pos, width)
        cap = left - 1  # room for the drafts and the round's own token
        active = torch.ones(rows, dtype=torch.bool)
        if static:
            active = out < new_tokens
            cap = torch.where(active, torch.minimum(cap, new_tokens - out - 1), 0)
        k, state, steps = decide_round(policy, s_win, cap.clamp(0, k_max))
        if finish is not None:
            k = torch.minimum(finish(state, steps), k)
        inside = torch.arange(width)[None] < k[:, None]
        # lockstep: the longest row's drafts and verify width; the rule's own work where the table priced it
        # compiled, the draft graphs' feeds: whole segments, not the drafts alone
        cost += table.round_cost(rows, int(k.max()), type(policy).__name__,
                                 round_feeds(policy, steps, table.compile != "none"))
        drafts += float(k.sum())
        row_rounds += float(active.sum())
        done_rounds += 1
        # the draw that moves each row on: its accepted prefix, then the target's token
        u = torch.rand(rows, width, generator=generator, dtype=torch.float64)
        accepted = ((u < a_win) & inside).to(torch.long).cumprod(-1).sum(-1)
        if static:
            emitted = torch.where(active, torch.minimum(accepted + 1, new_tokens - out), 0)
            tokens += float(emitted.sum())
            out = out + emitted
        else:
            tokens += float((1.0 + (a_win.cumprod(-1) * inside).sum(-1)).sum())
        pos = pos + torch.where(active, accepted + 1, 0)  # a finished row stays where its response ended
        _at_sequence_ends(accept, seq, pos, out, new_tokens if static else None, order)
        if static:
            live = out < new_tokens
            if not bool(live.any()):
                done_batches += 1
                cost += start if done_batches < rounds else 0.0
                seq, pos = order.draw(batch, anywhere=False)
                out = torch.zeros(batch, dtype=torch.long)
            elif drop_half and int(live.sum()) <= rows // 2:
                seq, pos, out = seq[live], pos[live], out[live]
    return tokens / cost, drafts / row_rounds, tokens / row_rounds


FIXED_KS = (1, 2, 4, 8)


def predict_throughput(summary: AcceptanceSummary, table: CostTable, batch_sizes: Sequence[int], prior: Prior,
                       k_max: int | None = None, rounds: int = 200, seed: int = 0,
                       new_tokens: int | None = None, budget_k: int | None = None,
                       prompt_lengths: dict[int, float] | None = None) -> dict:
    """Predicted tokens/s and speedup over batched AR at each batch size for: AR, fixed K in FIXED_KS (those
    the table can price), SpecDec++ at the head's h, the batch-aware policy (per row and lockstep, priced
    with `prior`: `summary_prior` of the same summary and its head's odds), the global verify budget drafting
    `budget_k` a round (default: the K a user would configure from batch 1, the cost model's best K at the
    table's smallest batch), and the K per batch size the cost model recommends (also reported on its own).
    Each (method, batch) runs `rounds` simulated rounds from its own seeded generator; with `new_tokens`,
    `rounds` static batches of that many new tokens per row (`simulate_policy`), each paying a call's start
    at the width of its prefill, `prompt_lengths[B]` (the positions a batch's prefill runs at,
    `CostTable.prefill_positions` of its longest prompt, or their mean over batches; default the table's context)."""
    if not batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batch_sizes):
        raise InputError(f"batch sizes must be integers >= 1, got {list(batch_sizes)}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise InputError(f"rounds must be an integer >= 1, got {rounds!r}")
    for b in batch_sizes:
        if not table.batch_sizes[0] <= b <= table.batch_sizes[-1]:
            raise InputError(f"batch size {b} is outside the cost table's {table.batch_sizes[0]}..{table.batch_sizes[-1]}; "
                             "profile the table over every batch size to predict")
    if not isinstance(prior, Prior):
        raise InputError(f"prior must be a Prior (decoding.costs.throughput.summary_prior), got {type(prior).__name__}")
    k_max = min(summary.k_max, table.max_drafts) if k_max is None else k_max
    # the j-th draft's acceptance given the earlier ones, from the dev sequences' windows (for the K table)
    curve = acceptance_curve(summary, k_max)
    ks = k_per_batch_size(table, curve, list(batch_sizes), k_max)
    if budget_k is None:  # vLLM's budget drafts its configured num_speculative_tokens in every round
        budget_k = max(1, k_per_batch_size(table, curve, [table.batch_sizes[0]], k_max)[table.batch_sizes[0]])
    methods: dict[str, Callable[[int], tuple]] = {}
    for k in FIXED_KS:
        if k <= table.max_drafts:
            methods[f"K={k}"] = lambda b, k=k: (build_policy(PolicySpec("k-per-batch-size", ks=((1, k),))), None)
    # the head rules read the summary's sigmas, not a head (head=None)
    methods[f"SpecDec++ h={summary.threshold:g}"] = lambda b: (
        build_policy(PolicySpec("specdecpp", threshold=summary.threshold, k_max=k_max)), None)
    for name, lockstep in (("batch-aware", False), ("batch-aware lockstep", True)):
        methods[name] = lambda b, lockstep=lockstep: (build_policy(
            PolicySpec("batch-aware", k_max=k_max, lockstep=lockstep), table=table, prior=prior), None)

    def budget(b):
        policy = build_policy(PolicySpec("global-budget", k=budget_k), table=table, prior=prior)
        return policy, policy.widths
    methods[f"global budget K={budget_k}"] = budget
    methods["K table"] = lambda b: (build_policy(PolicySpec("k-per-batch-size", ks=((b, ks[b]),))), None)
    rows = []
    for b in batch_sizes:
        # every method at this B from one seed: the same responses and draws (common random numbers)
        def simulate(policy, finish=None, drafter=True):
            return simulate_policy(policy, summary, table, b, rounds, torch.Generator().manual_seed(seed * 1_000_003 + b),
                                   finish, new_tokens, drafter=drafter, prompt_length=(prompt_lengths or {}).get(b))
        # batched AR: a plain target step and the loop's own work per token, B rows at a time (static batches:
        # simulated too, as their rows end at different lengths)
        ar = b / table.round_cost(b, 0) if new_tokens is None else simulate(build_policy(PolicySpec("k-per-batch-size", ks=((1, 0),))), drafter=False)[0]
        rows.append(Prediction("AR", b, ar, 1.0, 0.0, 1.0))
        for name, build in methods.items():
            rate, mean_k, mat = simulate(*build(b))
            rows.append(Prediction(name, b, rate, rate / ar, mean_k, mat))
    return {"batch_sizes": list(batch_sizes), "k_per_batch_size": ks, "prior": prior.acceptance[0],
            "odds": prior.odds, "k_max": k_max,
            "rounds": rounds, "seed": seed, "new_tokens": new_tokens, "acceptance_curve": curve, "predictions": [asdict(r) for r in rows]}


def summary_prior(summary: AcceptanceSummary, odds: float, k_max: int | None = None) -> Prior:
    """The batch-aware policies' prior from a drafter's dev acceptance: its acceptance curve to k_max (default
    the summary's) and `odds`, the w_rej / w_acc of the head whose sigma the policy reads."""
    return Prior(tuple(round(a, 6) for a in acceptance_curve(summary, summary.k_max if k_max is None else k_max)),
                 odds)


def acceptance_curve(summary: AcceptanceSummary, k_max: int) -> list[float]:
    """a_j = E[prod_{i <= j} P] / E[prod_{i < j} P] over round starts at every dev position: the mean
    acceptance of a round's j-th draft given the earlier ones, j = 1..k_max (1.0 where nothing survives)."""
    reach = torch.zeros(k_max + 1, dtype=torch.float64)
    for a in summary.accept:
        p = torch.tensor(a, dtype=torch.float64)
        padded = torch.cat([p, torch.zeros(k_max)])
        windows = padded.unfold(0, k_max, 1)[: len(p)]
        reach += torch.cat([torch.ones(len(p), 1, dtype=torch.float64), windows.cumprod(-1)], -1).sum(0)
    return [float(reach[j] / reach[j - 1]) if reach[j - 1] > 0 else 1.0 for j in range(1, k_max + 1)]


def render_prediction(result: dict, table: CostTable) -> str:
    """The prediction as text: per batch size tokens/s and speedup over batched AR, and the K per batch size."""
    by_b: dict[int, list[dict]] = {}
    for r in result["predictions"]:
        by_b.setdefault(r["batch"], []).append(r)
    names = [r["method"] for r in next(iter(by_b.values()))]
    lines = [f"predicted served throughput (tokens/s, speedup over batched AR) on {table.device}, compile {table.compile}; "
             f"{result['rounds']} simulated rounds per cell, seed {result['seed']}; prior: a_1 {result['prior']:.3f}, "
             f"head odds {result['odds']:g}",
             "   B | " + " | ".join(f"{n:>20}" for n in names) + " | K per B"]
    for b, rows in by_b.items():
        cells = [f"{r['tokens_per_s']:9.1f} ({r['speedup']:5.2f}x)".rjust(20) for r in rows]
        lines.append(f"{b:>4} | " + " | ".join(cells) + f" | {result['k_per_batch_size'][b]}")
    return "\n".join(lines)
