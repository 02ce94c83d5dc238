"""Bandit rewards on hand-made distributions (MetaSD Eq. 4, §2.3; BanditSpec accepted length)."""
import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.bandits.rewards import (
    accepted_length_reward,
    block_divergence_reward,
    block_efficiency_reward,
    tv_distance,
)
from specdraft.decoding.rounds.sampling import SamplingConfig, probs


def test_tv_distance_by_hand():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.3, 0.1, 0.4])
    # 1/2 (|0.3| + 0 + |0.1| + |-0.4|) = 0.4
    assert tv_distance(p, q).item() == pytest.approx(0.4)
    assert tv_distance(p, p).item() == 0.0
    disjoint = torch.tensor([0.0, 0.0, 0.5, 0.5])
    assert tv_distance(torch.tensor([0.5, 0.5, 0.0, 0.0]), disjoint).item() == pytest.approx(1.0)


def test_block_divergence_is_mean_alignment_over_drafted_positions():
    # three drafted positions over a vocabulary of 3
    p = torch.tensor([[0.6, 0.4, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.6, 0.4, 0.0], [0.0, 1.0, 0.0], [0.5, 0.3, 0.2]])
    tvs = [0.0, 1.0, 0.5 * (0.3 + 0.0 + 0.3)]
    expected = sum(1 - tv for tv in tvs) / 3  # N_max = 3 drafted positions
    assert block_divergence_reward(p, q).item() == pytest.approx(expected)


def test_block_divergence_short_draft_divides_by_drafted_count():
    p = torch.tensor([[[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]], [[0.9, 0.1], [0.3, 0.7], [0.0, 1.0]]])
    q = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], [[0.5, 0.5], [0.3, 0.7], [1.0, 0.0]]])
    mask = torch.tensor([[True, True, True], [True, True, False]])  # row 2 stopped after 2 drafts
    out = block_divergence_reward(p, q, mask)
    assert out.shape == (2,)
    assert out[0].item() == pytest.approx(((1 - 0.5) + (1 - 0.0) + (1 - 1.0)) / 3)
    assert out[1].item() == pytest.approx(((1 - 0.4) + (1 - 0.0)) / 2)  # padded third position ignored
    # a round that drafted 2 tokens scores the same as passing just those 2 positions
    assert out[1].item() == pytest.approx(block_divergence_reward(p[1, :2], q[1, :2]).item())


def test_block_divergence_of_greedy_onehots_is_fraction_of_argmax_agreement():
    g = torch.Generator().manual_seed(0)
    target_logits, draft_logits = torch.randn(5, 16, generator=g), torch.randn(5, 16, generator=g)
    draft_logits[:2] = target_logits[:2]  # first two positions agree
    cfg = SamplingConfig(temperature=0.0)
    agree = (target_logits.argmax(-1) == draft_logits.argmax(-1)).float().mean().item()
    reward = block_divergence_reward(probs(target_logits, cfg), probs(draft_logits, cfg)).item()
    assert reward == pytest.approx(agree)
    assert reward >= 2 / 5


def test_block_divergence_bad_shapes():
    with pytest.raises(InputError, match="bonus position"):
        block_divergence_reward(torch.full((4, 3), 1 / 3), torch.full((3, 3), 1 / 3))
    with pytest.raises(InputError, match="n >= 1"):
        block_divergence_reward(torch.zeros(0, 3), torch.zeros(0, 3))
    with pytest.raises(InputError, match="no drafted position"):
        block_divergence_reward(torch.full((2, 3), 1 / 3), torch.full((2, 3), 1 / 3), torch.tensor([False, False]))


def test_block_efficiency_and_accepted_length():
    assert block_efficiency_reward(0, 5) == 0.0
    assert block_efficiency_reward(3, 5) == pytest.approx(3 / 5)
    assert block_efficiency_reward(5, 5) == 1.0
    assert accepted_length_reward(0, 4) == 1  # only the correction token
    assert accepted_length_reward(4, 4) == 5  # all drafts + bonus = L + 1
    batch = accepted_length_reward(torch.tensor([0, 2, 4]), 4)
    assert batch.tolist() == [1, 3, 5]
    with pytest.raises(InputError, match=r"\[0, n_max=5\]"):
        block_efficiency_reward(6, 5)
    with pytest.raises(InputError, match="n_max"):
        block_efficiency_reward(0, 0)
    with pytest.raises(InputError, match=r"\[0, max_len=4\]"):
        accepted_length_reward(torch.tensor([1, 5]), 4)
    with pytest.raises(InputError):
        accepted_length_reward(-1, 4)


def test_throughput_reward_is_tokens_per_unit_cost():
    from specdraft.decoding.bandits.rewards import normalized_throughput, throughput_range, throughput_reward

    assert throughput_reward(0, 0, 0.3) == 1.0  # a plain target step
    assert throughput_reward(2, 4, 0.25) == pytest.approx(3 / 2)  # 3 tokens for 1 + 4 * 0.25
    low, high = throughput_range(4, 0.25)
    assert (low, high) == (pytest.approx(0.5), pytest.approx(2.5))
    assert normalized_throughput(0, 4, 4, 0.25) == pytest.approx(0.0)
    assert normalized_throughput(4, 4, 4, 0.25) == pytest.approx(1.0)
    # c large enough that drafting never pays: the plain step is the best round
    assert throughput_range(4, 2.0)[1] == 1.0 and normalized_throughput(0, 0, 4, 2.0) == pytest.approx(1.0)
    with pytest.raises(InputError, match="cost ratio"):
        throughput_reward(1, 2, -0.1)
    with pytest.raises(InputError, match="accepted"):
        throughput_reward(3, 2, 0.1)
    with pytest.raises(InputError, match="max_len"):
        normalized_throughput(1, 5, 4, 0.1)
