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


def test_imports_point_down_the_layers():
    wrong = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for module in imported_modules(path):
                top = module.split(".")[0]
                if top in PACKAGES and top != package and top not in ALLOWED[package]:
                    wrong.append(f"{path.relative_to(REPO)} imports {module}")
    assert wrong == []


def test_the_decoder_and_the_bottom_layer_do_not_import_lightning():
    for package in ("core", "decoding"):
        for path in sorted((REPO / package).rglob("*.py")):
            assert not {m for m in imported_modules(path) if m.split(".")[0] in ("lightning", "pytorch_lightning")}, path


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from pipelines.training import build_trainer\nimport decoding.kv as kv\n")
    assert imported_modules(bad) == {"pipelines.training", "decoding.kv"}
