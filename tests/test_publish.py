"""benchmarks/harness/publish.py: a benchmark rewrites its own section of RESULTS.md and touches nothing else."""
import re
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


def test_the_page_is_the_one_of_the_calling_scripts_folder(tmp_path):
    folder = tmp_path / "question"
    folder.mkdir()
    (folder / "RESULTS.md").write_text(OTHERS)
    caller = {"__file__": str(folder / "bench_z.py"), "publish": publish.publish}
    exec("publish('## Z\\n\\nz numbers')", caller)
    page = (folder / "RESULTS.md").read_text()
    assert page.startswith(OTHERS.rstrip("\n")) and sections(page, "bench_z.py") == 1 and "z numbers" in page
    assert not (tmp_path / "RESULTS.md").exists()


def test_a_wrapper_publishes_in_its_own_section_on_its_own_page(tmp_path):
    (tmp_path / "decoder").mkdir()
    (tmp_path / "real").mkdir()
    publish.publish_for("## Pair\n\nreal numbers", True, tmp_path / "real" / "bench_real_pair.py")
    assert sections((tmp_path / "real" / "RESULTS.md").read_text(), "bench_real_pair.py") == 1
    assert not (tmp_path / "decoder" / "RESULTS.md").exists()
    publish.publish_for("## GPU\n\nnumbers", True, tmp_path / "decoder" / "bench_x.py", "bench_x.py (GPU)",
                        tmp_path / "real" / "RESULTS.md")
    assert sections((tmp_path / "real" / "RESULTS.md").read_text(), "bench_x.py (GPU)") == 1


def test_a_shell_benchmark_publishes_through_the_command_line(tmp_path):
    page = tmp_path / "RESULTS.md"
    page.write_text(OTHERS)
    # the command line names the script by its path: its section, on its folder's page (here tmp_path's)
    subprocess.run([sys.executable, publish.__file__, str(tmp_path / "bench_install.sh")], input="## Install\n\n12 s\n",
                   text=True, check=True, capture_output=True)
    new = page.read_text()
    assert new.startswith(OTHERS.rstrip("\n")) and sections(new, "bench_install.sh") == 1 and "12 s" in new


# --- the pages themselves: a page per question, short enough to read ----------------------------------------

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
QUESTIONS = sorted(p.parent for p in BENCHMARKS.glob("*/RESULTS.md"))


def test_every_folder_but_the_harness_is_a_question_with_its_page():
    folders = sorted(p for p in BENCHMARKS.iterdir() if p.is_dir() and p.name not in ("harness", "__pycache__"))
    assert folders == QUESTIONS and len(QUESTIONS) >= 5
    assert not (BENCHMARKS / "RESULTS.md").exists()  # the map is benchmarks/README.md


@pytest.mark.parametrize("folder", QUESTIONS, ids=lambda p: p.name)
def test_a_question_holds_at_most_ten_files_and_its_page_under_400_lines(folder):
    files = [p for p in folder.iterdir() if p.name != "__pycache__"]
    assert len(files) <= 10, sorted(p.name for p in files)
    assert len((folder / "RESULTS.md").read_text().splitlines()) < 400


@pytest.mark.parametrize("folder", QUESTIONS, ids=lambda p: p.name)
def test_each_section_of_a_page_belongs_to_a_script_that_publishes_there(folder):
    """A section is named after its script (or the script with a qualifier, as "bench_x.py (GPU)"), and the page
    names no machine-local scratch path a reader could not rerun."""
    page = (folder / "RESULTS.md").read_text()
    scripts = {p.name for p in BENCHMARKS.glob("*/bench_*")}
    named = re.findall(r"^<!-- (?!/)(\S+)", page, flags=re.MULTILINE)
    assert named and set(named) <= scripts, set(named) - scripts
    assert "/tmp/" not in page


def test_the_map_names_every_benchmark_and_every_page():
    readme = (BENCHMARKS / "README.md").read_text()
    for script in BENCHMARKS.glob("*/bench_*"):
        assert f"{script.parent.name}/{script.name}" in readme, script
    for folder in QUESTIONS:
        assert f"({folder.name}/RESULTS.md)" in readme, folder
