import math

import pytest
import torch

from specdraft.drafters import losses


def _logits(n=5, v=11, seed=0):
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * 2


def test_fkl_and_tvd_vanish_when_draft_equals_target():
    logits = _logits()
    p = logits.softmax(-1)
    assert losses.forward_kl(logits, p).item() == pytest.approx(0.0, abs=1e-6)
    assert losses.total_variation(logits, p).item() == pytest.approx(0.0, abs=1e-6)


def test_fkl_and_tvd_match_hand_computation():
    q_logits = torch.tensor([[0.0, math.log(3.0)]])  # q = (1/4, 3/4)
    p = torch.tensor([[0.5, 0.5]])
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert losses.forward_kl(q_logits, p).item() == pytest.approx(kl, rel=1e-6)
    # TV = 1/2 (|.5-.25| + |.5-.75|) = 0.25, and 1 - TV = sum min(p, q) = .25 + .5 (the acceptance rate)
    assert losses.total_variation(q_logits, p).item() == pytest.approx(0.25, rel=1e-6)
    assert 1 - losses.total_variation(q_logits, p).item() == pytest.approx(torch.minimum(p, q_logits.softmax(-1)).sum().item())


def test_fkl_ignores_zero_teacher_mass_without_nan():
    q_logits = _logits(3, 6)
    p = torch.zeros(3, 6)
    p[:, 2] = 1.0  # one-hot (greedy) teacher: KL = -log q(2)
    expect = -q_logits.log_softmax(-1)[:, 2].mean()
    assert losses.forward_kl(q_logits, p).item() == pytest.approx(expect.item(), rel=1e-6)


def test_topk_losses_equal_dense_losses_on_renormalised_teacher():
    student, teacher = _logits(seed=1), _logits(seed=2)
    k = 4
    ids, logprobs = losses.topk_of(teacher, k)
    # dense p with the top-k renormalised and zeros elsewhere
    p = torch.zeros_like(teacher).scatter(-1, ids, logprobs.softmax(-1))
    assert losses.forward_kl_topk(student, ids, logprobs).item() == pytest.approx(
        losses.forward_kl(student, p).item(), rel=1e-5
    )
    assert losses.total_variation_topk(student, ids, logprobs).item() == pytest.approx(
        losses.total_variation(student, p).item(), rel=1e-5
    )


def test_topk_with_full_vocab_equals_dense_teacher():
    student, teacher = _logits(seed=3), _logits(seed=4)
    ids, logprobs = losses.topk_of(teacher, teacher.shape[-1])
    p = teacher.softmax(-1)
    assert losses.total_variation_topk(student, ids, logprobs).item() == pytest.approx(
        losses.total_variation(student, p).item(), rel=1e-5
    )


def test_losses_have_gradients_towards_the_teacher():
    student = _logits(seed=5).requires_grad_()
    p = _logits(seed=6).softmax(-1)
    for fn in (losses.forward_kl, losses.total_variation):
        before = fn(student, p).item()
        (g,) = torch.autograd.grad(fn(student, p), student)
        assert fn(student - 0.5 * g, p).item() < before


def test_next_token_targets_shift_by_one():
    ids = torch.tensor([[5, 6, 7, 8]])
    assert losses.next_token_targets(ids).tolist() == [[6, 7, 8, 0]]
