"""bundle.json as dataclasses: the one definition the export stage writes and the decoder reads.

`BundleSpec.to_json(root)` is what export writes; `BundleSpec.from_json(data, root)` reads it back and
refuses, with one line naming the field and the fix, every missing, unknown or mistyped field and every
path that is absolute or leaves the bundle. Paths are absolute `Path`s in the dataclasses and relative
posix strings in the JSON, so a bundle copied elsewhere reads unchanged. A field whose metadata is
`KEY` is the entry's name: the key it sits under in its JSON object, not a field of it.
Checks that need the files themselves (hashes, tokenizers) stay with the loader (decoding/bundle/directory.py).
"""
from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from specdraft.core.errors import InputError
from specdraft.decoding.bundle.chat import ChatFormat
from specdraft.decoding.defaults import DecodingDefaults

BUNDLE_JSON = "bundle.json"
FORMAT = "specdraft-bundle/1"
KEY = {"key": True}  # the entry's name: its key in the enclosing JSON object
OMIT = {"omit": True}  # left out of the JSON while it has its default (absent = the default)


def resolve_inside(root: Path, rel: Any, what: str) -> Path:
    """root/rel, refusing anything that could leave the bundle: absolute paths (POSIX or Windows),
    '..' parts, and symlinks that resolve outside. root must already be resolved."""
    if not isinstance(rel, str) or not rel.strip():
        raise InputError(f"{BUNDLE_JSON}: {what} path {rel!r} is not a non-empty string; re-export the bundle")
    posix, win = PurePosixPath(rel), PureWindowsPath(rel)
    if posix.is_absolute() or win.is_absolute() or win.drive or ".." in posix.parts or ".." in win.parts:
        raise InputError(f"{BUNDLE_JSON}: {what} path '{rel}' is absolute or leaves the bundle; "
                         "bundle paths must be relative and stay inside it (re-export the bundle)")
    path = (root / rel).resolve()
    if not path.is_relative_to(root):
        raise InputError(f"{BUNDLE_JSON}: {what} path '{rel}' resolves outside the bundle (a symlink?); "
                         "re-export the bundle")
    return path


@dataclass(frozen=True)
class TargetEntry:
    tokenizer_sha256: str
    vocab_size: int
    dtype: str = "auto"
    # how the stages loaded the target (the config's target section): evaluate loads it the same way
    quantization: typing.Literal["none", "int8", "nf4"] = "none"  # bitsandbytes, as decoding.bundle.loading reads it
    device_map: Any = None  # "auto", an explicit {module: device} map, or null (one device)
    path: Path | None = field(default=None, metadata=OMIT)  # the target's HF dir inside the bundle, or
    reference: str | None = field(default=None, metadata=OMIT)  # an absolute dir or hub id outside it
    revision: str | None = field(default=None, metadata=OMIT)  # a hub reference's pinned commit

    def __post_init__(self):
        if (self.path is None) == (self.reference is None):
            raise InputError(f"{BUNDLE_JSON}: target needs exactly one of 'path' (in the bundle) or 'reference'; "
                             "re-export")


@dataclass(frozen=True)
class DrafterEntry:
    name: str = field(metadata=KEY)
    path: Path  # absolute, inside the bundle
    parameters: int
    hidden_size: int
    vocab_size: int
    tokenizer_sha256: str
    domains: list[str] = field(default_factory=list)
    # of the drafter's files (core.hashing.drafter_hash); its heads record the same value. The loader
    # sets it from the listed (and verified) files, whatever was written
    content_hash: str | None = None
    alignment: dict[str, dict[str, float]] = field(default_factory=dict)  # domain -> {acceptance, agreement, positions}
    head: str | None = None  # the head load_head(drafter) picks (the best simulated one)
    # train-heads' best fixed K for this drafter at the serving transform (None: no heads; decoding.k serves)
    fixed_k: int | None = None
    # acceptance/<drafter>/ (acceptance_summary.json inside): its default head's dev acceptance statistics, what
    # `specdraft predict` simulates from (decoding/costs/throughput.py); absent in bundles exported before it
    acceptance: Path | None = field(default=None, metadata=OMIT)


@dataclass(frozen=True)
class HeadEntry:
    name: str = field(metadata=KEY)  # "<transform tag>/<head>"
    path: Path
    drafter: str
    depth: int
    w_rej: float
    threshold: float  # the chosen h
    label_transform: dict[str, Any]  # {temperature, top_k, top_p} the labels were made under
    k_max: int = 0
    best: bool = False
    simulated: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EagleEntry:
    """An EAGLE drafter (decoding/speculators/eagle_model.py): the projection and decoder layer only; the embedding
    and LM head are the target's, attached at load time."""

    name: str = field(metadata=KEY)
    path: Path  # absolute, inside the bundle
    parameters: int
    hidden_size: int
    vocab_size: int
    content_hash: str | None = None  # of its files; the loader computes it, like DrafterEntry's
    target_hash: str | None = None  # the content hash of the target it was trained on
    domains: list[str] = field(default_factory=list)
    alignment: dict[str, dict[str, float]] = field(default_factory=dict)
    tree: dict[str, int] = field(default_factory=dict)  # the EAGLE-2 tree shape to serve with: {depth, top_k, nodes}


@dataclass(frozen=True)
class RouterEntry:
    path: Path
    kind: str


@dataclass(frozen=True)
class DatastoreEntry:
    """The REST / suffix-decoding datastore (decoding/speculators/datastore.py): its datastore.json, plus where."""

    path: Path
    format: str
    tokens: int
    sequences: int
    bytes: int
    source: str = ""


@dataclass(frozen=True)
class BundleSpec:
    target: TargetEntry
    drafters: dict[str, DrafterEntry]
    heads: dict[str, dict[str, HeadEntry]]  # drafter -> head name -> entry
    # every number the decoder must not guess is written (defaults are for a config, not for a bundle);
    # cost_ratio always a number here: export resolves it from train-heads
    decoding: DecodingDefaults = field(metadata={"required": (
        "temperature", "top_k", "top_p", "k", "k_max", "selector", "max_new_tokens", "cost_ratio")})
    files: dict[str, str]  # relative path -> sha256, every file except bundle.json and the stage manifest
    routers: dict[str, RouterEntry] = field(default_factory=dict)
    chat: ChatFormat | None = field(default=None, metadata=OMIT)  # absent: the tokenizer's template
    datastore: DatastoreEntry | None = field(default=None, metadata=OMIT)
    eagle: dict[str, EagleEntry] = field(default_factory=dict, metadata=OMIT)
    format: str = FORMAT

    def __post_init__(self):
        if self.decoding.cost_ratio is None:  # bundles exported before the cost ratio was recorded
            raise InputError(f"{BUNDLE_JSON}: decoding has no cost_ratio (a bundle from an older specdraft); "
                             "re-export the bundle (`specdraft export`) to write it")
        try:
            self.decoding.check(f"{BUNDLE_JSON}: decoding")
        except InputError as e:
            raise InputError(f"{e}; re-export the bundle") from None
        self._check_relations()

    def _check_relations(self) -> None:
        """What each value alone cannot say: every reader of bundle.json (export's write, load_bundle,
        generate, evaluate) goes through here, so a contradictory bundle stops before anything runs."""
        def bad(what: str) -> InputError:
            return InputError(f"{BUNDLE_JSON}: {what}; re-export the bundle")

        from specdraft.decoding.cascades import method_from_spec

        try:  # the bundle's default cascade is built by generate and evaluate from this spec
            method_from_spec(self.decoding.cascade, "decoding.cascade")
        except InputError as e:
            raise bad(str(e)) from None

        def positive(value, what: str) -> None:
            if value < 1:
                raise bad(f"{what} must be >= 1, got {value}")

        positive(self.target.vocab_size, "target.vocab_size")
        for name, d in self.drafters.items():
            for attr in ("parameters", "hidden_size", "vocab_size"):
                positive(getattr(d, attr), f"drafters['{name}'].{attr}")
            if d.fixed_k is not None and not 1 <= d.fixed_k <= self.decoding.k_max:
                raise bad(f"drafters['{name}'].fixed_k ({d.fixed_k}) is outside 1..decoding.k_max "
                          f"({self.decoding.k_max})")
            if d.head is not None and d.head not in self.heads.get(name, {}):
                raise bad(f"drafters['{name}'].head names head '{d.head}', which heads['{name}'] lacks")
        for drafter, by_name in self.heads.items():
            if drafter not in self.drafters:
                raise bad(f"heads name drafter '{drafter}', which the bundle lacks")
            for name, h in by_name.items():
                where = f"heads['{drafter}']['{name}']"
                if h.drafter != drafter:
                    raise bad(f"{where}.drafter is '{h.drafter}' but it sits under drafter '{drafter}'")
                if not 0.0 < h.threshold < 1.0:
                    raise bad(f"{where}.threshold must be in (0, 1), got {h.threshold}")
                if h.depth < 0 or h.k_max < 0 or not h.w_rej > 0:
                    raise bad(f"{where} needs depth >= 0, k_max >= 0 and w_rej > 0, got depth {h.depth}, "
                              f"k_max {h.k_max}, w_rej {h.w_rej}")
                try:  # the transform its labels were made under; head_for compares the served one with it
                    from specdraft.decoding.rounds.sampling import SamplingConfig

                    lt = h.label_transform
                    SamplingConfig(lt["temperature"], lt["top_k"], lt["top_p"])
                except (InputError, KeyError, TypeError) as e:
                    raise bad(f"{where}.label_transform {str(h.label_transform)[:60]} is not a sampling "
                              f"transform ({type(e).__name__})") from None
        for name, e in self.eagle.items():
            for attr in ("parameters", "hidden_size", "vocab_size"):
                positive(getattr(e, attr), f"eagle['{name}'].{attr}")
            if e.tree and (set(e.tree) != {"depth", "top_k", "nodes"} or any(
                    isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in e.tree.values())):
                raise bad(f"eagle['{name}'].tree must be {{depth, top_k, nodes}} of integers >= 1, got {e.tree}")
        if self.datastore is not None and min(self.datastore.tokens, self.datastore.sequences,
                                              self.datastore.bytes) < 0:
            raise bad("datastore counts (tokens, sequences, bytes) must be >= 0")

    def to_json(self, root: Path) -> dict[str, Any]:
        """The bundle.json object, paths relative to root (the bundle directory)."""
        return _to_json(self, Path(root).resolve())

    @classmethod
    def from_json(cls, data: Any, root: Path) -> "BundleSpec":
        """Read a bundle.json object of the bundle at root; InputError (one line) on anything malformed."""
        root = Path(root).resolve()
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else None
            raise InputError(f"bundle format {got!r} is not supported (this specdraft reads {FORMAT!r}); "
                             "re-export the bundle with this version")
        files = data.get("files")
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise InputError(f"{BUNDLE_JSON}: 'files' must map relative paths to sha256 strings; re-export the bundle")
        for rel in files:  # every path is checked before anything else is read
            resolve_inside(root, rel, "file")
        return _from_json(cls, data, "", _Reader(root, files))


# ---- the two directions, driven by the dataclass fields' types ---------------------------------------


def _omitted(f, value) -> bool:
    if not f.metadata.get("omit"):
        return False
    return value == (f.default if f.default is not MISSING else f.default_factory())


def _to_json(value: Any, root: Path) -> Any:
    if is_dataclass(value):
        return {f.name: _to_json(getattr(value, f.name), root) for f in fields(value)
                if not f.metadata.get("key") and not _omitted(f, getattr(value, f.name))}
    if isinstance(value, Path):
        return value.resolve().relative_to(root).as_posix()
    if isinstance(value, dict):
        return {k: _to_json(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v, root) for v in value]
    return value


@dataclass(frozen=True)
class _Reader:
    root: Path
    files: dict[str, str]

    def component(self, rel: Any, where: str) -> Path:
        """A directory inside the bundle that holds at least one listed file."""
        path = resolve_inside(self.root, rel, where)
        prefix = rel.rstrip("/") + "/"
        if not any(k.startswith(prefix) for k in self.files):
            raise InputError(f"{BUNDLE_JSON}: {where} '{rel}' has no files listed; re-export the bundle")
        return path


_SCALARS = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}


def _mistyped(value: Any, where: str, want: str) -> InputError:
    return InputError(f"{BUNDLE_JSON}: {where} is {str(value)[:40]!r} ({type(value).__name__}), not {want}; "
                      "re-export the bundle")


def _from_json(tp: Any, value: Any, where: str, reader: _Reader) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):  # only `X | None` occurs
        return None if value is None else _from_json(next(a for a in args if a is not type(None)), value, where, reader)
    if tp is Any:
        return value
    if origin is typing.Literal:
        if value not in args:
            raise _mistyped(value, where, "one of " + ", ".join(map(str, args)))
        return value
    if tp is Path:
        return reader.component(value, where)
    if tp in _SCALARS:
        # bool is an int in Python, but never a count here; an int is a valid float and is kept as written
        ok = isinstance(value, tp) if tp in (str, bool) else (
            isinstance(value, int if tp is int else (int, float)) and not isinstance(value, bool))
        if not ok:
            raise _mistyped(value, where, _SCALARS[tp])
        return value
    if origin is list:
        if not isinstance(value, list):
            raise _mistyped(value, where, "a list")
        return [_from_json(args[0], v, f"{where}[{i}]", reader) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _mistyped(value, where, "an object")
        return {k: _dataclass_from_json(args[1], v, f"{where}['{k}']", reader, key=k) if is_dataclass(args[1])
                else _from_json(args[1], v, f"{where}['{k}']", reader) for k, v in value.items()}
    if is_dataclass(tp):
        return _dataclass_from_json(tp, value, where, reader)
    raise TypeError(f"bundle schema: no reader for {tp!r}")  # a schema bug, not bad input


def _dataclass_from_json(cls: type, value: Any, where: str, reader: _Reader, key: str | None = None,
                         require: tuple[str, ...] = ()) -> Any:
    hints = typing.get_type_hints(cls)
    own = [f for f in fields(cls) if not f.metadata.get("key")]
    required = [f.name for f in own if (f.default is MISSING and f.default_factory is MISSING) or f.name in require]
    if not isinstance(value, dict):
        raise InputError(f"{BUNDLE_JSON}: {where} lacks '{required[0] if required else 'its fields'}' "
                         f"(it is {type(value).__name__}, not an object); re-export the bundle")
    unknown = sorted(set(value) - {f.name for f in own})
    if unknown:
        raise InputError(f"{BUNDLE_JSON}: {where or 'the bundle'} has unknown field '{unknown[0]}' (a bundle from another "
                         "specdraft version?); re-export the bundle with this version")
    missing = [n for n in required if n not in value]
    if missing:
        raise InputError(f"{BUNDLE_JSON}: {where or 'the bundle'} lacks '{missing[0]}'; re-export the bundle with `specdraft export`")
    kwargs = {f.name: _dataclass_from_json(hints[f.name], value[f.name], f.name, reader, require=f.metadata["required"])
              if "required" in f.metadata else
              _from_json(hints[f.name], value[f.name], f"{where}.{f.name}" if where else f.name, reader)
              for f in own if f.name in value}
    kwargs.update({f.name: key for f in fields(cls) if f.metadata.get("key")})
    return cls(**kwargs)
