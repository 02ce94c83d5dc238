"""One split per piece of source text, whichever domain of a world embeds it.

The built-in worlds build prompts from source items on the machine: a standard-library function, a docstring
paragraph, a sentence. Items share text: a sentence stands alone and inside its paragraph, a function's docstring
holds sentences that are also paragraphs of their own, two functions share a line. Hashing each domain's items on
their own keys would put the same text in a training prompt of one domain and an evaluation prompt of another.
So a world hands every item of every domain to `group_buckets` at once, with its material (the text a prompt of
it can show: sentences, code lines), and the items that share material, directly or through others, form one
group that takes the stable bucket of its smallest string: every item, sentence and code line lies in one split.
"""
from __future__ import annotations

import hashlib
import inspect
import re
from typing import Iterable

MIN_LINE = 30  # a code line shorter than this is idiom ("return None"), shared by unrelated functions


def stable_bucket(key: str) -> str:
    """Stable split of source items: 84% 'train' (corpus and train prompts), 8% 'dev', 8% 'test'."""
    u = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "dev" if u < 0.08 else "test" if u < 0.16 else "train"


def fields_bucket(domain: str, fields: dict) -> str:
    """The split of a generated prompt (a word problem, a greeting): the stable bucket of its fields."""
    return stable_bucket(domain + "|" + "|".join(f"{k}={v}" for k, v in sorted(fields.items())))


_SENTENCE_END = re.compile(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])")
# a function's docstring: the first string literal after its header (the header may span lines)
_DOCSTRING = re.compile(r"\)\s*(?:->[^\n]*)?:\s*\n\s*[rRuU]?(\"\"\"|''')(.*?)\1", re.DOTALL)


def clean(text: str) -> str:
    return " ".join(text.split())


def split_sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(clean(paragraph)) if s.strip()]


def text_material(text: str) -> set[str]:
    """The sentences of a prose text (every paragraph)."""
    return {s for para in text.split("\n\n") for s in split_sentences(para)}


def code_material(source: str) -> set[str]:
    """What a prompt can show of a function: its code lines of MIN_LINE+ characters (stripped) and the
    sentences of its docstring."""
    lines = {line.strip() for line in source.splitlines() if len(line.strip()) >= MIN_LINE}
    doc = _DOCSTRING.search(source)
    return lines | (text_material(inspect.cleandoc(doc.group(2))) if doc else set())


def group_buckets(items: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """{key or piece of material: bucket} for (key, material) items. A key counts as material too (two items of
    one key join); items sharing material join one group, whose bucket is the stable bucket of its smallest
    string (key or material), so it does not depend on the order the items come in."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving: the groups stay shallow
            x = parent[x]
        return x

    for key, material in items:
        parent.setdefault(key, key)
        for piece in material:
            parent.setdefault(piece, piece)
            a, b = find(key), find(piece)
            parent[max(a, b)] = min(a, b)  # a root is its group's smallest string
    return {x: stable_bucket(find(x)) for x in parent}
