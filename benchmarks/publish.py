"""Every benchmark ends the same way: print its markdown section, then rewrite its own section of RESULTS.md.

RESULTS.md holds the current result of each benchmark, one section per script, between a marker pair named
after the script (`<!-- bench_decoder.py -->` ... `<!-- /bench_decoder.py -->`). A run replaces its
section and leaves every other byte of the file as it was; earlier results live in git's history.

A shell benchmark publishes through the command line: `python3 benchmarks/publish.py bench_install.sh < TEXT`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def markers(script: str) -> tuple[str, str]:
    """The lines that open and close `script`'s section."""
    return f"<!-- {script} -->", f"<!-- /{script} -->"


def section(script: str, text: str) -> str:
    """`text` as `script`'s section: the marker pair, a `## script` heading, and the text with its own
    headings one level down (a benchmark titles its output `## ...`, which now sits under the script's)."""
    opening, closing = markers(script)
    body = re.sub(r"^(#+) ", r"#\1 ", text.strip("\n"), flags=re.MULTILINE)
    return f"{opening}\n## {script}\n\n{body}\n{closing}\n"


def rewrite(document: str, script: str, text: str) -> str:
    """`document` with `script`'s section replaced by one holding `text` (appended when it has none)."""
    opening, closing = markers(script)
    found = re.search(rf"^{re.escape(opening)}\n.*?^{re.escape(closing)}\n", document, flags=re.MULTILINE | re.DOTALL)
    if found:
        return document[:found.start()] + section(script, text) + document[found.end():]
    if re.search(rf"^{re.escape(opening)}$", document, flags=re.MULTILINE):
        raise ValueError(f"{RESULTS.name}: {opening} has no closing {closing}; mend the file and rerun")
    return (document.rstrip("\n") + "\n\n" if document.strip() else "") + section(script, text)


def publish(text: str, write: bool = True, script: str | None = None, results: Path = RESULTS) -> None:
    """Print `text`; with `write`, make it `script`'s section of RESULTS.md. `script` defaults to the
    file name of the module that calls (the benchmark script itself), so each script owns one section."""
    print(text)
    if not write:
        return
    if script is None:
        script = Path(sys._getframe(1).f_globals.get("__file__", "benchmark")).name
    results.write_text(rewrite(results.read_text() if results.exists() else "", script, text))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 benchmarks/publish.py SCRIPT_NAME < SECTION_TEXT")
    publish(sys.stdin.read(), script=sys.argv[1])
