"""benchmarks/decoder/bench_batch_decoder.py's command line and part (b) (batch_curve.py): the pairing of adaptive
methods with the best fixed K, pass by pass, and the cost tables the curve profiles."""
import pytest

from tests.conftest import import_benchmark

bench = import_benchmark("bench_batch_decoder")
curve = import_benchmark("batch_curve")


def test_pairs_each_pass_with_the_best_fixed_k_of_the_goal_set():
    # K = 16 has the highest median but is outside the goal's set; K = 8 beats K = 4 on the median
    rates = {"AR": [100.0, 50.0, 90.0], "K=4": [300.0, 150.0, 280.0], "K=8": [400.0, 200.0, 390.0],
             "K=16": [900.0, 900.0, 900.0], "SpecDec++": [440.0, 180.0, 390.0]}
    best, ratios = curve.paired_with_best_k(rates, [1, 2, 4, 8])
    assert best == "K=8"
    assert set(ratios) == {"SpecDec++"}
    # per pass 1.1, 0.9, 1.0: the median of the ratios, not the ratio of medians (440 / 390 = 1.13)
    assert ratios["SpecDec++"][:3] == pytest.approx((1.0, 0.9, 1.1)) and ratios["SpecDec++"][3] is None
    _, ratios = curve.paired_with_best_k(rates, [1, 2, 4, 8], fastest={"K=8": 400.0, "SpecDec++": 440.0})
    assert ratios["SpecDec++"][3] == pytest.approx(1.1)


def test_a_goal_set_nothing_measured_is_an_error():
    with pytest.raises(ValueError, match="none of the fixed K"):
        curve.paired_with_best_k({"AR": [1.0], "K=16": [2.0], "SpecDec++": [2.0]}, [1, 2, 4, 8])


def test_the_command_line_refuses_goal_ks_that_no_mode_measures(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--compile", "none,default", "--ks", "2,4", "--compiled-ks", "16", "--no-append"])
    assert exit_.value.code == 2
    assert "--compiled-ks [16] measures none of them" in capsys.readouterr().err


def test_the_table_names_the_best_k_and_each_ratio():
    lines = curve.paired_table([(1, "K=8", {"SpecDec++": (1.0, 0.9, 1.1, None)})], [1, 2, 4, 8])
    assert lines[-1] == "| 1 | K=8 | 1.00 (0.90-1.10) |"
    assert "best fixed K in {1, 2, 4, 8}" in lines[0] and "fastest" not in lines[0]
    lines = curve.paired_table([(1, "K=8", {"SpecDec++": (1.0, 0.9, 1.1, 0.97)})], [1, 2, 4, 8])
    assert lines[-1] == "| 1 | K=8 | 1.00 (0.90-1.10); 0.97 |" and "fastest pass" in lines[0]


def test_pooled_ratio_is_of_totals_and_its_interval_narrows_with_more_cells():
    import torch

    # two passes of two batches; the rule's cells: 10 tokens in 1 s, 30 in 1 s; K=8's: 20 in 1 s, 20 in 2 s
    tokens = {"AR": [[1, 1], [1, 1]], "K=8": [[20, 20], [20, 20]], "rule": [[10, 30], [10, 30]]}
    times = {name: [[1.0, 1.0], [1.0, 1.0]] for name in tokens} | {"K=8": [[1.0, 2.0], [1.0, 2.0]]}
    pooled = curve.pooled_with_best_k(tokens, times, "K=8")
    assert set(pooled) == {"rule"}
    ratio, lo, hi = pooled["rule"]
    # 80 tokens / 4 s against 80 / 6 s: 1.5, where the cells' own ratios (0.5 and 3.0) average 1.75
    assert ratio == pytest.approx(1.5)
    assert lo < 1.0 < 1.5 < hi  # a resample of only the first cells gives 0.5, of only the second 3.0

    def noisy(cells, seed):  # the rule 5% faster than K=8 on average, each cell's rate drawn around it
        gen = torch.Generator().manual_seed(seed)
        rule = (1.05 * (1 + 0.3 * torch.randn(cells, generator=gen))).tolist()
        ref = (1 + 0.3 * torch.randn(cells, generator=gen)).tolist()
        return ({"K=8": [[100 * r for r in ref]], "rule": [[100 * r for r in rule]]},
                {"K=8": [[1.0] * cells], "rule": [[1.0] * cells]})
    few = curve.pooled_with_best_k(*noisy(16, 1), "K=8")["rule"]
    many = curve.pooled_with_best_k(*noisy(1600, 1), "K=8")["rule"]
    assert many[2] - many[1] < (few[2] - few[1]) / 5  # ~1/sqrt(100) as wide
    assert many[1] < 1.05 < many[2] and many[1] > 1.0  # it covers the truth and, with enough cells, excludes 1
    lines = curve.pooled_table([(1, "K=8", {"rule": (1.0, 0.9, 1.1)})], [1, 2, 4, 8])
    assert lines[-1] == "| 1 | K=8 | 1.000 [0.900-1.100] |" and "bootstrap" in lines[0]


def test_without_table_rules_the_curve_profiles_nothing(monkeypatch):
    """--no-table-rules: part (b) keeps fixed K, SpecDec++ and UCBSpec, and neither profiles a cost table nor
    builds the rules that read one (on a 135M target that profile ran past 25 minutes)."""
    import torch

    def no_profile(*args, **kwargs):
        raise AssertionError("profiled a cost table")

    monkeypatch.setattr(curve, "profile_cost_table", no_profile)
    args = bench.build_parser().parse_args(["--no-table-rules", "--ks", "1,2"])
    bench.check_args(bench.build_parser(), args)
    policies, table = curve.curve_policies(args, None, None, torch.nn.Linear(4, 1), [[1, 2, 3]], args.batch_sizes)
    assert table is None
    assert list(policies) == ["AR", "K=1", "K=2", "SpecDec++", "SpecDec++ lockstep", "UCBSpec 0..4"]


def test_profile_each_batch_prices_each_b_with_its_own_table_before_its_decodes(monkeypatch):
    """--profile-each-batch: B's table is profiled right before B's decodes and its rules read it, so a compiled
    GPU run prints B = 1's row before it builds a larger B's graphs; eager, at {1, B} (a batch drops finished rows),
    compiled at B alone (a compiled batch keeps its rows, and B = 1's graphs are not built again)."""
    events = []
    monkeypatch.setattr(curve, "curve_policies", lambda args, t, d, h, p, sizes: (
        events.append(("profile", tuple(sizes))) or ({"AR": None, "K=1": sizes[-1]}, f"table {sizes}")))

    def decode(args, target, drafter, policies, prompts, B, sampling):
        events.append(("decode", B, policies["K=1"]))
        rates = {"AR": [1.0], "K=1": [2.0]}
        return None, {}, {}, rates, {"AR": 1.0, "K=1": 2.0}, rates
    monkeypatch.setattr(curve, "curve_batch_size", decode)
    seen = {}
    monkeypatch.setattr(curve, "curve_notes", lambda args, paired, pooled, tables, compile_s: seen.update(tables=tables) or [])
    monkeypatch.setattr(curve, "curve_header", lambda *a: [])
    for compile, first, at4, at16 in [("none", (1, 1), (1, 4), (1, 16)), ("reduce-overhead", (1,), (4,), (16,))]:
        events.clear()
        args = bench.build_parser().parse_args(["--profile-each-batch", "--ks", "1", "--goal-ks", "1",
                                                "--batch-sizes", "1,4,16"])
        bench.check_args(bench.build_parser(), args)
        args.compile = compile
        curve.batch_curve_table(args, None, None, None, [[1]])
        assert events == [("profile", first), ("decode", 1, 1), ("profile", at4), ("decode", 4, 4),
                          ("profile", at16), ("decode", 16, 16)]
        assert seen["tables"] == [f"table {list(first)}", f"table {list(at4)}", f"table {list(at16)}"]
