"""The one reader of JSON Lines files a user hands us (prompt records for `prepare-data` and for
`specdraft generate --prompts`).

It lives in the bottom layer because the decoder (`specdraft generate`) and the data package (the
`prompts.sources` of prepare-data) both read this format and neither may import the other: one reader
means one behaviour for the same damage, file and line named.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specdraft.core.errors import InputError


def _no_duplicate_keys(where: str):
    # json keeps the last of two equal keys silently: a record saying "prompt" twice would lose one
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise InputError(f"{where} gives key '{k}' twice in one object; keep one")
            out[k] = v
        return out

    return hook


def _no_constants(name: str):
    # NaN / Infinity are not JSON; Python's json reads them, a user's other tools would not
    raise ValueError(f"{name} is not JSON")


def jsonl_objects(path: str | Path, what: str, example: str) -> list[tuple[str, dict[str, Any]]]:
    """('FILE:LINE', object) for every non-blank line of a JSONL file, in order. InputError (one line,
    naming the file and line and the fix) for an unreadable file, bytes that are not UTF-8, a line that
    is not JSON, a line that is not an object (`example` shows one), or an object with a key twice."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"{what} '{path}' cannot be read ({e.strerror or type(e).__name__}); "
                         "give a JSONL file, one record per line") from None
    out = []
    for n, line in enumerate(raw.split(b"\n"), 1):
        where = f"{path}:{n}"
        try:
            # a BOM is how some editors mark UTF-8; it is not damage
            text = line.decode("utf-8-sig" if n == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{where} is not UTF-8 text (byte {e.start + 1} of the line); save the {what} as "
                             "UTF-8") from None
        if not text.strip():
            continue
        try:
            obj = json.loads(text, object_pairs_hook=_no_duplicate_keys(where), parse_constant=_no_constants)
        except json.JSONDecodeError as e:
            raise InputError(f"{where} is not valid JSON ({e.msg} at column {e.colno}); write one JSON object "
                             "per line") from None
        except ValueError as e:  # NaN / Infinity
            raise InputError(f"{where} is not valid JSON ({e}); write one JSON object per line") from None
        except RecursionError:
            raise InputError(f"{where} nests too deeply to be a record; write one flat JSON object per line") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where} is a JSON {type(obj).__name__}, not an object like {example}")
        out.append((where, obj))
    return out
