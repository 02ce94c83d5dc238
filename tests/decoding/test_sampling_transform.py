"""Transform tags and matching: how heads are paired with the transform the decoder serves with."""
from decoding.sampling import SamplingConfig


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
