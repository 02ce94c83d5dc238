"""Every benchmark ends the same way: print its markdown section, then append it to RESULTS.md."""
from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def publish(text: str, append: bool = True) -> None:
    """Print `text`; with `append`, add it to benchmarks/RESULTS.md as a new section."""
    print(text)
    if append:
        with RESULTS.open("a") as f:
            f.write("\n" + text.rstrip("\n") + "\n")
