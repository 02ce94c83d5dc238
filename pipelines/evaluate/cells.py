"""The cells every part of the evaluation report prints: a number, a speedup with its interval, a comparison with
its interval, a verdict's word, and the markdown table they sit in."""
from __future__ import annotations

from typing import Any, Iterable

from specdraft.pipelines.evaluate.claims import HEADLINE_SETS


WORD = {"above": "yes", "below": "NO", "within noise": "within noise", "too few prompts": "too few prompts",
        "too few batches": "too few batches", None: "-"}


def fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def ci(row: dict | None, name: str = "speedup") -> str:
    """'value [lo, hi]': a speedup with its bootstrap 90% interval over prompts."""
    if not row or row.get(name) is None:
        return "-"
    return f"{fmt(row[name])} [{fmt(row[name + '_lo'])}, {fmt(row[name + '_hi'])}]"


DISAGREE = " (disagrees with counted)"


def timed(row: dict | None) -> str:
    """The timed speedup with its interval, flagged where it and the counted one's intervals do not overlap."""
    return ci(row) + (DISAGREE if row and row.get("timed_counted_disagree") else "")


def compared(c: dict | None) -> str:
    return f"{fmt(c['ratio'])} [{fmt(c['lo'])}, {fmt(c['hi'])}]" if c else "-"


def table(header: list[str], rows: Iterable[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# a speedup's interval against 1, in the throughput lines' words
AGAINST_1 = {"above": "(above 1)", "below": "(below 1)", "within noise": "(within noise of 1)",
             "too few batches": "(too few batches for a verdict)", None: ""}


SET_NAMES = {"test": "in-domain", "perturbed": "perturbed", "ood": "OOD"}


def decoded_sets(metrics: dict) -> list[str]:
    """The headline's prompt sets this evaluation decoded (evaluate.sets may leave some out: the demo's)."""
    return [s for s in HEADLINE_SETS if any(r.get(f"{s}_MAT") is not None for r in metrics["headline"])]
