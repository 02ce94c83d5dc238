"""benchmarks/harness/: the timing every decoder benchmark shares (methods taking turns, each unit timed apart,
the warm-up decoding every seed a pass will), and the table writer."""
import pytest

from tests.conftest import import_benchmark

timing = import_benchmark("timing")
tables = import_benchmark("tables")


def test_sampled_passes_decode_only_seeds_the_warm_up_decoded():
    calls = []

    def method(name):
        def fn(seed=0):
            calls.append((name, seed))
            return seed
        return fn

    times, out = timing.warm_then_interleave({"a": method("a"), "b": method("b")}, 3, "cpu", seeded=True)
    warm, timed = calls[:6], calls[6:]
    assert sorted(warm) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    # the passes take turns (the order turning each pass), pass i at seed i, and return each pass's output
    assert timed == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    assert out == {"a": [0, 1, 2], "b": [0, 1, 2]} and all(len(t) == 3 for t in times.values())
    calls.clear()
    timing.warm_then_interleave({"a": method("a")}, 3, "cpu")  # greedy: one warm-up, every pass the default seed
    assert calls == [("a", 0)] * 4


def test_methods_take_turns_unit_by_unit_and_each_unit_is_timed_apart(monkeypatch):
    calls, clock = [], iter(range(1000))

    class Timing:  # a virtual clock: call i takes i seconds, so each call's time says which call it was
        def __init__(self, t):
            self.time = t

    monkeypatch.setattr(timing, "timed_call", lambda fn, device: (fn(), Timing(next(clock))))

    def method(name):
        def fn(unit, seed):
            calls.append((name, unit))
            return f"{name}{unit}"
        return fn

    times, out = timing.interleave({"a": method("a"), "b": method("b"), "c": method("c")}, ["x", "y"], 2, "cpu")
    warm, timed = calls[:6], calls[6:]
    assert sorted(warm) == sorted((m, u) for m in "abc" for u in "xy")
    # every unit decoded by every method back to back, the order turning by one each unit and each pass
    assert timed == [("a", "x"), ("b", "x"), ("c", "x"), ("b", "y"), ("c", "y"), ("a", "y"),
                     ("c", "x"), ("a", "x"), ("b", "x"), ("a", "y"), ("b", "y"), ("c", "y")]
    assert out["a"] == [["ax", "ay"], ["ax", "ay"]]
    assert times["a"] == [[0, 5], [7, 9]] and times["c"] == [[2, 4], [6, 11]]


def test_rotated_starts_each_turn_one_further_and_wraps():
    rotated = import_benchmark("timing").rotated
    assert [rotated("abc", k) for k in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert rotated("abc", -1) == list("cab")


def test_a_table_has_its_rule_under_its_header_and_refuses_a_ragged_row():
    assert tables.table(["method", "tok/s"], [["AR", 12.5], ["K=4", 30]], "lr") == [
        "| method | tok/s |", "| --- | ---: |", "| AR | 12.5 |", "| K=4 | 30 |"]
    with pytest.raises(ValueError, match="2 columns"):
        tables.table(["a", "b"], [["only one"]])
    assert tables.interval((1.5, 1.25, 1.75)) == "1.500 [1.250, 1.750]"
    assert tables.interval((0.5, -0.25, 1.0), signed=True) == "+0.500 [-0.250, +1.000]"
