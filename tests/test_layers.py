"""Imports point one way: the model library <- data and simulators <- agents and
interpretation <- the pipeline (collect, train, DAgger, drive, evaluate) <- the CLI, which only
parses arguments (docs/ARCHITECTURE.md §1).

Every ``import`` of the installed package is read from its source (function-level ones
too, where the heavy imports live) and each must go to its own layer or one below.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import nac_drive

PACKAGE = Path(nac_drive.__file__).parent

# layer of a module: the first rule whose prefix matches its dotted name
LAYERS = [
    ("nac_drive.commands", 4), ("nac_drive.cli", 4), ("nac_drive.__main__", 4),
    ("nac_drive.pipeline", 3),
    ("nac_drive.agents", 2), ("nac_drive.interpret", 2),
    ("nac_drive.data_collection", 1), ("nac_drive.simulators", 1),
    ("nac_drive", 0),
]
NAMES = {0: "model library", 1: "data and simulators", 2: "agents and interpretation", 3: "pipeline", 4: "CLI"}
# importing the package registers its gymnasium env id: gymnasium's convention, so the
# package's front door reaches the simulator that defines it
FRONT_DOOR = {("nac_drive", "nac_drive.simulators.udacity_env")}


def layer(module: str) -> int:
    for prefix, level in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return level
    raise AssertionError(f"{module}: not in the package")


def package_modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of the installed package."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def package_imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every import of ``nac_drive.*`` in the package:
    relative imports resolved, and ``from package import name`` counted as an import of the
    submodule ``package.name`` when there is one."""
    modules = package_modules()
    edges = []
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
                    for a, b in package_imports() if layer(b) > layer(a) and (a, b) not in FRONT_DOOR)
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
    assert sorted(package_imports()) == [("nac_drive.policy", "nac_drive.pipeline"),
                                         ("nac_drive.policy", "nac_drive.pipeline"),
                                         ("nac_drive.policy", "nac_drive.pipeline.train"),
                                         ("nac_drive.policy", "nac_drive.pipeline.train")]


def test_the_model_library_stands_alone():
    """The NAC layer, policy and checkpoints import nothing but the library (and no
    simulator, dataset or agent code), so they can be used without the rest."""
    library = {m for m in package_modules() if layer(m) == 0} - {"nac_drive"}
    assert {"nac_drive.nac", "nac_drive.nac.layer", "nac_drive.policy", "nac_drive.checkpoint",
            "nac_drive.tasks"} <= library
    assert not [(a, b) for a, b in package_imports() if a in library and layer(b) > 0]


NAC_ROOM = "nac_drive.nac"
# what the NAC room may import from outside itself (top-level names); numba only lazily
NAC_ROOM_THIRD_PARTY = {"__future__", "collections", "contextlib", "dataclasses", "functools", "math", "os",
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


def test_the_nac_room_has_no_import_cycle():
    """Inside the room every import names a module of it (never the package's front door,
    which imports the layer), and following them never comes back to where it started."""
    edges = {}
    for a, b in package_imports():
        if _in_room(a) and _in_room(b) and a != NAC_ROOM:
            assert b != NAC_ROOM, f"{a} imports the room's __init__; import the module itself"
            edges.setdefault(a, set()).add(b)
    done, path = set(), []

    def visit(module: str) -> None:
        assert module not in path, "import cycle: " + " -> ".join(path[path.index(module):] + [module])
        if module in done:
            return
        path.append(module)
        for target in edges.get(module, ()):
            visit(target)
        path.pop()
        done.add(module)

    for module in edges:
        visit(module)
    assert "nac_drive.nac.layer" in done
