"""Task quality of decoded text against the prompt sets' references (the `response` column).

Cascades trade quality for speed (Faster Cascades via Speculative Decoding, Sec. 6: BLEU for WMT,
ROUGE-2 for XSum / CNNDM), so every decoding method is scored the same way, the target alone included:

  math       exact match of the number on the first `Answer: N` line (N may be written "4 8 2")
  translate  exact match of the first line, and sentence / corpus BLEU (sacrebleu)
  summarize  exact match of the first line, and ROUGE-2 F1 (rouge-score, Porter stemming)
  code       exact match of the first non-empty line (indentation kept), and BLEU of the prediction cut
             to as many non-empty lines as the reference has

A model keeps writing after the answer until EOS or the token limit (often a next example), so each
scorer cuts the prediction to the span the reference covers before comparing. All numbers are 0-100.

    score("translate", prediction, reference)       -> {"exact_match": 100.0, "bleu": 100.0}
    score_set("translate", predictions, references) -> means, with corpus BLEU instead of the mean
    PRIMARY_METRIC[domain]                          -> the one number a quality-latency plot uses
"""
from __future__ import annotations

import importlib
import re
from functools import lru_cache

from specdraft.core.errors import InputError

PRIMARY_METRIC = {"math": "exact_match", "translate": "bleu", "summarize": "rouge2", "code": "bleu"}
SCORED_DOMAINS = tuple(PRIMARY_METRIC)

# a number: digits, optionally with commas ("1,234") and single spaces ("4 8 2": the quality world writes its digits
# one token each) between them, and a decimal part; or a bare decimal (".5")
_ANSWER = re.compile(r"Answer:\s*(-?\d[\d,]*(?: \d+)*(?:\.\d+)?|-?\.\d+)")


def _check_domain(domain: str) -> None:
    if domain not in PRIMARY_METRIC:
        raise InputError(f"no quality scorer for domain {domain!r}; scored domains: {', '.join(SCORED_DOMAINS)}")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _code_lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def require_scorers() -> None:
    """Import the scorers' packages now, so that a stage which scores only after a long run fails at its
    start: InputError naming the package to install."""
    for module, package in (("rouge_score", "rouge-score"), ("sacrebleu", "sacrebleu")):
        try:
            importlib.import_module(module)
        except ImportError:
            raise InputError(f"scoring task quality needs the {package} package, which is not installed: "
                             f"pip install {package} (make install installs every dependency)") from None


def math_answer(text: str) -> str | None:
    """The number on the first `Answer:` line (commas and the spaces between digits dropped), None when there is none."""
    m = _ANSWER.search(text)
    return m.group(1).replace(",", "").replace(" ", "") if m else None


@lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)


def _bleu(prediction: str, reference: str) -> float:
    import sacrebleu

    return float(sacrebleu.sentence_bleu(prediction, [reference]).score)


def _corpus_bleu(predictions: list[str], references: list[str]) -> float:
    import sacrebleu

    return float(sacrebleu.corpus_bleu(predictions, [references]).score)


def clipped(domain: str, prediction: str, reference: str) -> tuple[str, str]:
    """(prediction, reference) cut to the span that is compared (see the module docstring)."""
    _check_domain(domain)
    if domain == "code":
        want = _code_lines(reference)
        return "\n".join(_code_lines(prediction)[: max(1, len(want))]), "\n".join(want)
    if domain == "math":
        return prediction, reference
    return _first_line(prediction), _first_line(reference)


def score(domain: str, prediction: str, reference: str) -> dict[str, float]:
    """Quality of one decoded continuation against its reference, 0-100 per metric."""
    pred, ref = clipped(domain, prediction, reference)
    if domain == "math":
        want = math_answer(ref)
        if want is None:
            raise InputError(f"math reference has no 'Answer: N' line: {reference[:60]!r}; check the prompt set")
        return {"exact_match": 100.0 * (math_answer(pred) == want)}
    if domain == "code":
        p_lines, r_lines = pred.splitlines(), ref.splitlines()
        first_ok = bool(p_lines) and bool(r_lines) and p_lines[0] == r_lines[0]
        return {"exact_match": 100.0 * first_ok, "bleu": _bleu(pred, ref)}
    out = {"exact_match": 100.0 * (pred == ref)}
    if domain == "translate":
        out["bleu"] = _bleu(pred, ref)
    else:  # summarize
        out["rouge2"] = 100.0 * _rouge().score(ref, pred)["rouge2"].fmeasure
    return out


def score_set(domain: str, predictions: list[str], references: list[str]) -> dict[str, float]:
    """Mean of `score` over a set (plus n), with BLEU as corpus BLEU over the clipped texts."""
    if len(predictions) != len(references):
        raise InputError(f"{len(predictions)} predictions but {len(references)} references; pass one of each")
    if not predictions:
        raise InputError("nothing to score: pass at least one prediction")
    rows = [score(domain, p, r) for p, r in zip(predictions, references)]
    out = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    if "bleu" in out:
        pairs = [clipped(domain, p, r) for p, r in zip(predictions, references)]
        out["bleu"] = _corpus_bleu([p for p, _ in pairs], [r for _, r in pairs])
    out["n"] = float(len(rows))
    return out
