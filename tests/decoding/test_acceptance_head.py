import json

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.policies.acceptance_head import AcceptanceHead, load_head, save_head


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_shapes(depth):
    head = AcceptanceHead(16, depth)
    assert head(torch.randn(2, 5, 16)).shape == (2, 5)
    assert head(torch.randn(16, dtype=torch.float16)).dtype == torch.float32


def test_blocks_are_independent():
    torch.manual_seed(0)
    head = AcceptanceHead(8, depth=3)
    weights = [head.block(i).linear.weight for i in range(3)]
    assert len({w.data_ptr() for w in weights}) == 3
    assert not torch.equal(weights[0], weights[1])
    n_params = sum(p.numel() for p in head.parameters())
    assert n_params == 3 * (8 * 8 + 8) + 8 + 1
    # a gradient step on block 0 alone leaves the others untouched
    with torch.no_grad():
        head.block(0).linear.weight.add_(1.0)
    assert not torch.equal(head.block(0).linear.weight, head.block(1).linear.weight)


def test_tied_blocks_share_one_module():
    head = AcceptanceHead(8, depth=3, tie_blocks=True)
    assert head.block(0) is head.block(1) is head.block(2)
    assert sum(p.numel() for p in head.parameters()) == (8 * 8 + 8) + 8 + 1
    # applying the one block three times is the forward pass
    x = torch.randn(4, 8)
    b = head.block(0)
    assert torch.allclose(head(x), head.out(b(b(b(x)))).squeeze(-1))


def test_zero_init_blocks_are_identity():
    head = AcceptanceHead(8, depth=4, zero_init=True)
    x = torch.randn(3, 8)
    assert torch.allclose(head(x), head.out(x).squeeze(-1))


def test_depth_zero_is_linear():
    head = AcceptanceHead(8, depth=0)
    assert [type(m).__name__ for m in head.modules()][1:] == ["ModuleList", "Linear"]


def test_save_load_round_trip(tmp_path):
    torch.manual_seed(1)
    head = AcceptanceHead(8, depth=2)
    meta = {"drafter_path": "drafters/code", "drafter_hash": "abc123", "w_rej": 6,
            "label_transform": {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, "threshold": 0.7}
    save_head(head, tmp_path / "h", meta)
    loaded, cfg = load_head(tmp_path / "h", expected_hidden_size=8, expected_drafter_hash="abc123")
    x = torch.randn(5, 8)
    assert torch.equal(loaded(x), head(x))
    assert cfg["depth"] == 2 and cfg["w_rej"] == 6 and cfg["threshold"] == 0.7 and not cfg["tie_blocks"]
    assert not loaded.training


def test_tied_round_trip(tmp_path):
    head = AcceptanceHead(8, depth=3, tie_blocks=True)
    save_head(head, tmp_path, {})
    loaded, _ = load_head(tmp_path)
    assert loaded.tie_blocks and torch.equal(loaded(torch.ones(8)), head(torch.ones(8)))


def test_load_errors(tmp_path):
    save_head(AcceptanceHead(8, depth=1), tmp_path, {"drafter_hash": "abc"})
    with pytest.raises(InputError, match="hidden size 8 but the drafter has 16"):
        load_head(tmp_path, expected_hidden_size=16)
    with pytest.raises(InputError, match="drafter hash"):
        load_head(tmp_path, expected_drafter_hash="other")
    with pytest.raises(InputError, match="missing"):
        load_head(tmp_path / "nowhere")
    with pytest.raises(InputError, match="architecture keys"):
        save_head(AcceptanceHead(8, 1), tmp_path / "x", {"depth": 3})


def test_corrupt_files(tmp_path):
    save_head(AcceptanceHead(8, depth=1), tmp_path, {})
    (tmp_path / "head.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(InputError, match="corrupt"):
        load_head(tmp_path)
    save_head(AcceptanceHead(8, depth=1), tmp_path, {})
    cfg = json.loads((tmp_path / "head_config.json").read_text())
    (tmp_path / "head_config.json").write_text(json.dumps({**cfg, "depth": 2}))
    with pytest.raises(InputError, match="do not match its config"):
        load_head(tmp_path)
    (tmp_path / "head_config.json").write_text("{ truncated")
    with pytest.raises(InputError, match="corrupt"):
        load_head(tmp_path)
