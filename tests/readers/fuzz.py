"""What every reader's property test shares: the per-reader count of examples, byte-level damage, and
the one check of a refusal (InputError, one line, naming the file and the fix)."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from hypothesis import strategies as st

from specdraft.core.errors import InputError

TRIED: Counter = Counter()  # reader -> examples tried this run (printed by conftest's terminal summary)

# one edit of a file's bytes: (kind, where as a fraction of the length, payload)
_edit = st.tuples(st.sampled_from(["truncate", "flip", "delete", "insert", "bad-utf8"]),
                  st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=6))
edits = st.lists(_edit, min_size=1, max_size=3)
# bytes that are never valid UTF-8 wherever they land: a lone continuation byte, an overlong lead, 0xff
BAD_UTF8 = (b"\x80", b"\xc0\xaf", b"\xff", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80")


def damage(data: bytes, ops) -> bytes:
    out = bytearray(data)
    for kind, where, payload in ops:
        i = int(where * len(out)) if out else 0
        if kind == "truncate":
            del out[i:]
        elif kind == "flip" and out:
            out[i] ^= payload[0] or 0x01
        elif kind == "delete":
            del out[i:i + len(payload)]
        elif kind == "insert":
            out[i:i] = payload
        else:
            out[i:i] = BAD_UTF8[payload[0] % len(BAD_UTF8)]
    return bytes(out)


def check_refusal(e: InputError, path: Path | str | None = None, line: int | None = None) -> str:
    """The message a user reads: one line, the file (and line) named, a fix after the problem."""
    msg = str(e)
    assert msg and "\n" not in msg, msg
    if path is not None:
        assert str(Path(path).name) in msg, f"{msg!r} does not name {path}"
    if line is not None:
        assert re.search(rf":{line}\b", msg), f"{msg!r} does not name line {line}"
    # the fix: after a semicolon, or the rule the value breaks ("must be ..."), or a suggestion
    assert re.search(r";|did you mean| like | must | use |re-?run|re-export", msg), f"{msg!r} names no fix"
    return msg


# JSON values of every type, for "wrong type" damage
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                         st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                                  st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                           max_leaves=6)


def fewer(divisor: int):
    """The active profile's example count divided by `divisor`, for a property whose example costs a whole
    config load or CLI call (the loaded profile still scales it: more under -m slow)."""
    from hypothesis import settings

    return settings(max_examples=max(10, settings().max_examples // divisor))
