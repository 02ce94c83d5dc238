"""The demo world: six small task domains built offline from the running interpreter's standard library.

Nothing is downloaded. Every example is a (prompt fields, reference response) pair made by a seeded
generator from text already on the machine:

  code       a standard-library function's first lines -> the lines that follow
  math       generated grade-school word problems -> worked solution and an "Answer: N" line
  translate  real English sentences from stdlib docstrings -> a fixed rule-based transform
             (Pig Latin, or every word spelled backwards), shown as "Translate to X: ... => ..."
  summarize  a docstring paragraph -> its first sentence
  chat       a general mix: greetings, arithmetic questions, "what does `f` do?", repeat-after-me
  spell      (held out: no drafter trains on it) a word -> its letters joined by dashes

Source items (functions, sentences, paragraphs, words) are split by a stable hash into a pool for the
pretraining corpus and the train prompts, and disjoint pools for the dev and test prompts, so the
evaluation prompts are never seen verbatim in training. Items that share text (a sentence and the paragraph
or docstring that holds it, two functions with a common line) share their split (data/source_split.py), so
no sentence or code line of an evaluation prompt appears in a training prompt of any domain.
"""
from __future__ import annotations

import ast
import random
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specdraft.data.source_split import (clean, code_material, fields_bucket, group_buckets,
                                          split_sentences, stable_bucket, text_material)
from specdraft.data.templates import REPHRASINGS, render_prompt  # noqa: F401 (the world interface: data/prompts.py)

DOMAINS = ("code", "math", "translate", "summarize", "chat")
HELDOUT_DOMAINS = ("spell",)
ALL_DOMAINS = DOMAINS + HELDOUT_DOMAINS
# domains whose prompts a generator writes from drawn names and numbers: their phrases recur in every split by
# design, and a split keeps the whole prompts that hash into its bucket (every other domain embeds source items)
GENERATED_DOMAINS = ("math",)
CORPUS = True  # pretraining documents for the demo target and the drafters' general phase


@dataclass(frozen=True)
class Example:
    id: str
    domain: str
    fields: dict  # template fields
    response: str  # reference answer; starts with a space, follows the prompt directly

    @property
    def prompt(self) -> str:
        return render_prompt(self.domain, self.fields)


# --------------------------------------------------------------------------- source text


@lru_cache(maxsize=1)
def stdlib_modules() -> tuple[tuple[str, str], ...]:
    """(module name, source) for the top-level standard-library modules, sorted by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
            ast.parse(source)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        out.append((path.stem, source))
    if not out:
        raise RuntimeError(f"no standard-library sources found under {root}; the demo world needs them")
    return tuple(out)


@lru_cache(maxsize=1)
def _stdlib_scan() -> tuple[tuple[tuple[str, str, str], ...], tuple[tuple[str, str], ...]]:
    """stdlib_functions() and stdlib_docstrings() from one parse and one walk of each module (parsing the standard
    library was most of prepare-data's seconds, and both used to parse it)."""
    functions, docstrings = [], []
    for module, source in stdlib_modules():
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.end_lineno is not None:
                n = node.end_lineno - node.lineno + 1
                if 4 <= n <= 40:
                    body = lines[node.lineno - 1 : node.end_lineno]
                    indent = len(body[0]) - len(body[0].lstrip())
                    text = "\n".join(line[indent:] for line in body)
                    if text.isascii():
                        functions.append((module, node.name, text))
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and doc.isascii():
                    name = module if isinstance(node, ast.Module) else f"{module}.{node.name}"
                    docstrings.append((name, doc))
    return tuple(functions), tuple(docstrings)


def stdlib_functions() -> tuple[tuple[str, str, str], ...]:
    """(module, function name, source text) of module-level and method functions of 4-40 lines."""
    return _stdlib_scan()[0]


def stdlib_docstrings() -> tuple[tuple[str, str], ...]:
    """(qualified name, cleaned docstring) for modules, classes and functions."""
    return _stdlib_scan()[1]


_PLAIN = re.compile(r"^[A-Z][A-Za-z ,'-]+[a-z][.!?]$")


@lru_cache(maxsize=1)
def english_sentences() -> tuple[str, ...]:
    """Plain English sentences (letters, spaces, commas; 5-14 words) from docstrings, deduplicated."""
    seen, out = set(), []
    for _, doc in stdlib_docstrings():
        for para in doc.split("\n\n"):
            for s in split_sentences(para):
                if _PLAIN.match(s) and 5 <= len(s.split()) <= 14 and s not in seen:
                    seen.add(s)
                    out.append(s)
    return tuple(out)


@lru_cache(maxsize=1)
def docstring_paragraphs() -> tuple[str, ...]:
    """Prose paragraphs of 2+ sentences and 15-70 words whose first sentence (5-25 words) is unique."""
    seen, out = set(), []
    for _, doc in stdlib_docstrings():
        for para in doc.split("\n\n"):
            text = clean(para)
            sents = split_sentences(text)
            if (len(sents) >= 2 and 15 <= len(text.split()) <= 70 and 5 <= len(sents[0].split()) <= 25
                    and sents[0][-1] in ".!?" and ">>>" not in text and sents[0] not in seen):
                seen.add(sents[0])  # one paragraph per summary, so splits by paragraph split summaries too
                out.append(text)
    return tuple(out)


@lru_cache(maxsize=1)
def documented_functions() -> tuple[tuple[str, str], ...]:
    """(function name, first docstring sentence) for chat questions."""
    out = []
    for name, doc in stdlib_docstrings():
        if "." in name:
            first = split_sentences(doc.split("\n\n")[0])
            if first and 4 <= len(first[0].split()) <= 20 and first[0][-1] == ".":
                out.append((name, first[0]))
    return tuple(out)


@lru_cache(maxsize=1)
def english_words() -> tuple[str, ...]:
    words = {w.lower() for s in english_sentences() for w in re.findall(r"[A-Za-z]+", s)}
    return tuple(sorted(w for w in words if 4 <= len(w) <= 10))


# --------------------------------------------------------------------------- rule-based translation

_VOWELS = set("aeiouAEIOU")


def pig_latin_word(word: str) -> str:
    core = word.rstrip(",.!?")
    tail = word[len(core):]
    if not core.isalpha():
        return word
    if core[0] in _VOWELS:
        out = core + "way"
    else:
        i = 0
        while i < len(core) and core[i] not in _VOWELS:
            i += 1
        out = core[i:] + core[:i].lower() + "ay"
        if core[0].isupper():
            out = out[0].upper() + out[1:]
    return out + tail


def backwards_word(word: str) -> str:
    core = word.rstrip(",.!?")
    tail = word[len(core):]
    return core[::-1] + tail


LANGUAGES = {"Pig Latin": pig_latin_word, "Backwards": backwards_word}


def translate(sentence: str, lang: str) -> str:
    return " ".join(LANGUAGES[lang](w) for w in sentence.split())


# --------------------------------------------------------------------------- generators

_NAMES = ["Ava", "Ben", "Chloe", "Dev", "Ella", "Finn", "Grace", "Hugo", "Iris", "Jack", "Kai", "Lena",
          "Maya", "Noah", "Omar", "Pia", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Vik", "Wren", "Yara", "Zoe"]
_ITEMS = ["apples", "books", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards", "coins",
          "oranges", "toy cars", "beads", "balloons", "eggs"]


def make_math(rng: random.Random) -> tuple[dict, str]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randint(5, 60), rng.randint(2, 40)
        c = rng.randint(1, a + b - 1)
        r = a + b - c
        q = f"{name} has {a} {item}. {name} buys {b} more and then gives {c} away. How many {item} does {name} have now?"
        s = (f" {name} starts with {a} {item}. After buying {b} more, {name} has {a} + {b} = {a + b} {item}."
             f" After giving {c} away, {name} has {a + b} - {c} = {r} {item}.\nAnswer: {r}")
    elif kind == 1:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        r = a * b
        q = f"{name} buys {a} boxes of {item}. Each box holds {b} {item}. How many {item} does {name} buy?"
        s = f" Each box holds {b} {item}, and there are {a} boxes. So {name} buys {a} x {b} = {r} {item}.\nAnswer: {r}"
    elif kind == 2:
        b, r = rng.randint(2, 9), rng.randint(2, 12)
        a = b * r
        q = f"{name} shares {a} {item} equally among {b} friends. How many {item} does each friend get?"
        s = f" {name} has {a} {item} for {b} friends. Each friend gets {a} / {b} = {r} {item}.\nAnswer: {r}"
    else:
        other = rng.choice([n for n in _NAMES if n != name])
        a, d = rng.randint(10, 80), rng.randint(2, 30)
        r = a + a + d
        q = (f"{name} has {a} {item}. {other} has {d} more {item} than {name}."
             f" How many {item} do they have together?")
        s = (f" {other} has {a} + {d} = {a + d} {item}. Together they have {a} + {a + d} = {r} {item}."
             f"\nAnswer: {r}")
    return {"question": q}, s


def _greeting(rng: random.Random) -> tuple[dict, str]:
    name = rng.choice(_NAMES)
    greet = rng.choice(["Hi", "Hello", "Hey there", "Good morning"])
    return {"message": f"{greet}, I am {name}."}, f" {greet}, {name}! It is nice to meet you. How can I help you today?"


def _arithmetic(rng: random.Random) -> tuple[dict, str]:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    op, word, val = rng.choice([("+", "plus", a + b), ("*", "times", a * b)])
    return {"message": f"What is {a} {word} {b}?"}, f" {a} {word} {b} is {val}."


def in_bucket(make, rng: random.Random, domain: str, bucket: str) -> tuple[dict, str]:
    """A generated example whose prompt fields hash into the bucket (drawn again until one does), so a generated
    prompt, not only a source item, lies in one split."""
    for _ in range(10_000):  # a dev or test draw succeeds with p = 0.08: this bound is never reached
        fields, response = make(rng)
        if fields_bucket(domain, fields) == bucket:
            return fields, response
    raise RuntimeError(f"no generated {domain} prompt hashed into {bucket!r} in 10000 draws")


def _chat(rng: random.Random, bucket: str) -> tuple[dict, str]:
    kind = rng.randrange(4)
    if kind < 2:
        return in_bucket((_greeting, _arithmetic)[kind], rng, "chat", bucket)
    if kind == 2:
        fns = _pool(documented_functions(), _first, bucket)
        name, first = rng.choice(fns)
        return {"message": f"What does `{name}` do?"}, f" According to its documentation: {first}"
    sents = _pool(english_sentences(), _ident, bucket)
    s = rng.choice(sents)
    return {"message": f"Repeat after me: {s}"}, f" Sure. {s}"


def _ident(x):
    return x


def _first(x):
    return x[0]


def function_key(f: tuple[str, str, str]) -> str:
    """A stdlib_functions item's key: module, name and the start of its text (a name repeats across classes)."""
    return f"{f[0]}.{f[1]}.{f[2][:200]}"


@lru_cache(maxsize=1)
def source_buckets() -> dict[str, str]:
    """The split of every source item the demo and instruct worlds embed, and of every piece of their text:
    functions, sentences, paragraphs and documented names grouped at once (data/source_split.py)."""
    return group_buckets([*((function_key(f), code_material(f[2])) for f in stdlib_functions()),
                          *((s, (s,)) for s in english_sentences()),
                          *((p, text_material(p)) for p in docstring_paragraphs()),
                          *((name, (first,)) for name, first in documented_functions())])


def bucket_of(key: str) -> str:
    """A source item's split: its group's, or its own stable hash for an item that embeds no sentence (a word)."""
    return source_buckets().get(key) or stable_bucket(key)


@lru_cache(maxsize=None)
def _pool(items: tuple, key, bucket: str) -> list:
    """The part of `items` whose split is `bucket` ('train', 'dev' or 'test')."""
    return [x for x in items if bucket_of(key(x)) == bucket]


def make_example(domain: str, rng: random.Random, bucket: str) -> tuple[dict, str]:
    if domain == "math":
        return in_bucket(make_math, rng, "math", bucket)
    if domain == "chat":
        return _chat(rng, bucket)
    if domain == "code":
        module, name, text = rng.choice(_pool(stdlib_functions(), function_key, bucket))
        lines = text.splitlines()
        k = min(len(lines) - 1, rng.randint(1, 3))
        rest = "\n".join(lines[k : k + 10])
        return {"module": module, "head": "\n".join(lines[:k])}, "\n" + rest[:400]
    if domain == "translate":
        s = rng.choice(_pool(english_sentences(), _ident, bucket))
        lang = rng.choice(sorted(LANGUAGES))
        return {"lang": lang, "sentence": s}, " " + translate(s, lang)
    if domain == "summarize":
        p = rng.choice(_pool(docstring_paragraphs(), _ident, bucket))
        return {"paragraph": p}, " " + split_sentences(p)[0]
    if domain == "spell":
        w = rng.choice(_pool(english_words(), _ident, bucket))
        return {"word": w}, " " + "-".join(w)
    raise ValueError(f"unknown demo domain {domain!r}; choose from {', '.join(ALL_DOMAINS)}")


def build_split(domain: str, split: str, n: int, seed: int) -> list[Example]:
    """n examples of one domain for one split ('corpus', 'train', 'dev', 'test'), deterministic in seed."""
    rng = random.Random(f"specdraft-demo/{seed}/{domain}/{split}")
    bucket = "train" if split == "corpus" else split
    return [Example(f"{domain}/{split}/{i:06d}", domain, *make_example(domain, rng, bucket)) for i in range(n)]
