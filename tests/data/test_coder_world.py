import ast
import difflib

import pytest

from specdraft.core.errors import InputError
from specdraft.data import coder_world
from specdraft.data.prompts import demo_prompt_sets
from tests.conftest import examples_digest

# what a real-pair run draws per domain (train, dev, test): every split of every domain must hold as many
SIZES = (("train", 160), ("dev", 24), ("test", 16))


@pytest.mark.parametrize("domain", coder_world.ALL_DOMAINS)
def test_deterministic_in_seed_and_distinct_in_every_split(domain):
    a = coder_world.build_split(domain, "train", 40, seed=3)
    assert examples_digest(a) == examples_digest(coder_world.build_split(domain, "train", 40, seed=3))
    assert examples_digest(a) != examples_digest(coder_world.build_split(domain, "train", 40, seed=4))
    splits = {s: [e.prompt for e in coder_world.build_split(domain, s, n, 0)] for s, n in SIZES}
    assert [len(set(p)) for p in splits.values()] == [n for _, n in SIZES]  # enough, and distinct within a split
    assert not set(splits["train"]) & set(splits["dev"]) and not set(splits["dev"]) & set(splits["test"])


@pytest.mark.parametrize("domain", coder_world.ALL_DOMAINS)
def test_every_prompt_renders_short_and_its_rephrasings_differ(domain):
    for split, n in SIZES:
        for e in coder_world.build_split(domain, split, n, 0):
            forms = [e.prompt] + [coder_world.render_prompt(domain, e.fields, i)
                                  for i in range(len(coder_world.REPHRASINGS[domain]))]
            assert len(set(forms)) == len(forms)  # the perturbed set rewords every prompt
            assert all(str(v) in form for v in e.fields.values() for form in forms)  # and keeps what it embeds
            # ~450 tokens of a code tokenizer at 3.5 characters a token, the request included
            assert max(map(len, forms)) <= coder_world.MAX_CHARS + 110


def test_requests_read_like_a_coder_models_and_carry_references():
    for e in coder_world.build_split("write", "dev", 24, 0):
        name = e.fields["signature"].split("(")[0]
        assert e.prompt.startswith(f"Write a Python function `{name}(") and e.fields["doc"] in e.prompt
        assert e.response.startswith(f"```python\ndef {name}(")  # the standard library's own implementation
    for e in coder_world.build_split("explain", "dev", 24, 0):
        code = e.fields["code"]
        node = ast.parse(code).body[0]
        assert ast.get_docstring(node) is None  # the code to explain, without the answer beside it
        assert e.prompt.startswith("Explain what this Python function does.") and f"```python\n{code}\n```" in e.prompt
    functions = {f.source: f for f in coder_world.stdlib_code()}
    for e in coder_world.build_split("tests", "test", 16, 0):  # module-level functions: no class to build first
        assert not functions[e.fields["code"]].method and ast.unparse(ast.parse(e.fields["code"]).body[0].args)
        assert e.response == ""
    math = coder_world.build_split("math", "dev", 5, 0)
    assert all(f"= {m.response.rsplit('Answer: ', 1)[1]}" in m.response for m in math)


def test_a_fix_prompt_holds_one_swapped_token_and_still_parses():
    for e in coder_world.build_split("fix", "test", 16, 0):
        buggy, fixed = e.fields["code"], e.response.removeprefix("```python\n").removesuffix("\n```")
        ast.parse(buggy)
        changed = [line for line in difflib.ndiff(fixed.splitlines(), buggy.splitlines()) if line[:1] in "+-"]
        assert len(changed) == 2  # one line out, one in
        old, new = changed[0][2:].split(), changed[1][2:].split()
        assert len(old) == len(new) and sum(a != b for a, b in zip(old, new)) == 1
        assert e.prompt.startswith("This Python function has a bug.")


def test_prompt_sets_hold_fix_out_as_the_ood_set():
    sets = demo_prompt_sets(0, list(coder_world.DOMAINS), list(coder_world.HELDOUT_DOMAINS), 4, 3, 2, world="coder")
    assert {k: len(v) for k, v in sets.items()} == {"train": 16, "dev": 12, "test": 8, "perturbed": 8, "ood": 2}
    assert set(sets["ood"]["domain"]) == {"fix"} and "fix" not in set(sets["train"]["domain"])
    assert len(coder_world.DOMAINS) >= 4 and "math" in coder_world.DOMAINS  # one domain that is not code


def test_asking_for_more_distinct_prompts_than_exist_is_one_line():
    with pytest.raises(InputError, match="fewer than 5000 distinct write prompts for split 'test'"):
        coder_world.build_split("write", "test", 5000, 0)
