"""benchmarks/cpu/bench_draft_weights.py: its --pair parsing and one-line refusal, and the table's arithmetic on
fabricated decodes (MAT, acceptance, equality to AR, speedups pooled over prompts and passes)."""
import pytest

from specdraft.core.errors import InputError
from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_draft_weights")


def test_a_pair_is_a_name_and_three_directories(bench, tmp_path, capsys):
    name, target, drafter, run = bench.parse_pair("qwen=/a,/b,/c")
    assert name == "qwen" and [str(p) for p in (target, drafter, run)] == ["/a", "/b", "/c"]
    with pytest.raises(InputError, match="NAME=TARGET_DIR,DRAFTER_DIR,RUN_DIR"):
        bench.parse_pair("qwen=/a,/b")
    page = tmp_path / "RESULTS.md"
    assert bench.main(["--pair", f"x={tmp_path},{tmp_path / 'missing'},{tmp_path}", "--page", str(page)]) == 2
    assert "missing is not a directory" in capsys.readouterr().err and not page.exists()


def test_rows_pool_tokens_and_seconds_over_prompts_and_passes(bench):
    ar, dtype, int8 = "AR", "K = 4, drafter dtype", "K = 4, drafter int8"
    # two prompts, two passes; out per prompt: (tokens, generated, target forwards, drafted, accepted)
    out = {ar: [([1, 2], 10, 10, 0, 0), ([3], 10, 10, 0, 0)],
           dtype: [([1, 2], 10, 4, 8, 6), ([3], 10, 5, 8, 5)],
           int8: [([1, 2], 10, 4, 8, 6), ([9], 10, 5, 8, 5)]}  # its second output differs from AR's
    r = {"prompts": 2, "times": {ar: [[1.0, 2.0], [1.0, 2.0]], dtype: [[0.5, 1.0], [0.5, 1.0]],
                                 int8: [[0.4, 0.8], [0.4, 0.8]]},
         "out": {m: [o, o] for m, o in out.items()}}
    secs, gen = bench.per_prompt(r)
    assert secs[ar] == [2.0, 4.0] and gen[ar] == [20, 20]
    rows = {row[0]: row[1:] for row in bench.pair_rows(r)}
    assert rows[ar] == ["1.000", "-", "2/2", "6.67", "1.000 [1.000, 1.000]"]
    assert rows[dtype][:4] == ["2.222", "0.688", "2/2", "13.33"] and rows[dtype][4].startswith("2.000")
    assert rows[int8][2] == "1/2" and rows[int8][4].startswith("2.500")
