"""Prompt templates per demo domain, and the fixed rephrasings used for the robustness sets.

A template turns an example's fields into the prompt text; the target's answer follows the prompt
directly (the response starts with a space). The rephrasings say the same thing in other words: a
router that learned the surface form of the canonical template should stumble on them, a bandit that
measures acceptance online should not (MetaSD §4.3).
"""
from __future__ import annotations

TEMPLATES: dict[str, str] = {
    "code": "Complete this Python function from the {module} module:\n{head}",
    "math": "Question: {question}\nAnswer:",
    "translate": "Translate to {lang}: {sentence} =>",
    "summarize": "Summarize: {paragraph}\nSummary:",
    "chat": "User: {message}\nAssistant:",
    "spell": "Spell the word '{word}' letter by letter:",
}

REPHRASINGS: dict[str, list[str]] = {
    "code": [
        "Here is the start of a function ({module}). Write the rest.\n{head}",
        "# finish the implementation below, taken from {module}\n{head}",
    ],
    "math": [
        "Solve this word problem and show your work. {question}\nSolution:",
        "Can you work this out step by step? {question}\nWorking:",
    ],
    "translate": [
        "Please render this sentence in {lang}. {sentence} ->",
        "How would you say \"{sentence}\" in {lang}? Answer:",
    ],
    "summarize": [
        "Give a one-sentence summary of the following text. {paragraph}\nOne sentence:",
        "TL;DR of: {paragraph}\nTL;DR:",
    ],
    "chat": [
        "Human: {message}\nAI:",
        "Q: {message}\nA:",
    ],
    "spell": [
        "How do you spell '{word}'? Letters:",
        "Write out '{word}' one letter at a time:",
    ],
}


def render_from(templates: dict[str, str], rephrasings: dict[str, list[str]], domain: str, fields: dict,
                rephrasing: int | None = None) -> str:
    """A prompt in its domain's canonical template (rephrasing None) or in one of its rephrasings (any world's)."""
    template = templates[domain] if rephrasing is None else rephrasings[domain][rephrasing % len(rephrasings[domain])]
    return template.format(**fields)


def render_prompt(domain: str, fields: dict[str, str], rephrasing: int | None = None) -> str:
    return render_from(TEMPLATES, REPHRASINGS, domain, fields, rephrasing)
