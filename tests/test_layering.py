"""The package layering (README "Layout") holds: every import between the project's packages points
down, and the decoder stays free of Lightning."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "training", "decoding", "data", "drafters", "heads", "routers", "pipelines")
# package -> the project packages it may import
ALLOWED = {
    "core": set(),
    "training": {"core"},
    "decoding": {"core"},
    "data": {"core", "decoding"},  # the prompt formats the decoder serves with (decoding.bundle.chat)
    "drafters": {"core", "decoding"},
    "heads": {"core", "decoding", "drafters", "training"},
    "routers": {"core", "decoding", "drafters", "heads", "training"},
    "pipelines": {"core", "training", "decoding", "data", "drafters", "heads", "routers"},
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
    """`specdraft.decoding.rounds.kv` -> `decoding`; None for anything outside the project."""
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
        if any(p.startswith(".venv") for p in path.parts) or "runs" in path.parts:  # .venv-vllm too
            continue
        for module in imported_modules(path):
            if module.split(".")[0] in PACKAGES:
                bare.append(f"{path.relative_to(REPO)} imports {module}")
    assert bare == []


def test_the_decoder_and_the_bottom_layer_do_not_import_lightning():
    for package in ("core", "decoding"):
        for path in sorted((REPO / package).rglob("*.py")):
            assert not {m for m in imported_modules(path) if m.split(".")[0] in ("lightning", "pytorch_lightning")}, path


def test_the_decoder_holds_no_command():
    """decoding/ is a library (load a pair, decode a batch, generate text): arguments, files and printing
    belong to the commands in pipelines/ (generate, predict), so nothing in it parses a command line."""
    parsing = [str(path.relative_to(REPO)) for path in sorted((REPO / "decoding").rglob("*.py"))
               if {"argparse", "sys.argv"} & set(imported_modules(path)) or "sys.argv" in path.read_text()]
    assert parsing == []


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "x.py"
    bad.write_text("from specdraft.pipelines.training import build_trainer\nimport specdraft.decoding.rounds.kv as kv\n")
    assert imported_modules(bad) == {"specdraft.pipelines.training", "specdraft.decoding.rounds.kv"}
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


# --- the import graph of the project's own modules -------------------------------------------------------

def module_files(root: Path = REPO) -> dict[str, Path]:
    """`specdraft.pipelines.evaluate.plan` -> its file, for every module of the project's packages (a
    package is its __init__.py)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(("specdraft",) + (parts[:-1] if parts[-1] == "__init__" else parts))] = path
    return out


def _absolute(module: str, node: ast.ImportFrom, path: Path) -> str:
    """The absolute module an ImportFrom names (a relative one resolved against the importing file)."""
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return ".".join(p for p in (base, node.module) if p)


def import_edges(modules: dict[str, Path]) -> dict[str, dict[str, set[str]]]:
    """module -> {project module it imports -> the names it takes from it}, every import statement counted
    (at the top, inside a function, under TYPE_CHECKING): `from a import b` is an edge to the module a.b
    where that is a module, else to a (taking the name b); `import a.b` is an edge to a.b."""
    edges: dict[str, dict[str, set[str]]] = {m: {} for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules:
                        edges[module].setdefault(a.name, set())
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, node, path)
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        edges[module].setdefault(f"{base}.{a.name}", set())
                    elif base in modules:
                        edges[module].setdefault(base, set()).add(a.name)
    return edges


def cycles(edges: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (or a module importing itself), sorted:
    each is an import circle (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in edges.get(node, ()):
                    found.append(sorted(group))
    return sorted(found)


def stage_of(module: str, stage_modules: set[str]) -> str | None:
    """The stage module `module` is, or belongs to (a stage may be a package: its sub-modules are its own)."""
    for stage in stage_modules:
        if module == stage or module.startswith(stage + "."):
            return stage
    return None


def stage_imports(edges: dict[str, dict[str, set[str]]], stages: set[str]) -> list[str]:
    """Imports from a module of one stage into a module of another."""
    return sorted(f"{m} imports {t}" for m, targets in edges.items() for t in targets
                  if stage_of(m, stages) is not None and stage_of(t, stages) not in (None, stage_of(m, stages)))


def test_the_import_graph_has_no_cycle():
    """Not even through an import inside a function: a circle hidden by a lazy import is still a circle
    (each side needs the other to be understood, tested or moved)."""
    assert cycles(import_edges(module_files())) == []


def test_no_stage_imports_another_stage():
    """What two stages share lives below both (e.g. decoding/costs/calibration.py): a stage that imports another
    makes one stage's change break or re-run the other."""
    from specdraft.pipelines.stage import STAGES

    stages = {f"specdraft.pipelines.{s.module}" for s in STAGES}
    modules = module_files()
    assert stages <= set(modules)
    assert stage_imports(import_edges(modules), stages) == []


def private_uses(modules: dict[str, Path]) -> list[str]:
    """`from a import _x` and `a._x` (a bound to a project module by an import) across modules."""
    edges = import_edges(modules)
    found = [f"{m} imports {t}.{name}" for m, targets in edges.items() for t, names in targets.items()
             for name in sorted(names) if name.startswith("_") and not name.startswith("__") and t != m]
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        bound = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, node, path)
                bound.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names
                              if f"{base}.{a.name}" in modules})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"{module} uses {bound[node.value.id]}.{node.attr}")
    return sorted(found)


def test_no_module_takes_another_modules_private_names():
    assert private_uses(module_files()) == []


def test_the_graph_checks_see_a_hidden_circle_a_stage_import_and_a_private_name(tmp_path):
    """The three checks above on a made-up project: each finds what it is for."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "pipelines" / "__init__.py").write_text("")
    (tmp_path / "pipelines" / "report.py").write_text(
        "def render():\n    from specdraft.pipelines.verdicts import words  # lazy: hides the circle\n")
    (tmp_path / "pipelines" / "verdicts.py").write_text("from specdraft.pipelines.report import _fmt, render\n")
    (tmp_path / "pipelines" / "ev").mkdir()
    (tmp_path / "pipelines" / "ev" / "__init__.py").write_text("from .plan import Run\n")
    (tmp_path / "pipelines" / "ev" / "plan.py").write_text(
        "import specdraft.pipelines.heads_stage as hs\nx = hs._grid\n")
    (tmp_path / "pipelines" / "heads_stage.py").write_text("")
    modules = module_files(tmp_path)
    edges = import_edges(modules)
    assert set(edges["specdraft.pipelines.ev"]) == {"specdraft.pipelines.ev.plan"}  # relative import resolved
    assert cycles(edges) == [["specdraft.pipelines.report", "specdraft.pipelines.verdicts"]]
    stages = {"specdraft.pipelines.ev", "specdraft.pipelines.heads_stage"}
    assert stage_of("specdraft.pipelines.ev.plan", stages) == "specdraft.pipelines.ev"
    assert stage_of("specdraft.pipelines.heads_stage", stages) == "specdraft.pipelines.heads_stage"
    assert stage_of("specdraft.pipelines.report", stages) is None
    assert stage_imports(edges, stages) == ["specdraft.pipelines.ev.plan imports specdraft.pipelines.heads_stage"]
    assert private_uses(modules) == ["specdraft.pipelines.ev.plan uses specdraft.pipelines.heads_stage._grid",
                                     "specdraft.pipelines.verdicts imports specdraft.pipelines.report._fmt"]


# --- decoding/'s rooms ----------------------------------------------------------------------------------

# decoding/'s rooms from the bottom up: a module imports its own room and the rooms below it, never one above.
# A room is a sub-package, or a group of decoding/'s top-level modules, each named (a new one must be placed):
# the helpers every room may read, the defaults with the early checks, the loops (with what compiles, times and
# predicts them), the front door (load a pair, decode a batch, generate text; the commands live in pipelines/).
# Bandits (selectors, rewards) are plain arithmetic below the policy and the speculator that run them; the
# shapes a round takes (rounds/shapes.py) sit below both the loop and the policies that price it. The decoding defaults (defaults.py: K, K_max, h, c, the sampling transform, the
# compile modes) check their sampling against rounds/ and their selector against bandits/, and are read by
# the policies, the loops and the bundle that carries them: they sit above the first two, below the rest,
# with the early checks (compat.py) that share their threshold test.
DECODING_ROOMS = (
    ("helpers", {"checkpoint", "metrics", "timing"}),
    ("rounds", {"rounds"}),
    ("bandits", {"bandits"}),
    ("defaults", {"defaults", "compat"}),
    ("policies", {"policies"}),
    ("speculators", {"speculators"}),
    ("loops", {"autoregressive", "speculative", "batched", "cascades", "compilation", "near_ties"}),
    ("costs", {"costs"}),
    ("bundle", {"bundle"}),
    ("front door", {"generate"}),
)

def decoding_room(module: str, rooms=DECODING_ROOMS) -> str | None:
    """`specdraft.decoding.policies.stopping` -> "policies"; None outside decoding/'s modules (or the package
    itself), "?" for a module no room names."""
    parts = module.split(".")
    if parts[:2] != ["specdraft", "decoding"] or len(parts) < 3:
        return None
    return next((room for room, members in rooms if parts[2] in members), "?")


def room_graph(edges: dict[str, dict[str, set[str]]], rooms=DECODING_ROOMS) -> dict[str, dict[str, set[str]]]:
    """room -> {another room it imports -> the module imports behind that}."""
    graph: dict[str, dict[str, set[str]]] = {room: {} for room, _ in rooms}
    for module, targets in edges.items():
        here = decoding_room(module, rooms)
        for target in targets:
            there = decoding_room(target, rooms)
            if here not in (None, "?") and there not in (None, "?", here):
                graph[here].setdefault(there, set()).add(f"{module} imports {target}")
    return graph


def upward_imports(edges: dict[str, dict[str, set[str]]], rooms=DECODING_ROOMS) -> list[str]:
    rank = {room: i for i, (room, _) in enumerate(rooms)}
    return sorted(i for here, out in room_graph(edges, rooms).items() for there, imports in out.items()
                  if rank[there] > rank[here] for i in imports)


def test_every_decoding_module_has_a_room():
    assert [m for m in module_files() if decoding_room(m) == "?"] == []


def test_decodings_rooms_import_down_and_form_no_circle():
    """Not even through an import inside a function, as for modules (test_the_import_graph_has_no_cycle)."""
    edges = import_edges(module_files())
    assert upward_imports(edges) == []
    assert cycles(room_graph(edges)) == []


def test_the_room_checks_see_an_upward_import_and_a_circle(tmp_path):
    """On a made-up decoding/: a policy importing the loop is an upward import and, with the loop importing it
    back, a circle between the rooms (one the module graph alone would also see); a sibling's import is fine."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "decoding" / "policies").mkdir()
    (tmp_path / "decoding" / "policies" / "__init__.py").write_text("")
    (tmp_path / "decoding" / "policies" / "rule.py").write_text(
        "def price():\n    from specdraft.decoding.batched import round_feeds\n")
    (tmp_path / "decoding" / "batched.py").write_text(
        "from specdraft.decoding.policies.rule import price\nfrom specdraft.decoding.speculative import x\n")
    (tmp_path / "decoding" / "speculative.py").write_text("")
    rooms = (("policies", {"policies"}), ("loops", {"batched", "speculative"}))
    edges = import_edges(module_files(tmp_path))
    assert decoding_room("specdraft.decoding.policies.rule", rooms) == "policies"
    assert decoding_room("specdraft.decoding.timing", rooms) == "?" and decoding_room("specdraft.core.x", rooms) is None
    assert upward_imports(edges, rooms) == ["specdraft.decoding.policies.rule imports specdraft.decoding.batched"]
    assert cycles(room_graph(edges, rooms)) == [["loops", "policies"]]


# --- sizes and citations -------------------------------------------------------------------------------

LONGEST_FUNCTION = 80  # lines, def to last line: a step a reader holds in view; longer ones split into named steps


def long_functions(paths, root: Path = REPO) -> list[str]:
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_product_or_benchmark_function_runs_over_80_lines():
    paths = [p for package in (*PACKAGES, "benchmarks") for p in sorted((REPO / package).rglob("*.py"))]
    assert long_functions(paths) == []


def test_the_size_check_sees_a_long_function(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * 80 + "\n\ndef g():\n" + "    x = 1\n" * 79)
    assert long_functions([tmp_path / "m.py"], tmp_path) == ["m.py:1 f (81 lines)"]


def test_docs_and_code_cite_the_projects_own_algorithms_page():
    """The algorithms the code cites are written up in docs/algorithms.md; a file outside the repository is
    no citation a user can follow. RESULTS.md holds each benchmark's current run, its history is git's."""
    places = [REPO / "README.md", *(p for top in (*PACKAGES, "benchmarks", "docs", "tests", "configs", "slurm")
                                      for p in sorted((REPO / top).rglob("*")) if p.suffix in (".py", ".md"))]
    cited = [str(p.relative_to(REPO)) for p in places if "SPEC" + ".md" in p.read_text(errors="ignore")]
    assert cited == []
    for page in sorted((REPO / "benchmarks").glob("*/RESULTS.md")):
        results = page.read_text().lower()
        assert "the run before" not in results and "before those:" not in results, page
