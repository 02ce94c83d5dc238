"""The quality world (data/quality_world.py): deterministic in its seed, disjoint splits, right answers, and
the scorers (data/quality.py) on hand-computed cases of its three answer forms."""
import random
import re

import pytest

from specdraft.core.errors import InputError
from specdraft.data import quality_world as qw
from specdraft.data.prompts import demo_prompt_sets
from tests.conftest import examples_digest
from specdraft.data.quality import PRIMARY_METRIC, score
from specdraft.pipelines.schema import DemoSection


@pytest.mark.parametrize("domain", qw.DOMAINS)
def test_same_seed_same_examples_other_seed_other_examples(domain):
    a = qw.build_split(domain, "train", 20, seed=3)
    assert examples_digest(a) == examples_digest(qw.build_split(domain, "train", 20, seed=3))
    other = qw.build_split(domain, "train", 20, seed=4)
    assert examples_digest(a) != examples_digest(other)
    assert {e.prompt for e in a} != {e.prompt for e in other}  # not a shuffle of the same prompts either


@pytest.mark.parametrize("domain", qw.DOMAINS)
def test_splits_are_disjoint(domain):
    seen = {s: {e.prompt for e in qw.build_split(domain, s, n, 0)}
            for s, n in (("corpus", 600), ("train", 200), ("dev", 40), ("test", 20))}
    training = seen["corpus"] | seen["train"]
    assert not training & seen["dev"] and not training & seen["test"] and not seen["dev"] & seen["test"]
    assert len(seen["test"]) == 20  # and no duplicate evaluation prompts
    with pytest.raises(InputError, match="fewer than 500 distinct .* lower demo.test_per_domain"):
        qw.build_split(domain, "test", 500, 0)  # each evaluation pool is finite: said, not looped over
    assert len(qw.build_split(domain, "corpus", 1500, 0)) == 1500  # training documents may repeat a prompt


def test_worked_arithmetic_reaches_the_true_total():
    for seed in range(5):
        for e in qw.build_split("math", "train", 60, seed):
            q = e.fields["question"]
            answer = int(e.response.rsplit("Answer: ", 1)[1].replace(" ", ""))
            assert answer == qw.final_value(q)
            steps = re.findall(r"Step (\d+): ([\d ]+) \+ (\d) = ([\d ]+)\.", e.response)
            assert len(steps) == qw.STEPS
            total = int(re.search(r"starting at ([\d ]+)\?$", q).group(1).replace(" ", ""))
            for i, (n, a, b, r) in enumerate(steps, 1):  # every worked line is right and chains on
                assert (int(n), int(a.replace(" ", ""))) == (i, total)
                total += int(b)
                assert r == " ".join(str(total)) and 100 <= total <= 999  # one token per digit, three digits
            assert total == answer


def test_final_value_by_hand():
    assert qw.final_value("Add 7, 16 times. Where do you end, starting at 3 8 4?") == 384 + 7 * 16 == 496


def test_translation_writes_the_count_in_zorbic_digits():
    assert qw.to_zorbic(391) == "tri-nau-un" and qw.to_zorbic(16) == "un-ses"
    (e,) = qw.build_split("translate", "dev", 1, 0)
    step, start = re.search(r"count up by (\d), \d+ times, from ([\d ]+)$", e.fields["sentence"]).groups()
    start, step = int(start.replace(" ", "")), int(step)
    digits = {w: str(i) for i, w in enumerate(qw.ZORBIC_DIGITS)}
    pairs = e.response.strip(" .").split(" , ")
    assert len(pairs) == qw.STEPS + 1 and "\n" not in e.response  # one line: the scorer reads the first
    for i, pair in enumerate(pairs):  # pair 0: the start
        index, value = pair.split(" es ")
        assert int("".join(digits[w] for w in index.split("-"))) == i
        assert int("".join(digits[w] for w in value.split("-"))) == start + step * i


def test_summary_is_the_counters_log():
    (e,) = qw.build_split("summarize", "test", 1, 0)
    step, start = re.search(r"up by (\d) .* starts at ([\d ]+)\.$", e.fields["paragraph"]).groups()
    start, step = int(start.replace(" ", "")), int(step)
    assert e.response.startswith(f" at start the counter shows {qw.spaced(start)} ;")
    log = re.findall(r"at (tick|tock) (\d+) the counter shows ([\d ]+) ;", e.response)
    assert [(ev, int(i), int(v.replace(" ", ""))) for ev, i, v in log] == \
        [(("tick", "tock")[(i - 1) % 2], i, start + step * i) for i in range(1, qw.STEPS + 1)]
    assert "\n" not in e.response


def test_answers_are_long():
    """Generations of 128+ tokens amortise a bandit's first pass over its drafters: answers are long (in
    words here; the tokenizer gives a token per word and per punctuation mark)."""
    for domain in qw.DOMAINS:
        words = [len(e.response.split()) for e in qw.build_split(domain, "dev", 20, 0)]
        assert min(words) >= 60, (domain, min(words))


def test_unknown_domain_and_prompt_sets():
    with pytest.raises(ValueError, match="unknown quality-world domain 'code'"):
        qw.build_split("code", "train", 1, 0)
    sets = demo_prompt_sets(0, list(qw.DOMAINS), [], 3, 2, 2, world="quality")
    assert {k: len(v) for k, v in sets.items()} == {"train": 9, "dev": 6, "test": 6, "perturbed": 6, "ood": 0}
    assert sets["test"]["prompt"][0].startswith("Question: Add 7, ")  # the demo's math template
    assert list(sets["test"]["response"]) == list(sets["perturbed"]["response"])


def test_config_names_the_worlds_domains():
    DemoSection(world="quality", domains=["math", "translate", "summarize"], heldout_domains=[]).check()
    with pytest.raises(InputError, match="'code' does not exist in the quality world"):
        DemoSection(world="quality", domains=["math", "code"], heldout_domains=[]).check()
    with pytest.raises(InputError, match="'spell' does not exist in the quality world"):
        DemoSection(world="quality", domains=["math"]).check()  # the demo's held-out default is not this world's


# --- the scorers on hand-computed cases of the three answer forms -------------------------------------------


def test_math_exact_match_reads_the_answer_line():
    ref = " Step 1: 3 8 4 + 7 = 3 9 1. We end at 3 9 1.\nAnswer: 3 9 1"
    assert score("math", ref, ref) == {"exact_match": 100.0}
    assert score("math", " We end at 3 9 1.\nAnswer: 391\nQuestion: next", ref) == {"exact_match": 100.0}
    assert score("math", " We end at 3 9 2.\nAnswer: 3 9 2", ref) == {"exact_match": 0.0}
    assert score("math", " We end at 3 9 1.\nAnswer: 3 9", ref) == {"exact_match": 0.0}  # a digit short


def test_translate_bleu_by_hand():
    ref = " un es tri ok kvar du es tri nau un"
    hyp = " un es tri ok un du es tri nau un"  # the 5th word wrong ("un" is in the reference once more)
    # clipped n-gram precisions 9/10, 7/9, 5/8, 3/7 (same length: no brevity penalty)
    expected = 100 * (9 / 10 * 7 / 9 * 5 / 8 * 3 / 7) ** 0.25
    assert score("translate", hyp, ref)["bleu"] == pytest.approx(expected, abs=1e-6)
    assert expected == pytest.approx(65.804, abs=1e-3)


def test_summarize_rouge2_by_hand():
    ref = " at tick 1 the counter shows 3 9 1 ;"
    hyp = " at tick 1 the counter shows 3 8 1 ;\nSummarize: the next one"
    # 9 tokens (";" is dropped), 8 bigrams each; the wrong tens digit breaks "3 9" and "9 1": 6 of 8 shared
    assert score("summarize", hyp, ref)["rouge2"] == pytest.approx(100 * 6 / 8)
    assert PRIMARY_METRIC["summarize"] == "rouge2"


def test_every_domain_reference_scores_perfectly_against_itself():
    rng = random.Random(0)
    for domain in qw.DOMAINS:
        fields, response = qw.GENERATORS[domain](rng)
        assert score(domain, response, response)[PRIMARY_METRIC[domain]] == pytest.approx(100.0)
