"""The package layering (README "Layout") holds: every import between the project's packages points
down, and the decoder stays free of Lightning."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "training", "decoding", "data", "drafters", "heads", "pipelines")
# package -> the project packages it may import
ALLOWED = {
    "core": set(),
    "training": {"core"},
    "decoding": {"core"},
    "data": {"core", "decoding"},  # the prompt formats the decoder serves with (decoding.chat)
    "drafters": {"core", "decoding"},
    "heads": {"core", "decoding", "drafters", "training"},
    "pipelines": {"core", "training", "decoding", "data", "drafters", "heads"},
}


def imported_modules(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def project_package(module: str) -> str | None:
    """`specdraft.decoding.kv` -> `decoding`; None for anything outside the project."""
    parts = module.split(".")
    return parts[1] if parts[0] == "specdraft" and len(parts) > 1 and parts[1] in PACKAGES else None


def test_imports_point_down_the_layers():
    wrong = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for module in imported_modules(path):
                top = project_package(module)
                if top is not None and top != package and top not in ALLOWED[package]:
                    wrong.append(f"{path.relative_to(REPO)} imports {module}")
    assert wrong == []


def test_every_import_of_the_project_goes_through_its_namespace():
    """The installed package is `specdraft.*`: a bare `import data` or `from decoding import x` would
    work from a checkout (the repository root on sys.path) and break, or pick up a stranger's package,
    once installed."""
    bare = []
    for path in sorted(REPO.rglob("*.py")):
        if ".venv" in path.parts or "runs" in path.parts:
            continue
        for module in imported_modules(path):
            if module.split(".")[0] in PACKAGES:
                bare.append(f"{path.relative_to(REPO)} imports {module}")
    assert bare == []


def test_the_decoder_and_the_bottom_layer_do_not_import_lightning():
    for package in ("core", "decoding"):
        for path in sorted((REPO / package).rglob("*.py")):
            assert not {m for m in imported_modules(path) if m.split(".")[0] in ("lightning", "pytorch_lightning")}, path


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from specdraft.pipelines.training import build_trainer\nimport specdraft.decoding.kv as kv\n")
    assert imported_modules(bad) == {"specdraft.pipelines.training", "specdraft.decoding.kv"}
    assert [project_package(m) for m in sorted(imported_modules(bad))] == ["decoding", "pipelines"]


def test_every_package_folder_is_installed_under_the_namespace():
    """pyproject lists each installed package by hand (the package-dir mapping has no find): a new
    sub-package (a folder with __init__.py) that is not listed would import from a checkout and be
    missing from a wheel."""
    import tomllib

    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"specdraft." + ".".join(p.parent.relative_to(REPO).parts)
               for package in PACKAGES for p in (REPO / package).rglob("__init__.py")}
    assert set(setup["packages"]) == folders
    assert all(setup["package-dir"][f"specdraft.{p}"] == p for p in PACKAGES)
