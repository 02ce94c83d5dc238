"""Transform tags and matching: how heads are paired with the transform the decoder serves with."""
import pytest
import torch

from specdraft.decoding.rounds.sampling import SamplingConfig


def test_tags_name_the_transform():
    assert SamplingConfig(0.0).tag == "greedy"
    assert SamplingConfig(1.0).tag == "T1"
    assert SamplingConfig(0.7, 50, 0.9).tag == "T0.7_k50_p0.9"
    assert SamplingConfig(0.7, 0, 1.0).as_dict() == {"temperature": 0.7, "top_k": 0, "top_p": 1.0}


def test_matching_a_recorded_transform():
    assert SamplingConfig(1.0).matches({"temperature": 1.0, "top_k": 0, "top_p": 1.0})
    assert not SamplingConfig(1.0).matches({"temperature": 0.7, "top_k": 0, "top_p": 1.0})
    assert not SamplingConfig(1.0, 20).matches({"temperature": 1.0, "top_k": 0, "top_p": 1.0})
    # greedy ignores top-k / top-p, so every greedy transform is the same one
    assert SamplingConfig(0.0).matches({"temperature": 0.0, "top_k": 40, "top_p": 0.9})


@pytest.mark.parametrize("cfg", [SamplingConfig(0.0), SamplingConfig(0.7, top_k=5, top_p=0.9)])
def test_probs_on_cpu_is_probs_moved_to_cpu(cfg):
    from specdraft.decoding.rounds.sampling import probs, probs_on_cpu

    logits = torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(0))
    got = probs_on_cpu(logits, cfg)
    assert got.device.type == "cpu" and got.dtype == torch.float32
    assert torch.equal(got, probs(logits, cfg).cpu())
