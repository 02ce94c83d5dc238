"""Every benchmark ends the same way: print its markdown section, then rewrite its own section of its folder's
RESULTS.md.

Each folder of benchmarks/ answers one question and has one RESULTS.md page, holding the current result of each of
its benchmarks, one section per script, between a marker pair named after the script (`<!-- bench_x.py -->` ...
`<!-- /bench_x.py -->`). A run replaces its section and leaves every other byte of the page as it was; earlier
results live in git's history.

A shell benchmark publishes through the command line, naming itself by its path:
`python3 benchmarks/harness/publish.py benchmarks/pipeline/bench_install.sh < TEXT`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

PAGE = "RESULTS.md"


def page_of(script: str | Path) -> Path:
    """The RESULTS page of the folder `script` lies in."""
    return Path(script).resolve().with_name(PAGE)


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
        raise ValueError(f"{PAGE}: {opening} has no closing {closing}; mend the file and rerun")
    return (document.rstrip("\n") + "\n\n" if document.strip() else "") + section(script, text)


def publish(text: str, write: bool = True, script: str | None = None, results: Path | None = None) -> None:
    """Print `text`; with `write`, make it `script`'s section of the page `results`. Both default to the module
    that calls (the benchmark script itself): its file name, and the RESULTS.md of its folder, so each script
    owns one section of its question's page."""
    print(text)
    if not write:
        return
    caller = Path(sys._getframe(1).f_globals.get("__file__", "benchmark"))
    script = script or caller.name
    results = Path(results) if results is not None else page_of(caller)
    results.write_text(rewrite(results.read_text() if results.exists() else "", script, text))


def add_section_flags(parser) -> None:
    """--no-append, and --section and --page for a run that writes another section or page than its script's own
    (gpu_check.py gives its GPU runs sections of their own, on the GPU's page)."""
    parser.add_argument("--no-append", action="store_true", help="print only; leave the RESULTS page as it is")
    parser.add_argument("--section", help="the section to rewrite (default: the script's file name)")
    parser.add_argument("--page", help="the RESULTS page to rewrite (default: the RESULTS.md of the script's folder)")


def publish_for(text: str, write: bool, owner: Path, section: str | None = None, page: str | Path | None = None) -> None:
    """`publish` on behalf of the script `owner` (a wrapper that runs another script's benchmark on its own pair):
    its section of its folder's page, unless `section` / `page` name others."""
    publish(text, write, script=section or Path(owner).name, results=Path(page) if page else page_of(owner))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 benchmarks/harness/publish.py PATH_OF_THE_SCRIPT < SECTION_TEXT")
    publish(sys.stdin.read(), script=Path(sys.argv[1]).name, results=page_of(sys.argv[1]))
