"""benchmarks/families/bench_cascades.py's Table 2 logic on synthetic generations (no models)."""
import pytest

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_cascades")


def rows_for(method, rule, alpha, text, cpu, n_draft, n_target, prompts=4):
    return [{"domain": "translate", "drafter": "d", "prompt": i, "T": 1.0, "method": method, "rule": rule,
             "alpha": alpha, "text": text, "reference": " Isthay isway away entencesay.", "N": 10,
             "N_target": n_target, "N_draft": n_draft, "cpu_s": cpu * (1 + 0.01 * i), "wall_s": cpu}
            for i in range(prompts)]


def test_table2_speedup_at_target_quality_and_best_quality_under_budget(bench):
    good, bad = " Isthay isway away entencesay.", " Omethingsay elseway."
    rows = (rows_for("Target", "Target", None, good, 1.0, 0, 10)
            + rows_for("Drafter", "Drafter", None, bad, 0.2, 10, 0)
            + rows_for("SpecCascade [OPT]", "opt", 0.0, good, 0.8, 12, 4)  # target quality at 0.8x latency
            + rows_for("SpecCascade [OPT]", "opt", 1.0, bad, 0.5, 10, 2)
            + rows_for("SeqCascade [Chow]", "seq_chow", 0.3, good, 1.2, 10, 10))  # never under the budget
    points, fit = bench.summarise(rows)
    opt0 = next(p for p in points if p["method"] == "SpecCascade [OPT]" and p["alpha"] == 0.0)
    assert opt0["latency"] == pytest.approx(0.8) and opt0["quality"] == pytest.approx(100.0)
    assert fit.n_rows == len(rows)
    lines, result = bench.table2(points, 1.0)
    assert result[("SpecCascade [OPT]", "translate")] == (pytest.approx(1 / 0.8), pytest.approx(100.0))
    assert result[("SeqCascade [Chow]", "translate")] == (pytest.approx(1 / 1.2), None)
    ranking = bench.leaders(result, ["translate"])[0]
    assert ranking.index("SpecCascade [OPT]") < ranking.index("SeqCascade [Chow]")
    assert any(line.startswith("| SpecCascade [OPT] | 1.25x |") for line in lines)
