"""The quality world (data/quality_world.py): deterministic in its seed, disjoint splits, right answers, and
the scorers (data/quality.py) on hand-computed cases of its three answer forms."""
import hashlib
import json
import random
import re

import pytest

from specdraft.core.errors import InputError
from specdraft.data import quality_world as qw
from specdraft.data.prompts import demo_prompt_sets
from specdraft.data.quality import PRIMARY_METRIC, score
from specdraft.pipelines.schema import DemoSection


def _digest(examples):
    return hashlib.sha256(json.dumps([(e.id, e.prompt, e.response) for e in examples]).encode()).hexdigest()


@pytest.mark.parametrize("domain", qw.DOMAINS)
def test_same_seed_same_examples_other_seed_other_examples(domain):
    a = qw.build_split(domain, "train", 20, seed=3)
    assert _digest(a) == _digest(qw.build_split(domain, "train", 20, seed=3))
    other = qw.build_split(domain, "train", 20, seed=4)
    assert _digest(a) != _digest(other)
    assert not {e.prompt for e in a} & {e.prompt for e in other}  # not a shuffle of the same prompts either


@pytest.mark.parametrize("domain", qw.DOMAINS)
def test_splits_are_disjoint(domain):
    seen = {s: {e.prompt for e in qw.build_split(domain, s, n, 0)}
            for s, n in (("corpus", 600), ("train", 200), ("dev", 60), ("test", 60))}
    training = seen["corpus"] | seen["train"]
    assert not training & seen["dev"] and not training & seen["test"] and not seen["dev"] & seen["test"]
    assert len(seen["test"]) == 60  # and no duplicate evaluation prompts


def test_worked_arithmetic_reaches_the_true_total():
    for seed in range(5):
        for e in qw.build_split("math", "train", 60, seed):
            q = e.fields["question"]
            answer = int(e.response.rsplit("Answer: ", 1)[1])
            assert answer == qw.running_total(q)
            steps = re.findall(r"Step (\d+): (\d+) ([+-]) (\d+) = (\d+)\.", e.response)
            assert len(steps) == len(re.findall(r"Step \d+: (?:add|subtract)", q)) >= qw.MATH_STEPS[0]
            total = int(re.search(r"Start with (\d+)", q).group(1))
            for i, (n, a, op, b, r) in enumerate(steps, 1):  # every worked line is right and chains on
                assert (int(n), int(a)) == (i, total)
                total = int(a) + int(b) if op == "+" else int(a) - int(b)
                assert int(r) == total and qw.MATH_RANGE[0] <= total <= qw.MATH_RANGE[1]
            assert total == answer


def test_running_total_by_hand():
    assert qw.running_total("Start with 17. Step 1: add 5. Step 2: subtract 3. Step 3: add 9. What?") == 28


def test_translation_is_the_word_cipher():
    assert qw.to_zorbic("the red fox sees a old owl, a bird helps the king.") == \
        "lo vermo rinka vidas ka grat hupo, ka pilo helpas lo rajo."
    assert len(set(qw.LEXICON.values())) == len(qw.LEXICON)  # invertible: no two words share a cipher word
    inverse = {v: k for k, v in qw.LEXICON.items()}
    for e in qw.build_split("translate", "dev", 20, 0):
        back = " ".join(inverse[w.rstrip(",.")] + w[len(w.rstrip(",.")):] for w in e.response.split())
        assert back == e.fields["sentence"] and "\n" not in e.response  # one line: the scorer reads the first


def test_summary_keeps_each_sentence_core():
    for e in qw.build_split("summarize", "test", 20, 0):
        full = re.findall(r"(\w+) (\w+) the \w+ (\w+) to (\w+) (?:in|at|by|on) the \w+\.", e.fields["paragraph"])
        assert e.response == " " + " ".join(f"{g} {v} the {t} to {r}." for g, v, t, r in full)
        assert len(full) >= qw.SUMMARY_SENTENCES[0] and "\n" not in e.response


def test_answers_are_long():
    """Generations of 128+ tokens amortise a bandit's first pass over its drafters: answers are long (in
    words here; the tokenizer gives a token per word and per punctuation mark)."""
    for domain in qw.DOMAINS:
        words = [len(e.response.split()) for e in qw.build_split(domain, "dev", 20, 0)]
        assert min(words) >= 65, (domain, min(words))


def test_unknown_domain_and_prompt_sets():
    with pytest.raises(ValueError, match="unknown quality-world domain 'code'"):
        qw.build_split("code", "train", 1, 0)
    sets = demo_prompt_sets(0, list(qw.DOMAINS), [], 3, 2, 2, world="quality")
    assert {k: len(v) for k, v in sets.items()} == {"train": 9, "dev": 6, "test": 6, "perturbed": 6, "ood": 0}
    assert sets["test"]["prompt"][0].startswith("Question: Start with ")  # the demo's math template
    assert list(sets["test"]["response"]) == list(sets["perturbed"]["response"])


def test_config_names_the_worlds_domains():
    DemoSection(world="quality", domains=["math", "translate", "summarize"], heldout_domains=[]).check()
    with pytest.raises(InputError, match="'code' does not exist in the quality world"):
        DemoSection(world="quality", domains=["math", "code"], heldout_domains=[]).check()
    with pytest.raises(InputError, match="'spell' does not exist in the quality world"):
        DemoSection(world="quality", domains=["math"]).check()  # the demo's held-out default is not this world's


# --- the scorers on hand-computed cases of the three answer forms -------------------------------------------


def test_math_exact_match_reads_the_answer_line():
    (e,) = qw.build_split("math", "test", 1, 0)
    assert score("math", e.response, e.response) == {"exact_match": 100.0}
    slipped = e.response.rsplit("Answer: ", 1)[0] + f"Answer: {int(e.response.rsplit(' ', 1)[1]) + 1}"
    assert score("math", slipped, e.response) == {"exact_match": 0.0}


def test_translate_bleu_by_hand():
    ref = " ka vermo pilo gardas lo pik drava pesh lo bebo"
    hyp = " ka vermo pilo gardas ka pik drava pesh lo bebo"  # the 5th word wrong
    # clipped n-gram precisions 9/10, 7/9, 5/8, 3/7 (same length: no brevity penalty)
    expected = 100 * (9 / 10 * 7 / 9 * 5 / 8 * 3 / 7) ** 0.25
    assert score("translate", hyp, ref)["bleu"] == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(65.804, abs=1e-3)


def test_summarize_rouge2_by_hand():
    ref = " Ava gave the map to Ben. Kai sent the cup to Ella."
    hyp = " Ava gave the map to Ben. Kai sent the hat to Ella.\nSummarize: the next one"
    # 12 tokens, 11 bigrams each; the cup/hat swap breaks "the cup" and "cup to": 9 of 11 shared
    assert score("summarize", hyp, ref)["rouge2"] == pytest.approx(100 * 9 / 11)
    assert PRIMARY_METRIC["summarize"] == "rouge2"


def test_every_domain_reference_scores_perfectly_against_itself():
    rng = random.Random(0)
    for domain in qw.DOMAINS:
        fields, response = qw.GENERATORS[domain](rng)
        assert score(domain, response, response)[PRIMARY_METRIC[domain]] == pytest.approx(100.0)
