"""The markdown tables of a benchmark's section, and the cells every table of intervals prints."""
from __future__ import annotations

from typing import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence], align: str = "") -> list[str]:
    """A markdown table as lines: `header`, its rule, then one line per row (each cell printed with str()).
    `align` has a letter per column, "l" or "r" (right: numbers); columns it leaves out align left."""
    header = list(header)
    if len(align) > len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r} for {len(header)} columns: one of l / r per column")
    rule = ["---:" if a == "r" else "---" for a in align.ljust(len(header), "l")]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(rule) + " |"]
    for row in rows:
        row = list(row)
        if len(row) != len(header):
            raise ValueError(f"a row of {len(row)} cells under {len(header)} columns: {row}")
        lines.append("| " + " | ".join(map(str, row)) + " |")
    return lines


def interval(cell: tuple[float, float, float], signed: bool = False, digits: int = 3) -> str:
    """(point, lo, hi) as `point [lo, hi]`; signed: every number with its sign (a difference)."""
    sign = "+" if signed else ""
    return "{0:{s}.{d}f} [{1:{s}.{d}f}, {2:{s}.{d}f}]".format(*cell, s=sign, d=digits)
