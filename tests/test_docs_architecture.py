"""docs/ARCHITECTURE.md as checked claims: every file, module, class and function it names exists.

Read from the checkout's source (``ast``, nothing imported), so a rename that forgets the docs
fails here. A code span is taken for a name of the project when it is
- a path ending in ``.py``, or a folder path of the repository (``nac_drive/pipeline/``,
  ``agents/``; a bare ``best/`` or ``trace.npz`` is a run's output, not the repository's);
- a dotted name whose first part is one of the project's modules, classes or packages
  (``wiring.sensory_gate_mask``, ``NAC.step``, ``nac_drive.agents``): each further part must
  be defined in what the part before it names;
- a CamelCase name, or a name called with ``()``, that the project defines (classes, functions,
  constants and methods) or imports (another library's class it builds on).
Anything else (math such as ``t_ij``, flags, other libraries' names) is prose.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
FOLDERS = ("nac_drive", "agents", "simulators", "data_collection", "interpret")
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(\(.*\))?")
CALL = re.compile(r"[A-Za-z_]\w*\(.*\)")
CAMEL = re.compile(r"[A-Z][a-z0-9]+[A-Z]\w*|[A-Z]{2,}[a-z]\w*")
DATA_SUFFIXES = {"json", "npz", "csv", "rrd", "html", "md", "toml", "safetensors", "zip", "txt", "mp4", "webm",
                 "h5", "hdf5", "jpg", "png", "sh", "log"}


class Index:
    """What the project's source defines, by the names a reader would use."""

    def __init__(self):
        self.members: dict[str, set[str]] = defaultdict(set)   # module / class / package -> names in it
        self.defined: set[str] = set()                         # every class, function, method, constant
        self.imported: set[str] = set()                        # every name the source imports
        self.files = {p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                      if ".git" not in p.parts and "__pycache__" not in p.parts}
        self.top_level = {p.name for p in ROOT.iterdir() if p.is_dir()}
        for folder in FOLDERS:
            package = "nac_drive" if folder == "nac_drive" else f"nac_drive.{folder}"
            for path in (ROOT / folder).rglob("*.py"):
                parts = path.relative_to(ROOT / folder).with_suffix("").parts
                dotted = ".".join((package, *parts))
                if parts[-1] == "__init__":
                    dotted = dotted.removesuffix(".__init__")
                self._add_module(dotted, ast.parse(path.read_text(encoding="utf-8")))

    def _add_module(self, dotted: str, tree: ast.Module) -> None:
        *parents, name = dotted.split(".")
        for i in range(1, len(parents) + 1):   # nac_drive -> agents -> ppo_lab -> env
            self.members[".".join(parents[:i])].add(parents[i] if i < len(parents) else name)
            self.members[parents[i - 1]].add(parents[i] if i < len(parents) else name)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.imported |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        for node in tree.body:
            for defined in self._definitions(node):
                self.members[name].add(defined)
                self.members[dotted].add(defined)
                self.defined.add(defined)
            if isinstance(node, ast.ClassDef):
                for item in ast.walk(node):
                    for defined in self._definitions(item):
                        self.members[node.name].add(defined)
                        self.defined.add(defined)
                    if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        self.members[node.name].add(item.attr)   # self.phi_tau_weight = ...

    @staticmethod
    def _definitions(node: ast.AST) -> list[str]:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [node.name]
        if isinstance(node, ast.ImportFrom):   # a module's imports are its attributes (a package re-exports)
            return [alias.asname or alias.name for alias in node.names]
        if isinstance(node, ast.Assign):
            return [t.id for t in node.targets if isinstance(t, ast.Name)]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return [node.target.id]
        return []

    def problem(self, span: str) -> str | None:
        """Why ``span`` names nothing the project has, or None (found, or not a name of it)."""
        if re.fullmatch(r"[\w./-]+\.py", span) or (re.fullmatch(r"[\w./-]+/", span) and (
                "/" in span[:-1] or span[:-1] in self.top_level)):
            path = span.rstrip("/")
            found = path in self.files or any(f.endswith("/" + path) for f in self.files)
            return None if found else f"no file or folder {span}"
        if "." in span and span.rsplit(".", 1)[1] in DATA_SUFFIXES:
            return None   # a data file's name (a run's output)
        if DOTTED.fullmatch(span):
            parts = span.split("(")[0].split(".")
            if parts[0] not in self.members:
                return None   # another library's name
            for owner, name in zip(parts, parts[1:]):
                if name not in self.members[owner]:
                    return f"{owner} defines no {name}"
            return None
        name = span.split("(")[0]
        if (CALL.fullmatch(span) or CAMEL.fullmatch(span)) and name.isidentifier():
            known = name in self.defined or name in self.members or name in self.imported
            return None if known else f"nothing defines {name}"
        return None


def code_spans(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)   # code blocks are examples, not claims
    return re.findall(r"`([^`\n]+)`", text)


def test_every_name_architecture_gives_exists():
    index = Index()
    spans = code_spans(ARCHITECTURE.read_text())
    problems = sorted({f"`{span}`: {why}" for span in spans if (why := index.problem(span))})
    assert problems == []
    assert len(spans) > 200


def test_the_checker_catches_a_renamed_file_module_class_and_method():
    index = Index()
    assert index.problem("agents/teacher.py") is None and index.problem("agents/no_such.py")
    assert index.problem("teacher.PurePursuitTeacher") is None
    assert index.problem("teacher.PurePursuitDriver") == "teacher defines no PurePursuitDriver"
    assert index.problem("PurePursuitTeacher.action_for") is None
    assert index.problem("PurePursuitTeacher.act_for") == "PurePursuitTeacher defines no act_for"
    assert index.problem("nac_drive.agents.ppo_lab") is None and index.problem("nac_drive.agents.lab")
    assert index.problem("RunTrace") is None and index.problem("RunTraces") == "nothing defines RunTraces"
    assert index.problem("select_action(obs)") is None and index.problem("select_actions(obs)")
    assert index.problem("t_ij") is None and index.problem("ncps.wirings.AutoNCP") is None   # prose, another library
    assert index.problem("nac_drive/pipeline/") is None and index.problem("nac_drive/pipelines/")
    assert index.problem("best/") is None and index.problem("trace.npz") is None   # a run's outputs
