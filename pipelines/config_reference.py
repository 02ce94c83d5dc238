"""The annotated config reference (`specdraft config --defaults`), generated from the schema dataclasses.

Each field's documentation is the comment written beside it in the dataclass source (and any comment
lines right above it): the schema is the one place a key is typed, defaulted and explained, and this
module prints all three as YAML that loads back to the defaults. `field_docs` is what the tests use to
keep every field documented.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import types
import io
import textwrap
import tokenize
import typing
from typing import Any

import yaml

WIDTH = 110  # wrap long comments at about this many columns


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its comment (the comment lines above the field, then the one on its line)."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments: dict[int, str] = {}  # line (1-based) -> comment text
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    docs: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line in comments and line not in code_lines:  # a block of whole-line comments right above
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments and n in code_lines]
        docs[node.target.id] = " ".join(above + beside).strip()
    return docs


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    if dataclasses.is_dataclass(tp):
        return tp.__name__
    return getattr(tp, "__name__", str(tp))


def _flow(value: Any) -> str:
    """A default as one line of YAML."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _comment(indent: str, text: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, WIDTH - len(indent) - 2)] if text else []


def reference(obj: Any, indent: str = "") -> list[str]:
    """YAML lines for dataclass instance `obj`: each key with its type and default, its doc above it."""
    cls = type(obj)
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    lines: list[str] = []
    for f in dataclasses.fields(cls):
        value, tp = getattr(obj, f.name), hints[f.name]
        lines += _comment(indent, docs.get(f.name, ""))
        if dataclasses.is_dataclass(value):
            lines.append(f"{indent}{f.name}:  # {_type_name(tp)}")
            lines += reference(value, indent + "  ")
        else:
            plain = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value] \
                if isinstance(value, list) else value
            lines.append(f"{indent}{f.name}: {_flow(plain)}  # {_type_name(tp)}")
            for item in _dataclasses_in(tp):  # a list of sections: document the item's keys under it
                item_hints, item_docs = typing.get_type_hints(item), field_docs(item)
                for g in dataclasses.fields(item):
                    lines += _comment(indent + "  ", f"{g.name} ({_type_name(item_hints[g.name])}): {item_docs[g.name]}")
    return lines


def defaults_reference(cls: type) -> str:
    """The full annotated reference of config class `cls` at its defaults."""
    head = [f"# Every key of a {cls.__name__} with its type, default and meaning (generated from the schema).",
            "# A run config lists only what it changes; `specdraft validate FILE` checks one.", "", ""]
    blocks: list[str] = []
    for f in dataclasses.fields(cls):
        block = _comment("", field_docs(cls).get(f.name, "")) + [f"{f.name}:"] + reference(getattr(cls(), f.name), "  ")
        blocks.append("\n".join(block))
    return "\n".join(head) + "\n\n".join(blocks) + "\n"


def iter_fields(cls: type, prefix: str = ""):
    """(dotted key, owning dataclass, field name) for every field reachable from `cls` (nested sections,
    and the item type of a list of dataclasses)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        yield key, cls, f.name
        for t in _dataclasses_in(tp):
            yield from iter_fields(t, key + ".")


def _dataclasses_in(tp: Any) -> list[type]:
    """The dataclasses a field's type holds: itself, or inside Optional / list / dict."""
    if dataclasses.is_dataclass(tp):
        return [tp]
    return [d for arg in typing.get_args(tp) for d in _dataclasses_in(arg)]
