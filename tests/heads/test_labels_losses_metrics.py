import math

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.heads.labels import acceptance_labels, mix_tokens
from specdraft.heads.losses import weighted_bce
from specdraft.heads.metrics import (
    binary_kl,
    brier,
    constant_baseline,
    expected_calibration_error,
    head_metrics,
    rejection_auroc,
)


def test_labels_on_hand_made_distributions():
    # V = 3; row 0: q puts all mass on token 1 where p has 0.25 -> P = 0.25; 1 - TV = 0.25
    #        row 1: q uniform-ish, p has more mass everywhere q draws from -> P depends on Y
    p = torch.tensor([[0.5, 0.25, 0.25], [0.6, 0.2, 0.2]])
    q = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.4, 0.4]])
    lab = acceptance_labels(p.log(), q.log(), SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert lab.draft_tokens[0] == 1
    assert lab.accept_prob[0] == pytest.approx(0.25)
    expected = {0: 1.0, 1: 0.5, 2: 0.5}[int(lab.draft_tokens[1])]
    assert lab.accept_prob[1] == pytest.approx(expected)
    assert lab.one_minus_tv.tolist() == pytest.approx([0.25, 0.2 + 0.2 + 0.2])
    assert lab.greedy_agree.tolist() == [False, False]


def test_label_mean_is_one_minus_tv():
    # E_{Y~q} min(1, p(Y)/q(Y)) = sum min(p, q): the two labels agree in expectation
    g = torch.Generator().manual_seed(1)
    tl, dl = torch.randn(1, 6, generator=g), torch.randn(1, 6, generator=g)
    tl, dl = tl.expand(20000, 6), dl.expand(20000, 6)
    lab = acceptance_labels(tl, dl, SamplingConfig(temperature=0.7, top_k=4), g)
    assert float(lab.accept_prob.mean()) == pytest.approx(float(lab.one_minus_tv[0]), abs=0.01)
    assert (lab.accept_prob >= 0).all() and (lab.accept_prob <= 1).all()


def test_labels_use_the_transform():
    # top_k = 1 on both sides is greedy-like: P = 1 iff the argmaxes agree, whatever the temperature
    tl = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0]])
    dl = torch.tensor([[2.0, 0.0, 1.0], [2.0, 0.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    for cfg in (SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0, top_k=1)):
        lab = acceptance_labels(tl, dl, cfg, g)
        assert lab.accept_prob.tolist() == [1.0, 0.0]
        assert lab.draft_tokens.tolist() == [0, 0]
        assert lab.greedy_agree.tolist() == [True, False]
    # untransformed (T = 1) labels differ: the pitfall of labelling at another transform
    lab1 = acceptance_labels(tl, dl, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert lab1.one_minus_tv[0] < 1.0


def test_labels_batched_shapes_and_errors():
    g = torch.Generator().manual_seed(0)
    lab = acceptance_labels(torch.randn(2, 5, 7), torch.randn(2, 5, 7), SamplingConfig(), g)
    assert lab.accept_prob.shape == (2, 5) and lab.draft_tokens.dtype == torch.long
    with pytest.raises(InputError, match="vocabulary"):
        acceptance_labels(torch.randn(5, 7), torch.randn(5, 8), SamplingConfig(), g)


def test_mix_tokens_is_seeded_and_at_rate():
    x, y = torch.zeros(10000, dtype=torch.long), torch.ones(10000, dtype=torch.long)
    z, from_y = mix_tokens(x, y, torch.Generator().manual_seed(5), r=0.15)
    z2, _ = mix_tokens(x, y, torch.Generator().manual_seed(5), r=0.15)
    assert torch.equal(z, z2)
    assert torch.equal(z == 1, from_y)
    assert float((~from_y).float().mean()) == pytest.approx(0.15, abs=0.015)
    with pytest.raises(InputError, match="mixing rate"):
        mix_tokens(x, y, torch.Generator(), r=1.5)


def test_weighted_bce_by_hand():
    logits = torch.tensor([0.0, 2.0, -1.0])
    labels = torch.tensor([1.0, 0.25, 0.0])
    w_rej = 6.0
    s = [1 / (1 + math.exp(-v)) for v in logits.tolist()]
    terms = [-(P * math.log(si) + w_rej * (1 - P) * math.log(1 - si)) for P, si in zip(labels.tolist(), s)]
    assert float(weighted_bce(logits, labels, w_rej)) == pytest.approx(sum(terms) / 3, rel=1e-6)
    mask = torch.tensor([True, False, True])
    assert float(weighted_bce(logits, labels, w_rej, mask=mask)) == pytest.approx((terms[0] + terms[2]) / 2, rel=1e-6)
    # stable at extreme logits
    assert torch.isfinite(weighted_bce(torch.tensor([1e4, -1e4]), torch.tensor([0.0, 1.0]), 12.0))
    # larger w_rej pushes the optimum down: the minimiser of w-BCE is P / (P + w (1 - P))
    x = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([x], lr=0.5)
    for _ in range(300):
        opt.zero_grad()
        weighted_bce(x, torch.tensor([0.8]), 3.0).backward()
        opt.step()
    assert float(torch.sigmoid(x.detach())) == pytest.approx(0.8 / (0.8 + 3 * 0.2), abs=1e-3)


def test_binary_kl_by_hand():
    P, s = 0.7, 0.4
    kl = P * math.log(P / s) + (1 - P) * math.log((1 - P) / (1 - s))
    assert binary_kl(torch.tensor([math.log(s / (1 - s))]), torch.tensor([P])) == pytest.approx(kl)
    # 0 log 0 = 0 at hard labels, and KL is 0 for a perfect prediction
    assert binary_kl(torch.tensor([math.log(0.9 / 0.1)]), torch.tensor([1.0])) == pytest.approx(-math.log(0.9))
    assert binary_kl(torch.tensor([0.3]), torch.sigmoid(torch.tensor([0.3]))) == pytest.approx(0, abs=1e-9)


def test_auroc_hard_and_soft():
    # hard labels: rejections (label 0) at scores 1 - sigma ranked: 3 of 4 pairs correct
    logits = torch.tensor([-2.0, 0.5, 0.0, 1.0])  # 1 - sigma decreasing in the logit
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert rejection_auroc(logits, labels) == pytest.approx(3 / 4)
    assert rejection_auroc(torch.zeros(3), torch.tensor([0.0, 1.0, 1.0])) == pytest.approx(0.5)  # all tied
    assert math.isnan(rejection_auroc(logits, torch.ones(4)))
    # soft labels = the expansion into weighted hard examples
    soft = torch.tensor([0.2, 0.9])
    lg = torch.tensor([-1.0, 1.0])
    # pairs (rejected i, accepted j), weights (1-P_i) P_j: i=0,j=1 win 0.8*0.9; i=1,j=0 loss 0.1*0.2;
    # self pairs tie: 0.5*(0.8*0.2 + 0.1*0.9)
    total = (0.8 + 0.1) * (0.2 + 0.9)
    assert rejection_auroc(lg, soft) == pytest.approx((0.72 + 0.5 * (0.16 + 0.09)) / total)


def test_ece_brier_baseline():
    logits = torch.logit(torch.tensor([0.05, 0.15, 0.95, 0.85]))
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    # bins: [0.0, 0.1) has 0.05 vs 0; [0.1, 0.2) 0.15 vs 0; [0.8, 0.9) 0.85 vs 1; [0.9, 1] 0.95 vs 1
    assert expected_calibration_error(logits, labels) == pytest.approx((0.05 + 0.15 + 0.15 + 0.05) / 4)
    assert brier(logits, labels) == pytest.approx((0.05**2 + 0.15**2 + 0.05**2 + 0.15**2) / 4)
    base = constant_baseline(labels)
    assert base["kl"] == pytest.approx(math.log(2))  # the mean is 0.5; KL(1 || 0.5) = log 2
    assert base["auroc_reject"] == 0.5 and base["ece"] == pytest.approx(0.0)
    m = head_metrics(logits, labels)
    assert m["kl"] < base["kl"] and m["brier"] < base["brier"] and m["auroc_reject"] == 1.0


def test_overlap_reference_is_the_one_minus_tv_predictor():
    from specdraft.heads.metrics import binary_kl, overlap_reference

    labels = torch.tensor([1.0, 0.0, 0.5, 0.25])
    tv = torch.tensor([0.9, 0.2, 0.5, 0.25])
    ref = overlap_reference(labels, tv)
    assert ref["kl"] == pytest.approx(binary_kl(torch.logit(tv.double()), labels), rel=1e-6)
    assert overlap_reference(tv, tv)["kl"] == pytest.approx(0.0, abs=1e-9)  # P = 1 - TV exactly: nothing left
