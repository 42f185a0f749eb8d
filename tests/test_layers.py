"""Imports point one way: the model library <- data and simulators <- agents and
interpretation <- the pipeline (collect, train, DAgger, drive, evaluate) <- the CLI, which only
parses arguments (docs/ARCHITECTURE.md §1); and no module imports itself back through others.

Every ``import`` of the installed package is read from its source (function-level ones
too, where the heavy imports live; not those under ``if TYPE_CHECKING:``, which never run) and
each must go to its own layer or one below.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import nac_drive

PACKAGE = Path(nac_drive.__file__).parent

# layer of a module: the first rule whose prefix matches its dotted name
LAYERS = [
    ("nac_drive.cli", 4), ("nac_drive.__main__", 4),
    ("nac_drive.pipeline", 3),
    ("nac_drive.agents", 2), ("nac_drive.interpret", 2),
    ("nac_drive.data_collection", 1), ("nac_drive.simulators", 1),
    ("nac_drive", 0),
]
NAMES = {0: "model library", 1: "data and simulators", 2: "agents and interpretation", 3: "pipeline", 4: "CLI"}
# the folders installed under nac_drive: inside PACKAGE, or in the checkout for an editable install
MAPPED_ROOTS = {f"nac_drive.{name}": Path(importlib.util.find_spec(f"nac_drive.{name}").origin).parent
                for name in ("agents", "simulators", "data_collection", "interpret")}


def layer(module: str) -> int:
    for prefix, level in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return level
    raise AssertionError(f"{module}: not in the package")


def package_modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of the package (installed, or editable, where
    the mapped folders live outside ``nac_drive/``)."""
    roots = {"nac_drive": PACKAGE, **MAPPED_ROOTS}
    modules = {}
    for package, root in roots.items():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            dotted = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            modules.setdefault(dotted, path)
    return modules


def runtime_nodes(tree: ast.AST, type_checking: bool = False):
    """Every node of ``tree`` except what sits under ``if TYPE_CHECKING:`` (with
    ``type_checking``: every node)."""
    for node in ast.iter_child_nodes(tree):
        if not type_checking and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *runtime_nodes(child)])
            continue
        yield node
        yield from runtime_nodes(node, type_checking)


def package_imports(type_checking: bool = False) -> list[tuple[str, str]]:
    """(importing module, imported module) for every import of ``nac_drive.*`` in the package:
    relative imports resolved, and ``from package import name`` counted as an import of the
    submodule ``package.name`` when there is one; with ``type_checking``, those under
    ``if TYPE_CHECKING:`` too."""
    modules = package_modules()
    edges = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in runtime_nodes(ast.parse(path.read_text(encoding="utf-8")), type_checking):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:   # from . import x, from ..pipeline import y
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            edges += [(module, t) for t in targets if t == "nac_drive" or t.startswith("nac_drive.")]
    return edges


def test_the_walk_sees_every_layer():
    levels = {layer(a) for a, _ in package_imports()} | {layer(b) for _, b in package_imports()}
    assert levels == set(NAMES)
    assert layer("nac_drive.pipeline.train") == 3 and layer("nac_drive.pipelines") == 0   # a prefix ends at a dot


def test_no_import_points_up_a_layer():
    upward = sorted(f"{a} ({NAMES[layer(a)]}) imports {b} ({NAMES[layer(b)]})"
                    for a, b in package_imports() if layer(b) > layer(a))
    assert upward == []


def test_relative_and_submodule_imports_are_seen(tmp_path, monkeypatch):
    """A relative import or ``from package import submodule`` cannot hide an upward edge."""
    fake = tmp_path / "nac_drive"
    (fake / "pipeline").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "pipeline" / "__init__.py").write_text("")
    (fake / "pipeline" / "train.py").write_text("")
    (fake / "policy.py").write_text("from .pipeline import train\nfrom nac_drive.pipeline import train\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    monkeypatch.setattr(sys.modules[__name__], "MAPPED_ROOTS", {})
    assert sorted(package_imports()) == [("nac_drive.policy", "nac_drive.pipeline"),
                                         ("nac_drive.policy", "nac_drive.pipeline"),
                                         ("nac_drive.policy", "nac_drive.pipeline.train"),
                                         ("nac_drive.policy", "nac_drive.pipeline.train")]


def test_the_model_library_stands_alone():
    """The NAC layer, policy and checkpoints import nothing but the library (and no
    simulator, dataset or agent code), so they can be used without the rest."""
    library = {m for m in package_modules() if layer(m) == 0} - {"nac_drive"}
    assert {"nac_drive.nac", "nac_drive.nac.layer", "nac_drive.policy.driving_policy", "nac_drive.io.checkpoint",
            "nac_drive.policy.tasks"} <= library
    assert not [(a, b) for a, b in package_imports() if a in library and layer(b) > 0]


def import_cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module in the import graph (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return cycles


def module_edges(type_checking: bool = False) -> list[tuple[str, str]]:
    """Imports between two modules (a package's ``__init__`` counts when it is the target
    itself; importing a submodule runs its parents first, which is no edge of the importer's)."""
    modules = package_modules()
    return [(a, b) for a, b in package_imports(type_checking) if b in modules and a != b and b != "nac_drive"]


def test_no_import_cycles_function_level_ones_included():
    assert import_cycles(module_edges()) == []


def test_no_import_cycles_even_through_type_checking_imports():
    """A module that imports another only for its annotations still reads it: ``io/hub.py``
    typing ``PolicyConfig`` while ``policy/driving_policy.py`` imported it was a circle."""
    assert import_cycles(module_edges(type_checking=True)) == []


# the rooms of the model library, each importing only the rooms after it in this list
LIBRARY_ROOMS = ["nac_drive.policy", "nac_drive.io", "nac_drive.nac"]


def library_room(module: str) -> str:
    """The room of a model-library module (``nac_drive.policy.tasks`` -> ``nac_drive.policy``); a
    top-level module (``nac_drive.fields``) is a room of its own."""
    return ".".join(module.split(".")[:2])


def test_no_cycles_between_the_rooms_of_the_model_library():
    """Modules may avoid a circle that their rooms still make (``policy.driving_policy`` ->
    ``io.hub`` -> ``policy.tasks``): the import graph of the rooms has no cycle either."""
    library = {m for m in package_modules() if layer(m) == 0} - {"nac_drive"}
    edges = {(library_room(a), library_room(b)) for a, b in module_edges(type_checking=True)
             if a in library and b in library and library_room(a) != library_room(b)}
    assert import_cycles(edges) == []


def test_the_rooms_of_the_model_library_import_down_their_list():
    """``policy/`` builds on ``io/`` and ``nac/``; ``io/`` (checkpoints, the Hub) never reads the
    policy, and ``nac/`` imports nothing else of the package."""
    assert {library_room(m) for m in package_modules()} >= set(LIBRARY_ROOMS)
    upward = sorted({(a, b) for a, b in package_imports(type_checking=True)
                     if library_room(a) in LIBRARY_ROOMS and library_room(b) in LIBRARY_ROOMS
                     and LIBRARY_ROOMS.index(library_room(b)) < LIBRARY_ROOMS.index(library_room(a))})
    assert upward == []


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")]
    assert import_cycles(edges) == [["a", "b", "c"]]


NAC_ROOM = "nac_drive.nac"
# what the NAC room may import from outside itself (top-level names); numba only lazily
NAC_ROOM_THIRD_PARTY = {"__future__", "collections", "contextlib", "dataclasses", "functools", "math", "operator", "os",
                        "typing", "numpy", "torch", "ncps", "numba"}


def _in_room(module: str) -> bool:
    return module == NAC_ROOM or module.startswith(NAC_ROOM + ".")


def _top_level_imports(path: Path) -> set[str]:
    """The first component of every absolute import in a source file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
    return names


def test_the_nac_room_imports_nothing_else_of_the_package_and_no_simulator():
    """The layer can be lifted out with its folder: no edge leaves nac_drive/nac/ for the rest of
    nac_drive, and nothing in it imports gymnasium (or anything but torch, numpy, ncps, numba)."""
    modules = {m: path for m, path in package_modules().items() if _in_room(m)}
    assert {"nac_drive.nac.layer", "nac_drive.nac.packing", "nac_drive.nac.kernels",
            "nac_drive.nac.streaming", "nac_drive.nac.selection"} <= set(modules)
    assert [(a, b) for a, b in package_imports() if _in_room(a) and not _in_room(b)] == []
    for module, path in modules.items():
        outside = _top_level_imports(path) - NAC_ROOM_THIRD_PARTY - {"nac_drive"}
        assert outside == set(), f"{module} imports {sorted(outside)}"


def test_the_kernels_and_the_packing_never_import_the_layer():
    below_the_layer = {"nac_drive.nac.kernels", "nac_drive.nac._numba", "nac_drive.nac.packing",
                       "nac_drive.nac.selection", "nac_drive.nac.streaming"}
    reached = {(a, b) for a, b in package_imports() if a in below_the_layer and b in ("nac_drive.nac.layer", NAC_ROOM)}
    assert reached == set()


def test_the_nac_room_imports_its_modules_not_its_front_door():
    """Inside the room every import names a module of it, never ``nac_drive.nac`` itself (its
    ``__init__`` imports the layer): so the kernels cannot reach the layer by the back door."""
    assert [(a, b) for a, b in package_imports() if _in_room(a) and a != NAC_ROOM and b == NAC_ROOM] == []


def test_every_json_reader_parses_through_the_depth_bounded_helper():
    """``json.load(s)`` recurses once per level (a 100,000-deep file: RecursionError, "a bug");
    only :mod:`nac_drive.io.bounded_json` calls it, after counting the depth."""
    helper = "nac_drive.io.bounded_json"
    callers = sorted(
        module for module, path in package_modules().items() if module != helper
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if (isinstance(node, ast.Attribute) and node.attr in ("load", "loads", "JSONDecoder")
            and isinstance(node.value, ast.Name) and node.value.id == "json")
        or (isinstance(node, ast.ImportFrom) and node.module == "json"))
    assert callers == []
    assert helper in package_modules()
