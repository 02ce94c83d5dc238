"""Task quality scorers (data/quality.py) on hand-made predictions and on the demo world's references."""
import sys

import pytest

from specdraft.data.quality import PRIMARY_METRIC, math_answer, score, score_set
from specdraft.core.errors import InputError


def test_math_scores_the_first_answer_line():
    ref = " Omar has 53 + 20 = 73 coins. Together they have 53 + 73 = 126 coins.\nAnswer: 126"
    assert score("math", " 53 + 73 = 126.\nAnswer: 126\nQuestion: next one\nAnswer: 7", ref) == {"exact_match": 100.0}
    assert score("math", " Together 125.\nAnswer: 125", ref) == {"exact_match": 0.0}
    assert score("math", " no answer line at all", ref) == {"exact_match": 0.0}
    assert math_answer("Answer: 1,234") == "1234"


def test_translate_cuts_to_the_first_line_and_scores_bleu():
    ref = " Isthay ethodmay illway eturnray ormallynay."
    perfect = score("translate", ref + "\nTranslate to Pig Latin: something else", ref)
    assert perfect == {"exact_match": 100.0, "bleu": pytest.approx(100.0)}
    close = score("translate", " Isthay ethodmay illway eturnray abnormallynay.", ref)
    assert close["exact_match"] == 0.0 and 20.0 < close["bleu"] < 100.0
    assert score("translate", " entirely different words here", ref)["bleu"] < 10.0


def test_summarize_scores_rouge2():
    ref = " Make a (symbolic) link called targetpath."
    assert score("summarize", ref, ref) == {"exact_match": 100.0, "rouge2": pytest.approx(100.0)}
    partial = score("summarize", " Make a link called targetpath quickly.", ref)
    assert 0.0 < partial["rouge2"] < 100.0 and partial["exact_match"] == 0.0
    assert score("summarize", " Return the value.", ref)["rouge2"] == 0.0


def test_code_first_line_keeps_indentation_and_bleu_clips_to_the_reference_length():
    ref = "\n    else:\n        return pattern == '**'"
    extra = "\n    else:\n        return pattern == '**'\n\ndef other():\n    pass"
    assert score("code", extra, ref) == {"exact_match": 100.0, "bleu": pytest.approx(100.0)}
    assert score("code", "\nelse:\n        return pattern == '**'", ref)["exact_match"] == 0.0  # indentation
    wrong = score("code", "\n    return None", ref)
    assert wrong["exact_match"] == 0.0 and wrong["bleu"] < 50.0


def test_aggregate_uses_corpus_bleu_and_means():
    refs = [" Isthay isway away entencesay.", " Anotherway entencesay erehay."]
    preds = [refs[0], " Anotherway ordway erehay."]
    agg = score_set("translate", preds, refs)
    assert agg["exact_match"] == 50.0 and agg["n"] == 2.0 and 0.0 < agg["bleu"] < 100.0
    with pytest.raises(InputError, match="predictions but"):
        score_set("translate", preds, refs[:1])


def test_unknown_domain_is_one_line_input_error():
    with pytest.raises(InputError, match="no quality scorer for domain 'chat'"):
        score("chat", "a", "b")


# references as the demo prompt sets store them (the `response` column of runs/<run>/prompts/sets)
DEMO_REFERENCES = {
    "code": "\n    else:\n        return pattern == '**'",
    "math": " Omar has 53 + 20 = 73 coins. Together they have 53 + 73 = 126 coins.\nAnswer: 126",
    "translate": " Isthay ethodmay illway eturnray ormallynay ifway ethay authenticationway asway uccessfulsay.",
    "summarize": " Make a (symbolic) link called targetpath.",
}


@pytest.mark.parametrize("domain", list(PRIMARY_METRIC))
def test_every_demo_reference_scores_perfectly_against_itself(domain):
    result = score(domain, DEMO_REFERENCES[domain], DEMO_REFERENCES[domain])
    assert all(v == pytest.approx(100.0) for v in result.values()), result
    assert PRIMARY_METRIC[domain] in result


def test_a_missing_scorer_package_is_named_with_its_fix(monkeypatch):
    from specdraft.data.quality import require_scorers

    require_scorers()  # installed here: nothing raised
    monkeypatch.setitem(sys.modules, "rouge_score", None)  # import now raises ImportError, as when not installed
    with pytest.raises(InputError, match="pip install rouge-score"):
        require_scorers()
