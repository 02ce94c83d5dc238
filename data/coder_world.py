"""The coder world: requests a coder-instruct model meets, built offline from the interpreter's own code.

A coder-instruct target (a Qwen2.5-Coder Instruct) is served user turns through its chat template, so its prompts
are the requests people send such a model: write a function, explain code, write tests, fix a bug, and, since
they ask other things too, a domain that is not code. Nothing is downloaded, and no packaged benchmark prompt set
(HumanEval, MBPP, ...) is used: every function is a module-level function or a method of a top-level class of the
running interpreter's standard library (4-40 lines, at most MAX_CHARS characters, so a prompt stays under ~450
tokens), and the word problems are the demo world's.

  write    "Write a Python function `name(args)`." and the first paragraph of its docstring (module-level
           documented functions); reference: the function's own source
  explain  a function's code without its docstring, to explain; reference: the docstring's first paragraph
           ("" for an undocumented one)
  tests    a module-level function's code, to write unit tests for; no reference
  math     the demo world's grade-school word problems, to solve step by step; reference: the worked solution
  fix      (held out: no drafter is trained on it) a function with one injected bug (a comparison, arithmetic or
           boolean operator, a True/False or a 0/1 swapped: one token on one line of its body), to find and fix;
           reference: the function as written

Every function lies in one split for all domains (data/source_split.py groups the functions that share a code line
of 30+ characters, a docstring sentence or a qualified name), so no code line or sentence of a dev, test or
held-out prompt appears in a training prompt of any domain; the word problems split by their text, as the instruct
world's. Each domain has a canonical template and two rephrasings (the perturbed set).
"""
from __future__ import annotations

import ast
import io
import random
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice

from specdraft.core.errors import InputError
from specdraft.data import demo_world, instruct_world
from specdraft.data.source_split import MIN_LINE, clean, code_material, fields_bucket, group_buckets, text_material
from specdraft.data.templates import render_from

DOMAINS = ("write", "explain", "tests", "math")
HELDOUT_DOMAINS = ("fix",)
ALL_DOMAINS = DOMAINS + HELDOUT_DOMAINS
GENERATED_DOMAINS = ("math",)  # written by a generator from drawn values (demo_world.GENERATED_DOMAINS)
CORPUS = False  # its target is a real model: nothing to pretrain
MAX_CHARS = 1200  # a function's source: ~350 tokens of a code tokenizer, the prompt under ~450 with its request

TEMPLATES: dict[str, str] = {
    "write": "Write a Python function `{signature}`.\n\n{doc}",
    "explain": "Explain what this Python function does.\n\n```python\n{code}\n```",
    "tests": "Write unit tests for this Python function.\n\n```python\n{code}\n```",
    "math": "Solve this math problem step by step.\n\n{question}",
    "fix": "This Python function has a bug. Find it and fix it.\n\n```python\n{code}\n```",
}
# the perturbed set: the same request in other words (a router keyed on the surface form should stumble)
REPHRASINGS: dict[str, list[str]] = {
    "write": ["Implement `{signature}` in Python. It should do this: {doc}",
              "I need a Python function with the signature `{signature}`.\n{doc}\nCan you write it?"],
    "explain": ["```python\n{code}\n```\n\nCan you walk me through what this code does?",
                "What does the following function do? Explain it step by step.\n\n{code}"],
    "tests": ["```python\n{code}\n```\n\nWrite pytest tests that cover this function, edge cases included.",
              "Can you write some test cases to check that this function works?\n\n{code}"],
    "math": ["{question} Show your reasoning and give the final answer.",
             "Here is a word problem for you:\n{question}\nPlease work it out."],
    "fix": ["```python\n{code}\n```\n\nSomething in this function is wrong. What is the bug, and how do I fix it?",
            "Find and fix the bug in the following code:\n\n{code}"],
}


@dataclass(frozen=True)
class Function:
    key: str  # module.qualname: its source item key (data/source_split.py)
    signature: str  # name(args) -> annotation
    doc: str  # the docstring, cleaned ("" when none)
    source: str  # as written, dedented
    code: str  # the source without its docstring
    body_row: int  # 1-based row of `source` where the body's statements start (after the docstring)
    method: bool  # defined in a class
    arity: int  # how many parameters it takes (self included)


# --------------------------------------------------------------------------- the standard library's functions


def _dedented(lines: list[str]) -> str | None:
    """The lines without the first one's indentation; None when a line is indented less (a string literal's
    continuation: cutting it would change the code)."""
    indent = len(lines[0]) - len(lines[0].lstrip())
    if indent and any(line.strip() and not line[:indent].isspace() for line in lines):
        return None
    return "\n".join(line[indent:] for line in lines)


def _function(module: str, lines: list[str], node: ast.FunctionDef, owner: str | None) -> Function | None:
    n = node.end_lineno - node.lineno + 1
    source = _dedented(lines[node.lineno - 1:node.end_lineno]) if 4 <= n <= 40 else None
    if source is None or not source.isascii() or len(source) > MAX_CHARS:
        return None
    doc = ast.get_docstring(node) or ""
    first = node.body[0]
    has_doc = bool(doc) and isinstance(first, ast.Expr)
    if has_doc and first.lineno == node.lineno:  # `def f(): """doc"""` on one line
        return None
    body_start = (node.body[1].lineno if has_doc and len(node.body) > 1 else first.lineno) - node.lineno + 1
    rows = source.splitlines()
    if has_doc:
        rows = rows[:first.lineno - node.lineno] + rows[first.end_lineno - node.lineno + 1:]
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    qualname = f"{owner}.{node.name}" if owner else node.name
    a = node.args
    arity = len(a.posonlyargs + a.args + a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return Function(f"{module}.{qualname}", f"{node.name}({ast.unparse(a)}){returns}", doc if doc.isascii() else "",
                    source, "\n".join(rows), body_start, owner is not None, arity)


@lru_cache(maxsize=1)
def stdlib_code() -> tuple[Function, ...]:
    """Module-level functions and methods of top-level classes of the standard library's top-level modules."""
    out = []
    for module, text in demo_world.stdlib_modules():
        lines = text.splitlines()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef):
                members = [(node, None)]
            elif isinstance(node, ast.ClassDef):
                members = [(m, node.name) for m in node.body if isinstance(m, ast.FunctionDef)]
            else:
                continue
            out += [f for f in (_function(module, lines, m, owner) for m, owner in members) if f is not None]
    return tuple(out)


@lru_cache(maxsize=1)
def source_buckets() -> dict[str, str]:
    """The split of every function and of every code line and docstring sentence they hold (source_split)."""
    return group_buckets((f.key, code_material(f.source) | text_material(f.doc)) for f in stdlib_code())


def summary(f: Function) -> str:
    """The docstring's first paragraph, on one line."""
    return clean(f.doc.split("\n\n")[0])


# what each pooled domain takes: a function that reads as a task of its kind
ELIGIBLE = {
    "write": lambda f: not f.method and 4 <= len(summary(f).split()) <= 80 and ">>>" not in f.doc
    and len(f.code.splitlines()) >= 3,
    "explain": lambda f: len(f.code.splitlines()) >= 4,
    "tests": lambda f: not f.method and f.arity > 0 and len(f.code.splitlines()) >= 4,
    "fix": lambda f: len(f.code.splitlines()) >= 4,
}


# --------------------------------------------------------------------------- an injected bug (fix)

# one token swapped for another of the same kind: the code still parses, and does something else
SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "+": "-", "-": "+",
         "and": "or", "or": "and", "True": "False", "False": "True", "0": "1", "1": "0"}


def mutations(f: Function) -> list[tuple[int, int, int, str]]:
    """(row, start column, end column, replacement) of every token of the body SWAPS can change."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(f.source).readline))
    except (tokenize.TokenError, SyntaxError):
        return []
    return [(t.start[0], t.start[1], t.end[1], SWAPS[t.string]) for t in tokens
            if t.start[0] >= f.body_row and t.type in (tokenize.OP, tokenize.NAME, tokenize.NUMBER)
            and t.string in SWAPS]


def with_bug(f: Function, bucket: str) -> str | None:
    """The source with one swap, chosen by the function's key (one bug per function, whatever the seed); a swap
    whose line reads as a line of another split's function is never chosen. None when no swap fits."""
    rows = f.source.splitlines()
    fits = []
    for row, start, end, new in mutations(f):
        line = rows[row - 1][:start] + new + rows[row - 1][end:]
        if len(line.strip()) < MIN_LINE or source_buckets().get(line.strip(), bucket) == bucket:
            fits.append((row, line))
    if not fits:
        return None
    row, line = random.Random(f.key).choice(fits)
    return "\n".join(rows[:row - 1] + [line] + rows[row:])


# --------------------------------------------------------------------------- prompts


def fields_of(domain: str, f: Function, bucket: str) -> tuple[dict, str] | None:
    """A pooled domain's (template fields, reference) for one function; None when it has no bug to inject."""
    fenced = f"```python\n{f.source}\n```"
    if domain == "write":
        return {"signature": f.signature, "doc": summary(f)}, fenced
    if domain == "explain":
        return {"code": f.code}, summary(f)
    if domain == "tests":
        return {"code": f.source}, ""
    buggy = with_bug(f, bucket)
    return ({"code": buggy}, fenced) if buggy is not None else None


@lru_cache(maxsize=None)
def pool(domain: str, bucket: str) -> tuple[Function, ...]:
    """The functions in one split's bucket that a pooled domain takes."""
    return tuple(f for f in stdlib_code() if source_buckets()[f.key] == bucket and ELIGIBLE[domain](f))


def render_prompt(domain: str, fields: dict, rephrasing: int | None = None) -> str:
    return render_from(TEMPLATES, REPHRASINGS, domain, fields, rephrasing)


class Example(instruct_world.Example):
    """An instruct-world example (id, domain, fields, response) rendered with this world's templates."""

    render = staticmethod(render_prompt)


# --------------------------------------------------------------------------- splits


def _math(rng: random.Random, bucket: str, n: int) -> list[tuple[dict, str]]:
    """n distinct word problems whose text hashes into the bucket (the instruct world's key, so the two worlds
    split their problems alike)."""
    out, seen = [], set()
    for _ in range(50 * n + 1000):
        fields, solution = demo_world.make_math(rng)
        if fields["question"] not in seen and fields_bucket("math", fields) == bucket:
            seen.add(fields["question"])
            out.append((fields, solution.strip()))
            if len(out) == n:
                break
    return out


def build_split(domain: str, split: str, n: int, seed: int) -> list[Example]:
    """n distinct examples of one domain for one split ('train', 'dev', 'test'; 'corpus' is the train pool),
    deterministic in seed: a seeded sample of the split's functions (one prompt each), or of word problems."""
    if domain not in ALL_DOMAINS:
        raise ValueError(f"unknown coder-world domain {domain!r}; choose from {', '.join(ALL_DOMAINS)}")
    rng = random.Random(f"specdraft-coder/{seed}/{domain}/{split}")
    bucket = "train" if split == "corpus" else split
    if domain == "math":
        made = _math(rng, bucket, n)
    else:  # a seeded order of the split's functions, one prompt each (fix skips one with no bug to inject)
        order = list(pool(domain, bucket))
        rng.shuffle(order)
        made = list(islice(filter(None, (fields_of(domain, f, bucket) for f in order)), n))
    if len(made) < n:
        raise InputError(f"the coder world has fewer than {n} distinct {domain} prompts for split {split!r}; "
                         f"lower demo.{split}_per_domain")
    return [Example(f"{domain}/{split}/{i:06d}", domain, fields, response) for i, (fields, response) in enumerate(made)]
