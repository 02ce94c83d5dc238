"""Typed configs: YAML mapped onto dataclasses, strictly.

The YAML mirrors the dataclasses field for field (litgpt style). Loading is strict: an unknown key is
an error naming the key and the closest valid one, a wrong type is an error naming the field. Both are
`ConfigError` (an `InputError`), which the CLI prints as one line with exit code 2 before anything is
written.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from specdraft.core.errors import InputError

# sections that moved, old dotted key -> new: a config written for an earlier specdraft says where to go
MOVED = {"export.decoding": "decoding"}


class ConfigError(InputError):
    pass


# --------------------------------------------------------------------------- typed loading


def _closest(name: str, valid: list[str]) -> str:
    match = difflib.get_close_matches(name, valid, n=1, cutoff=0.0)
    return match[0] if match else ""


# the fix a wrong-typed value gets: where to look up the type the key takes
_TYPE_FIX = "; write a value of that type (`specdraft config --defaults` lists every key's type)"


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(tp: Any, value: Any, where: str) -> Any:
    """Check `value` against the annotation `tp` and build nested dataclasses."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, where)
            except ConfigError:
                pass
        raise ConfigError(f"config field '{where}' has the wrong type: expected {_type_name(tp)}, got {value!r}{_TYPE_FIX}")
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            hint = _closest(str(value), [str(a) for a in args])
            raise ConfigError(f"config field '{where}' must be one of {choices}, got {value!r} (did you mean {hint!r}?)")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, str) and hasattr(tp, "from_preset"):  # a section named by its preset
            try:
                return tp.from_preset(value)
            except InputError as e:
                raise ConfigError(f"config field '{where}': {e}") from None
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config field '{where}' has the wrong type: expected a list, got {value!r}{_TYPE_FIX}")
        item = args[0] if args else Any
        out = [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config field '{where}' has the wrong type: expected a mapping, got {value!r}{_TYPE_FIX}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config field '{where}' has the wrong type: expected true/false, got {value!r}{_TYPE_FIX}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config field '{where}' has the wrong type: expected an integer, got {value!r}{_TYPE_FIX}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config field '{where}' has the wrong type: expected a number, got {value!r}{_TYPE_FIX}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config field '{where}' has the wrong type: expected a string, got {value!r}{_TYPE_FIX}")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} at {where}")  # a bug in our dataclasses


def _merge(base: dict, given: dict) -> dict:
    out = dict(base)
    for k, v in given.items():
        out[k] = _merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def _over_default(f: dataclasses.Field, value: Any) -> Any:
    """A partial mapping for a nested section fills in the field's own default instance, not the
    section class's bare defaults (e.g. `train: {max_steps: 7}` keeps the stage's batch size). A key the mapping
    gives never loses to a default it would otherwise lose to: the section class's GIVEN_IMPLIES names what a given
    key resets when the mapping leaves it out (`train: {max_epochs: 2}` over a default of max_steps 200 trains two
    epochs, not 200 steps)."""
    if isinstance(value, dict) and f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
        if dataclasses.is_dataclass(default):
            return _given_over(default, value)
    return value


def _given_over(default: Any, given: dict) -> dict:
    """The dataclass instance `default` as a mapping with `given` merged in, section by section, each section's
    GIVEN_IMPLIES applied (keys `given` does not know stay, for from_dict to name)."""
    base = dataclasses.asdict(default)
    for key, implied in getattr(type(default), "GIVEN_IMPLIES", {}).items():
        if key in given:
            base.update({k: v for k, v in implied.items() if k not in given})
    sections = {k: _given_over(getattr(default, k), v) for k, v in given.items()
                if isinstance(v, dict) and dataclasses.is_dataclass(getattr(default, k, None))}
    return _merge(base, {**given, **sections})


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from a plain mapping, strictly (see module docstring)."""
    prefix = f"{where}." if where else ""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{where or '<root>'}' must be a mapping, got {data!r}; write it as "
                          "indented key: value lines")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if f"{prefix}{key}" in MOVED:
            raise ConfigError(f"'{prefix}{key}' is now the top-level section '{MOVED[f'{prefix}{key}']}'; move it there")
        if key not in fields:
            hint = _closest(str(key), list(fields))
            raise ConfigError(f"unknown config key '{prefix}{key}'; did you mean '{prefix}{hint}'?")
    kwargs = {k: _coerce(hints[k], _over_default(fields[k], v), f"{prefix}{k}") for k, v in data.items()}
    missing = [n for n, f in fields.items() if n not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"config section '{where or '<root>'}' lacks {', '.join(repr(m) for m in missing)}; "
                          "give every one (`specdraft config --defaults` lists them)")
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if callable(check):
        check()
    return obj


def to_dict(obj: Any) -> Any:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """`a.b.c=value` pairs (value parsed as YAML) set into a nested mapping."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key.path=value; write e.g. run.seed=1")
        path, raw = item.split("=", 1)
        try:
            value = yaml.load(raw, Loader=_StrictLoader) if raw != "" else ""
        except yaml.YAMLError:
            raise ConfigError(f"override '{item}': the value is not valid YAML; quote it, e.g. "
                              f"{path}='\"...\"'") from None
        except RecursionError:
            raise ConfigError(f"override '{item}': the value nests too deeply; give a flat value") from None
        node = data
        parts = path.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override '{item}': '{path}' has an empty key; write key.path=value, e.g. "
                              "run.seed=1")
        for part in parts[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override '{item}': '{part}' is not a section")
            node = nxt
        node[parts[-1]] = value
    return data


class _StrictLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error: PyYAML keeps the
    later value silently, so a duplicated section would quietly drop half of a config."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConfigError(f"config key '{key}' is given twice (lines {seen[key]} and {line}) in "
                              f"'{loader.name}'; keep one")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
# PyYAML reads YAML 1.1, whose floats need a dot: `lr: 1e-3` would be the string '1e-3' and fail the
# schema's number check. Read exponent forms as numbers, as YAML 1.2 (and every user) does.
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file '{path}' is a directory; pass a YAML file (see configs/)")
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist; pass an existing YAML file (see configs/)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file '{path}' cannot be read as UTF-8 text ({type(e).__name__}); "
                          f"pass a YAML file") from None
    if not text.strip():
        raise ConfigError(f"config file '{path}' is empty; start from configs/demo.yaml "
                          f"(`specdraft run` with no changes needs at least `run: {{}}`)")
    try:
        loader = _StrictLoader(text)
        loader.name = str(path)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file '{path}' is not valid YAML{where}; fix the syntax") from None
    except RecursionError:
        raise ConfigError(f"config file '{path}' nests too deeply to be a config; fix the file") from None
    if data is None:  # only comments
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping at the top level, got "
                          f"{type(data).__name__}")
    return data


def load_with_base(path: str | Path, seen: tuple[Path, ...] = ()) -> dict:
    """A YAML file whose top-level `base: OTHER.yaml` (relative to the file) names a config it changes:
    OTHER's mapping with this file's keys merged over it, section by section (lists are replaced). A run
    that differs from the demo in one section (configs/reproduce.yaml) says only that, and cannot drift
    from the demo's training sections."""
    path = Path(path)
    data = load_yaml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"config file '{path}': base must be a YAML file name, got {base!r}")
    base_path = (path.parent / base).resolve()
    if base_path in seen or base_path == path.resolve():
        raise ConfigError(f"config file '{path}': base '{base}' leads back to itself; remove the cycle")
    return _merge(load_with_base(base_path, (*seen, path.resolve())), data)


def load_config(cls: type, path: str | Path | None, overrides: list[str] = ()) -> Any:
    data = load_with_base(path) if path is not None else {}
    try:
        return from_dict(cls, apply_overrides(data, list(overrides)))
    except InputError as e:  # a key's problem is found in the mapping: say which file (or overrides) held it
        if path is None or str(path) in str(e):
            raise
        raise ConfigError(f"{path}{' with its overrides' if overrides else ''}: {e}") from None
