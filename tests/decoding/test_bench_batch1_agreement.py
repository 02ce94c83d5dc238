"""benchmarks/decoder/bench_batch1_agreement.py's bookkeeping: one block times every method in both shapes and counts each
core method's tokens once per prompt (a stub decode: no model)."""
from types import SimpleNamespace

from tests.conftest import import_benchmark


def test_a_block_times_both_shapes_and_counts_tokens_once_per_prompt():
    bench = import_benchmark("bench_batch1_agreement")
    calls = []

    def decode(i, make):
        calls.append((i, make))
        return [SimpleNamespace(metrics=SimpleNamespace(n_generated=10 + i))]

    methods = {"AR": None, "K=4": "k4", "K=8": "k8"}
    res = bench.block(decode, methods, n_prompts=3, runs=2, device="cpu")
    assert set(res) == {"AR", "K=4"}  # only the core methods are reported
    for a_shape, passes, tokens in res.values():
        assert tokens == 10 + 11 + 12 and len(passes) == 2 and a_shape >= 0
    # warm-up (3 x 3) + (a)-shape (3 prompts x 2 runs x 3 methods) + (b)-shape (2 runs x 3 methods x 3 prompts)
    assert len(calls) == 9 + 18 + 18
