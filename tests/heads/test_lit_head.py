import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.policies.acceptance_head import AcceptanceHead
from specdraft.heads.lit_head import (
    AcceptanceHeadsModule,
    HeadSpec,
    HeadTrainConfig,
    StackedHeads,
    check_finite,
    predict_logits,
    train_head_grid,
    train_heads,
)
from specdraft.heads.losses import weighted_bce
from specdraft.heads.metrics import binary_kl, constant_baseline


def _data(m, h=16, seed=0):
    w = torch.randn(h, generator=torch.Generator().manual_seed(123)) / h**0.5  # one teacher for all splits
    f = torch.randn(m, h, generator=torch.Generator().manual_seed(seed))
    return f.half(), torch.sigmoid(3 * f @ w + 1.0)


@pytest.mark.parametrize("tie", [False, True])
def test_stacked_heads_match_and_export(tie):
    torch.manual_seed(0)
    heads = [AcceptanceHead(8, 3, tie_blocks=tie) for _ in range(3)]
    stacked = StackedHeads(heads)
    x = torch.randn(5, 8)
    expected = torch.stack([h(x) for h in heads])
    assert torch.allclose(stacked(x), expected, atol=1e-6)
    for h, e in zip(stacked.export(), heads):
        assert torch.allclose(h(x), e(x), atol=1e-6)


def test_stacked_training_equals_separate_training():
    # two heads trained together == each trained alone on the same batches (Adam is per element)
    torch.manual_seed(0)
    specs = [HeadSpec(2, 1.0), HeadSpec(0, 6.0), HeadSpec(2, 12.0)]
    module = AcceptanceHeadsModule(8, specs, HeadTrainConfig(lr=1e-2))
    alone = [h for h in module.export_heads()]
    opt_all = torch.optim.Adam(module.parameters(), lr=1e-2)
    opts = [torch.optim.Adam(h.parameters(), lr=1e-2) for h in alone]
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x, y = torch.randn(16, 8, generator=g), torch.rand(16, generator=g)
        opt_all.zero_grad()
        logits = module(x)
        sum(weighted_bce(logits[i], y, s.w_rej) for i, s in enumerate(specs)).backward()
        opt_all.step()
        for h, o, s in zip(alone, opts, specs):
            o.zero_grad()
            weighted_bce(h(x), y, s.w_rej).backward()
            o.step()
    x = torch.randn(4, 8, generator=g)
    for h, trained in zip(alone, module.export_heads()):
        assert torch.allclose(h(x), trained(x), atol=1e-5)


def test_tiny_training_run_lowers_the_loss():
    train, dev = _data(2048), _data(512, seed=1)
    cfg = HeadTrainConfig(lr=1e-2, epochs=2, batch_size=64, seed=0)
    specs = [HeadSpec(0, 1.0), HeadSpec(2, 6.0)]
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        before = AcceptanceHeadsModule(16, specs, cfg).export_heads()
    module = train_heads(train, dev, specs, cfg)
    after = module.export_heads()
    for s, b, a in zip(specs, before, after):
        loss_before = float(weighted_bce(predict_logits(b, dev[0]), dev[1], s.w_rej))
        loss_after = float(weighted_bce(predict_logits(a, dev[0]), dev[1], s.w_rej))
        assert loss_after < 0.9 * loss_before
    # the w_rej = 1 head beats the constant predictor on eval KL
    assert binary_kl(predict_logits(after[0], dev[0]), dev[1]) < constant_baseline(dev[1])["kl"]


def test_grid_returns_every_head_with_metrics():
    train, dev = _data(256), _data(128, seed=1)
    out = train_head_grid(train, dev, depths=(0, 1), w_rejs=(1, 6), cfg=HeadTrainConfig(epochs=1, batch_size=64))
    assert [(t.spec.depth, t.spec.w_rej) for t in out] == [(0, 1.0), (0, 6.0), (1, 1.0), (1, 6.0)]
    assert all(t.head.depth == t.spec.depth for t in out)
    assert set(out[0].eval_metrics) >= {"kl", "auroc_reject", "ece", "brier"}


def test_nan_features_and_bad_labels_name_the_example():
    f, y = _data(10)
    f[7, 3] = float("nan")
    with pytest.raises(InputError, match="example 7 has NaN/inf in the cached features"):
        check_finite(f, y)
    f, y = _data(10)
    y[2] = 1.5
    with pytest.raises(InputError, match="example 2"):
        train_heads((f, y), None, [HeadSpec(0, 1.0)])
