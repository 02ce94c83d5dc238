"""benchmarks/adaptive/bench_length_ceiling.py's bookkeeping: the teacher-forced replay of a greedy decode equals the
decoder's own rounds, and the dynamic program is the cheapest schedule (brute force on small outputs)."""
import random

import pytest
import torch

from specdraft.decoding.batched import generate_batch
from specdraft.decoding.policies.stopping import FixedK
from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_length_ceiling")


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_the_teacher_forced_replay_is_the_decoders_rounds(bench, llama_pair, k):
    target, drafter = llama_pair
    for prompt in ([5, 9, 17], [3, 3, 40, 41, 12, 7]):
        result = generate_batch(target, [prompt], 30, drafter=drafter, policy=FixedK(k))[0]
        n_ahead = bench.matches_ahead(drafter, prompt, result.tokens)
        assert bench.replay(n_ahead, k, 30) == list(zip(result.metrics.drafted, result.metrics.accepted))
        # the pair disagrees somewhere: the check is not of an all-accepting drafter
        assert 0 in n_ahead


def test_matches_ahead_counts_runs_of_agreement(bench):
    class Echo(torch.nn.Module):
        """Predicts token t + 1 after t: the drafts match where the output counts up."""

        def get_input_embeddings(self):
            return torch.nn.Embedding(1, 1)

        def forward(self, input_ids):
            return type("Out", (), {"logits": torch.nn.functional.one_hot(input_ids + 1, 32).float()})

    # prompt [1]: the drafter proposes 2, 3, 4, ... after each token it is fed
    assert bench.matches_ahead(Echo(), [1], [2, 3, 9, 10, 11, 5]) == [2, 1, 0, 2, 1, 0]


def brute_force(n_ahead, costs, limit):
    """Every sequence of draft lengths, shortest first (the first round's choice, then the rest's)."""
    total = len(n_ahead)

    def cheapest(i):
        if i >= total:
            return 0.0
        return min(costs[k] + cheapest(min(total, i + min(k, n_ahead[i]) + 1))
                   for k in range(min(len(costs) - 1, limit - i - 1) + 1))

    return cheapest(0)


def test_the_optimal_schedule_is_the_cheapest_and_no_dearer_than_any_fixed_k(bench):
    rng = random.Random(0)
    for _ in range(30):
        total = rng.randint(1, 9)
        agree = [rng.random() < 0.7 for _ in range(total)]
        n_ahead = [0] * total
        for i in range(total - 1, -1, -1):
            n_ahead[i] = (n_ahead[i + 1] + 1 if i + 1 < total else 1) if agree[i] else 0
        # a staircase like a compiled round's: a fixed part, a little per draft, steps at padded widths
        costs = [3.0] + [3.5 + 0.1 * k + (0.6 if k > 2 else 0.0) for k in range(1, 5)]
        limit = total + rng.randint(0, 2)
        seconds, rounds = bench.optimal_cost(n_ahead, costs, limit)
        assert seconds == pytest.approx(brute_force(n_ahead, costs, limit))
        for k in range(len(costs)):
            fixed = sum(costs[d] for d, _ in bench.replay(n_ahead, k, limit))
            assert seconds <= fixed + 1e-12
        assert 1 <= rounds <= total
