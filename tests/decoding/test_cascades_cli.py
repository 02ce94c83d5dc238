"""`specdraft generate --cascade RULE --alpha A` and a bundle's default cascade."""
import json

import pytest

from specdraft.decoding.cascades import cascade_method
from specdraft.core.errors import InputError
from specdraft.decoding.generate import generate_text, load_pair
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.pipelines.cli import main
from tests.decoding.test_generate import pair  # noqa: F401  (the seeded tiny target/drafter pair)


def args(pair, *extra):
    return ["generate", "--target", str(pair / "target"), "--drafter", str(pair / "drafter"), "--prompt", "the quick",
            "--max-new-tokens", "8", *extra]


@pytest.mark.parametrize("rule", ["token", "seq_chow"])
def test_generate_runs_a_cascade(pair, capsys, rule):
    assert main(args(pair, "--cascade", rule, "--alpha", "0.3", "--temperature", "1")) == 0
    text, metrics = capsys.readouterr().out.strip().rsplit("\n", 1)
    m = json.loads(metrics)
    assert 1 <= m["N"] <= 8 and m["N_draft"] >= 1


def test_neutral_lossy_cascade_is_plain_speculative_sampling(pair):
    """A lossy cascade at alpha = 0 is plain speculative sampling token for token, on the single-sequence decoder
    cascades run on (the batched decoder, which plain speculation takes, draws its randomness in another order)."""
    import torch

    from specdraft.decoding.generate import Plan, decode_one
    from specdraft.decoding.policies.stopping import FixedK

    tok, tgt, dft, _, _ = load_pair(target=str(pair / "target"), drafter=str(pair / "drafter"))
    t1 = SamplingConfig(temperature=1.0)
    ids = tok("the quick")["input_ids"]
    plain = decode_one(tgt, ids, 16, Plan("drafter", dft, lambda: FixedK(5)), t1, None, torch.Generator().manual_seed(3))
    lossless = decode_one(tgt, ids, 16, Plan("drafter", dft, lambda: FixedK(5), cascade=cascade_method("lossy", 0.0),
                                             cascade_block=5), t1, None, torch.Generator().manual_seed(3))
    assert plain.tokens == lossless.tokens and plain.metrics.n_target == lossless.metrics.n_target


@pytest.mark.parametrize("extra,why", [
    (["--cascade", "opt"], "needs --alpha"),
    (["--cascade", "opt", "--alpha", "0.2"], "temperature > 0"),
    (["--cascade", "best", "--alpha", "0.2", "--temperature", "1"], "unknown cascade rule"),
    (["--alpha", "0.2"], "only read with --cascade"),
    (["--cascade", "lossy", "--alpha", "0.5", "--beta", "0.1", "--temperature", "1"], "beta >= 1 - alpha"),
    (["--cascade", "token", "--alpha", "0.3", "--temperature", "1", "--k", "3"], "give --cascade-block N"),
    (["--cascade-block", "3"], "no cascade decodes"),
    (["--cascade-block", "0"], "argument --cascade-block: must be an integer >= 1"),
])
def test_bad_cascade_settings_exit_2_with_one_line(pair, capsys, extra, why):
    assert main(args(pair, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and "\n" not in err


def test_the_cascade_block_is_its_own_flag(pair, monkeypatch, capsys):
    """--cascade-block sets a cascade's drafts per round (the library's DEFAULT_BLOCK without it), which --help
    states; --k no longer sets it (refused with a cascade, above)."""
    import argparse

    import specdraft.pipelines.generate as g
    from specdraft.decoding.cascades import DEFAULT_BLOCK
    from specdraft.pipelines.generate_args import add_arguments

    seen = []
    real = g.decode_batch
    monkeypatch.setattr(g, "decode_batch", lambda target, prompts, n, plan, *a:
                        seen.append(plan.cascade_block) or real(target, prompts, n, plan, *a))
    cascade = ["--cascade", "token", "--alpha", "0.3", "--temperature", "1"]
    assert main(args(pair, *cascade)) == 0 and main(args(pair, *cascade, "--cascade-block", "3")) == 0
    assert seen == [DEFAULT_BLOCK, 3]
    capsys.readouterr()
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert f"default: {DEFAULT_BLOCK}," in " ".join(p.format_help().split())


def test_generate_text_takes_the_cascade_block_not_k(pair):
    tok, tgt, dft, _, _ = load_pair(target=str(pair / "target"), drafter=str(pair / "drafter"))
    with pytest.raises(InputError, match="pass cascade_block"):
        generate_text(tok, tgt, dft, "the quick", 4, SamplingConfig(temperature=1.0), k=3,
                      cascade=cascade_method("token", 0.3))


def test_bundle_decoding_defaults_can_name_a_cascade():
    """`generate` reads the bundle's decoding.cascade through method_from_spec (absent: none)."""
    from specdraft.decoding.cascades import method_from_spec

    assert method_from_spec({"temperature": 1.0}.get("cascade"), "the bundle's decoding.cascade") is None
    assert method_from_spec({"rule": "opt", "alpha": 0.4}, "the bundle's decoding.cascade") == cascade_method("opt", 0.4)
    with pytest.raises(InputError, match="decoding.cascade must be"):
        method_from_spec({"rule": "opt"}, "the bundle's decoding.cascade")
