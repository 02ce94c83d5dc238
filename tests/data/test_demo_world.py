import hashlib
import json

import datasets
import pytest

from specdraft.data import demo_world
from specdraft.data.prompts import demo_prompt_sets, load_user_prompts, user_prompt_sets
from specdraft.core.errors import InputError


def _digest(examples):
    return hashlib.sha256(json.dumps([(e.id, e.prompt, e.response) for e in examples]).encode()).hexdigest()


@pytest.mark.parametrize("domain", demo_world.ALL_DOMAINS)
def test_deterministic_in_seed(domain):
    a = demo_world.build_split(domain, "train", 30, seed=3)
    b = demo_world.build_split(domain, "train", 30, seed=3)
    c = demo_world.build_split(domain, "train", 30, seed=4)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_eval_prompts_disjoint_from_training_sources():
    for domain in ("translate", "summarize", "spell"):
        train = {e.response for e in demo_world.build_split(domain, "corpus", 400, 0)}
        test = {e.response for e in demo_world.build_split(domain, "test", 50, 0)}
        dev = {e.response for e in demo_world.build_split(domain, "dev", 50, 0)}
        assert not (train & test) and not (train & dev) and not (dev & test)


def test_domain_formats():
    (m,) = demo_world.build_split("math", "train", 1, 0)
    answer = int(m.response.rsplit("Answer: ", 1)[1])
    assert m.prompt.startswith("Question: ") and m.prompt.endswith("Answer:")
    assert f"= {answer}" in m.response  # the worked solution reaches the final answer
    assert demo_world.translate("Return the string.", "Pig Latin") == "Eturnray ethay ingstray."
    assert demo_world.translate("Return the string.", "Backwards") == "nruteR eht gnirts."
    (s,) = demo_world.build_split("summarize", "dev", 1, 0)
    assert s.fields["paragraph"].startswith(s.response.strip())
    (t,) = demo_world.build_split("translate", "test", 1, 0)
    assert t.prompt.startswith("Translate to ") and t.prompt.endswith("=>")


def test_prompt_sets_have_robustness_splits():
    sets = demo_prompt_sets(0, ["math", "code"], ["spell"], 4, 3, 2)
    assert {k: len(v) for k, v in sets.items()} == {"train": 8, "dev": 6, "test": 4, "perturbed": 4, "ood": 2}
    test, pert = sets["test"], sets["perturbed"]
    assert all(a != b for a, b in zip(test["prompt"], pert["prompt"]))  # reworded
    assert list(test["response"]) == list(pert["response"])  # same task underneath
    assert set(sets["ood"]["domain"]) == {"spell"}


def test_user_prompts_jsonl_and_datasets_dir(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "hello", "domain": "greet"}\n\n{"prompt": "bye", "split": "test"}\n')
    rows = load_user_prompts(f)
    assert [r["domain"] for r in rows] == ["greet", "mine"] and rows[1]["split"] == "test"
    d = tmp_path / "ds"
    datasets.Dataset.from_dict({"prompt": ["a", "b"], "domain": ["x", "y"]}).save_to_disk(str(d))
    sets = user_prompt_sets([f, d])
    assert sum(len(v) for v in sets.values()) == 4


def test_user_prompts_bad_input(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(InputError, match="bad.jsonl:2 has no non-empty 'prompt'"):
        load_user_prompts(f)
    f.write_text("not json\n")
    with pytest.raises(InputError, match="bad.jsonl:1 is not valid JSON"):
        load_user_prompts(f)
    with pytest.raises(InputError, match="does not exist"):
        load_user_prompts(tmp_path / "missing.jsonl")
