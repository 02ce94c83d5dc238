"""benchmarks/training/bench_distill_speed.py on a tiny Llama pair (printed only: the RESULTS page stays as it was):
every backend answers every prompt, and in fp32 the decoder's answers, alone and speculative, are hf's token for
token."""
import re

from tests.conftest import import_benchmark


def test_every_backend_answers_as_hf_does_in_fp32(tmp_path):
    bench = import_benchmark("bench_distill_speed")
    backends = import_benchmark("bench_distill_backends")
    target = backends.demo_shaped_target(2, tmp_path / "target")
    drafter = type(target)(target.config).eval()  # random weights (after the target's seeded init): lossless, the answers are still the target's
    drafter.save_pretrained(tmp_path / "drafter")
    text = bench.main(["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter"), "--k", "3",
                       "--n-prompts", "4", "--batch", "2", "--tokens", "8", "--passes", "1", "--no-compile",
                       "--no-append"])
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(r"^\| ([^|]+?) \| (\d+) \| .* \| (\d+)/(\d+) \|$", text,
                                                            re.M)}
    assert set(rows) == {"hf", "decoder eager", "decoder K=3 eager"}
    for name, (tokens, same, total) in rows.items():
        assert int(tokens) == int(rows["hf"][0]) > 0, name  # the same answers, so as many tokens
        assert (int(same), int(total)) == (4, 4), name
