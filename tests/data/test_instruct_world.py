
import pytest

from specdraft.core.errors import InputError
from specdraft.data import instruct_world
from specdraft.data.prompts import demo_prompt_sets
from tests.conftest import examples_digest


@pytest.mark.parametrize("domain", instruct_world.ALL_DOMAINS)
def test_deterministic_in_seed_and_no_prompt_in_two_splits(domain):
    a = instruct_world.build_split(domain, "train", 60, seed=3)
    assert examples_digest(a) == examples_digest(instruct_world.build_split(domain, "train", 60, seed=3))
    assert examples_digest(a) != examples_digest(instruct_world.build_split(domain, "train", 60, seed=4))
    splits = {s: {e.prompt for e in instruct_world.build_split(domain, s, n, 0)}
              for s, n in (("train", 150), ("dev", 20), ("test", 20))}
    assert [len(p) for p in splits.values()] == [150, 20, 20]  # distinct within a split
    assert not splits["train"] & splits["dev"] and not splits["train"] & splits["test"]
    assert not splits["dev"] & splits["test"]


def test_requests_read_like_a_users_and_carry_references_where_known():
    (code,) = instruct_world.build_split("code", "test", 1, 0)
    name = code.fields["signature"].split("(")[0]
    assert code.prompt.startswith(f"Write a Python function `{name}(") and code.fields["doc"] in code.prompt
    assert code.response.startswith(f"```python\ndef {name}(")  # the standard library's own implementation
    (math,) = instruct_world.build_split("math", "dev", 1, 0)
    answer = int(math.response.rsplit("Answer: ", 1)[1])
    assert math.prompt.startswith("Solve this math problem step by step.") and f"= {answer}" in math.response
    (summ,) = instruct_world.build_split("summarize", "train", 1, 0)
    assert summ.fields["paragraph"].startswith(summ.response) and "one sentence" in summ.prompt
    kinds = {e.prompt.split()[0] for e in instruct_world.build_split("chat", "train", 100, 0)}
    assert {"Explain", "Give", "Write", "What", "List"} <= kinds
    (tr,) = instruct_world.build_split("translate", "test", 1, 0)
    assert tr.prompt.startswith("Translate the following sentence into French:\n") and tr.response == ""


def test_prompt_sets_reword_the_test_set_and_hold_translate_out():
    sets = demo_prompt_sets(0, ["code", "chat"], ["translate"], 4, 3, 2, world="instruct")
    assert {k: len(v) for k, v in sets.items()} == {"train": 8, "dev": 6, "test": 4, "perturbed": 4, "ood": 2}
    assert all(a != b for a, b in zip(sets["test"]["prompt"], sets["perturbed"]["prompt"]))
    assert set(sets["ood"]["domain"]) == {"translate"}


def test_asking_for_more_distinct_prompts_than_exist_is_one_line():
    with pytest.raises(InputError, match="fewer than 5000 distinct code prompts"):
        instruct_world.build_split("code", "test", 5000, 0)
