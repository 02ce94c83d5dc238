"""benchmarks/publish.py: a benchmark rewrites its own section of RESULTS.md and touches nothing else."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import import_benchmark

publish = import_benchmark("publish")

OTHERS = ("# Benchmark results\n\nIntro line.\n\n"
          "<!-- bench_a.py -->\n## bench_a.py\n\n### A (day 1)\n\n| x |\n| 1 |\n<!-- /bench_a.py -->\n\n"
          "Hand-written text between sections.\n\n"
          "<!-- bench_c.py -->\n## bench_c.py\n\nC's table\n<!-- /bench_c.py -->\n")


def sections(document: str, script: str) -> int:
    return document.count(f"<!-- {script} -->\n")


def test_rewriting_a_section_twice_leaves_one_and_keeps_the_others_byte_for_byte(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text(OTHERS)
    publish.publish("## B (run 1)\n\nfirst numbers", script="bench_b.py", results=results)
    once = results.read_text()
    publish.publish("## B (run 2)\n\nsecond numbers", script="bench_b.py", results=results)
    twice = results.read_text()
    assert sections(twice, "bench_b.py") == 1
    assert "second numbers" in twice and "first numbers" not in twice
    # an appended section goes after everything else, so the file up to it is the original, byte for byte
    assert once.startswith(OTHERS.rstrip("\n")) and twice.startswith(OTHERS.rstrip("\n"))
    assert once.replace("B (run 1)", "B (run 2)").replace("first", "second") == twice


def test_rewriting_a_middle_section_keeps_what_is_before_and_after_it(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text(OTHERS)
    publish.publish("## A (day 2)\n\n| x |\n| 2 |", script="bench_a.py", results=results)
    publish.publish("## A (day 3)\n\n| x |\n| 3 |", script="bench_a.py", results=results)
    new = results.read_text()
    head, rest = OTHERS.split("<!-- bench_a.py -->\n", 1)
    tail = rest.split("<!-- /bench_a.py -->\n", 1)[1]
    assert new.startswith(head) and new.endswith(tail)
    assert sections(new, "bench_a.py") == 1 and "| 3 |" in new and "day 1" not in new and "day 2" not in new
    # the script's own title sits one level under the section's `## bench_a.py` heading
    assert "## bench_a.py\n\n### A (day 3)\n" in new


def test_print_only_leaves_the_file_alone(tmp_path, capsys):
    results = tmp_path / "RESULTS.md"
    results.write_text(OTHERS)
    publish.publish("## A\n\nnew", write=False, script="bench_a.py", results=results)
    assert results.read_text() == OTHERS and "new" in capsys.readouterr().out


def test_the_section_is_named_after_the_calling_script(tmp_path):
    results = tmp_path / "RESULTS.md"
    caller = {"__file__": "/somewhere/benchmarks/bench_z.py", "publish": publish.publish, "results": results}
    exec("publish('## Z\\n\\nz numbers', results=results)", caller)
    assert sections(results.read_text(), "bench_z.py") == 1


def test_an_unclosed_section_is_refused_and_the_file_left_alone(tmp_path):
    results = tmp_path / "RESULTS.md"
    broken = OTHERS.replace("<!-- /bench_c.py -->\n", "")
    results.write_text(broken)
    with pytest.raises(ValueError, match="no closing"):
        publish.publish("## C\n\nnew", script="bench_c.py", results=results)
    assert results.read_text() == broken


def test_a_shell_benchmark_publishes_through_the_command_line(tmp_path):
    script = Path(publish.__file__)
    results = tmp_path / "RESULTS.md"
    results.write_text(OTHERS)
    # the command line writes the real RESULTS.md, so run it on a copy of publish.py beside tmp_path's file
    copy = tmp_path / "publish.py"
    copy.write_text(script.read_text())
    subprocess.run([sys.executable, str(copy), "bench_install.sh"], input="## Install\n\n12 s\n", text=True,
                   check=True, capture_output=True)
    new = results.read_text()
    assert new.startswith(OTHERS.rstrip("\n")) and sections(new, "bench_install.sh") == 1 and "12 s" in new
