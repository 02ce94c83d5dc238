"""benchmarks/real/bench_bf16_equality.py on a tiny Llama pair (printed only: the RESULTS page stays as it was): every
prompt is counted once per decode, equal or diverged, and no divergence of a correct decoder fails the near-tie
test; on this CPU, where the decoder's floor covers the widths that compute alike, every prompt decodes equal, and the
floor's cost is timed beside it."""
import re

import datasets

from tests.conftest import import_benchmark


def test_every_prompt_is_equal_or_a_near_tie_alone_and_in_a_batch(tmp_path):
    bench = import_benchmark("bench_bf16_equality")
    backends = import_benchmark("bench_distill_backends")
    target = backends.demo_shaped_target(2, tmp_path / "target")
    drafter = type(target)(target.config).eval()  # random weights: it drafts badly, so most tokens come from verifies
    drafter.save_pretrained(tmp_path / "drafter")
    rows = [{"id": f"r{i}", "domain": "fix", "prompt": " ".join(f"w{i + j}" for j in range(3 + i)), "messages": ""}
            for i in range(4)]
    datasets.DatasetDict({"ood": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "sets"))
    text = bench.main(["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter"),
                       "--prompt-set", str(tmp_path / "sets"), "--n-prompts", "4", "--tokens", "12", "--k", "3",
                       "--batch", "2", "--floor-cost", "1", "--no-append"])
    counts = {m.group(1): tuple(map(int, m.groups()[1:])) for m in
              re.finditer(r"^\| (B = \d) \| (\d+) \| (\d+) \(\d+%\) \| (\d+) \| (\d+) \|", text, re.M)}
    assert set(counts) == {"B = 1", "B = 2"}
    for name, (prompts, equal, near, other) in counts.items():
        assert prompts == 4 and equal + near + other == 4, name
        assert other == 0, text  # a divergence beyond bf16's rounding would be a decoder bug
        assert equal == 4, text  # at the floor: equal by construction
    assert "the decoder's floor at batch 1: 4 positions (every width from it alike)" in text
    assert re.search(r"The floor's cost, .* floor / one \d\.\d{3} \[", text), text
    assert "Goal (equal on at least 95% of prompts, every divergence a near-tie):" in text


def test_the_served_int8_drafter_is_judged_as_the_stages_load_it(tmp_path):
    bench = import_benchmark("bench_bf16_equality")
    backends = import_benchmark("bench_distill_backends")
    target = backends.demo_shaped_target(2, tmp_path / "target")
    type(target)(target.config).save_pretrained(tmp_path / "drafter")
    rows = [{"id": f"r{i}", "domain": "fix", "prompt": f"w{i} w{i + 1} w{i + 2}", "messages": ""} for i in range(2)]
    datasets.DatasetDict({"ood": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "sets"))
    text = bench.main(["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter"),
                       "--prompt-set", str(tmp_path / "sets"), "--n-prompts", "2", "--tokens", "10", "--k", "3",
                       "--draft-weights", "int8", "--no-append"])
    assert "--draft-weights int8`" in text and "; the drafter int8)" in text
    found = re.search(r"^\| B = 1 \| 2 \| (\d+) \(\d+%\) \| (\d+) \| (\d+) \|", text, re.M)
    assert found and int(found.group(3)) == 0, text  # int8 drafts change what is proposed, never what is kept


def test_an_eagle3_drafter_is_judged_through_the_targets_features(tmp_path):
    """The pair's EAGLE-3 drafter (vLLM's layout) is judged as a bundle serves it: attached to the bf16 target, whose
    features it reads at every round; a drafter trained for another target is refused before any decode."""
    import pytest

    from specdraft.core.errors import InputError
    from specdraft.decoding.speculators.eagle_model import new_eagle_drafter, save_eagle, target_dir_hash

    bench = import_benchmark("bench_bf16_equality")
    backends = import_benchmark("bench_distill_backends")
    target = backends.demo_shaped_target(3, tmp_path / "target")
    save_eagle(new_eagle_drafter(target.config, "eagle3", target_hash=target_dir_hash(tmp_path / "target"),
                                 draft_ids=list(range(64))), tmp_path / "eagle")
    rows = [{"id": f"r{i}", "domain": "fix", "prompt": f"w{i} w{i + 1} w{i + 2}", "messages": ""} for i in range(3)]
    datasets.DatasetDict({"ood": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "sets"))
    args = ["--prompt-set", str(tmp_path / "sets"), "--n-prompts", "3", "--tokens", "10", "--k", "3", "--no-append"]
    text = bench.main(["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "eagle"), "--batch", "3"]
                      + args)
    assert "; an EAGLE drafter, chain)" in text
    for name in ("B = 1", "B = 3"):
        found = re.search(rf"^\| {name} \| 3 \| (\d+) \(\d+%\) \| (\d+) \| (\d+) \|", text, re.M)
        assert found and int(found.group(3)) == 0, text  # a divergence beyond bf16's rounding: a decoder bug
    backends.demo_shaped_target(4, tmp_path / "other")  # another target: its files hash otherwise
    with pytest.raises(InputError, match="trained for target"):
        bench.main(["--target", str(tmp_path / "other"), "--drafter", str(tmp_path / "eagle")] + args)
    with pytest.raises(SystemExit) as stop:
        bench.main(["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "eagle"),
                    "--draft-weights", "int8"] + args)
    assert stop.value.code == 2
