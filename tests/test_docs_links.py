"""README.md and the pages of docs/ as checked claims: every relative link leads to a file of the
repository (and, with a ``#fragment``, to a heading of that page), every repository file or folder
they name exists, and the README stays short (issue 56: <= 250 lines, the rest in docs/).

Read from the checkout, nothing imported. A name counts as a repository path when it starts with
one of the repository's top-level folders (``interpret/trace.py``, ``benchmarks/recipes/*.sh``,
``tests/support/``) and ends in a file suffix or ``/``, or is a top-level file (``BENCHMARKS.md``,
``pyproject.toml``). A path inside another (``runs/demos/nac_drive/...``), a quoted id
(``"nac_drive/UdacityEmulator-v0"``) or a run's output (``best/``, ``trace.npz``) is not one.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250

LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FOLDERS = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".git")
                 and p.name not in {"build", "dist", "runs"} and not p.name.endswith(".egg-info"))
PATH = re.compile(r"(?<![\w./\"'<>-])((?:%s)/[\w.*/-]*)" % "|".join(re.escape(f) for f in FOLDERS))
TOP_FILE = re.compile(r"(?<![\w./\"'-])([A-Z]+\.md|pyproject\.toml|MANIFEST\.in|LICENSE)(?![\w./-])")


def without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    found, seen = set(), {}
    for line in without_code_blocks(text).splitlines():
        if m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return found


def broken_links(page: Path, text: str) -> list[str]:
    """The relative links of ``text`` (the content of ``page``) that lead nowhere."""
    broken = []
    for target in LINK.findall(without_code_blocks(text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):   # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md":
            heads = anchors(text if dest == page else dest.read_text(encoding="utf-8"))
            if fragment not in heads:
                broken.append(f"{target}: no heading #{fragment}")
    return broken


def named_paths(text: str) -> set[str]:
    found = set()
    for name in PATH.findall(text):
        name = name.rstrip(".-")
        last = name.rstrip("/").rsplit("/", 1)[-1]
        if name.endswith("/") or re.search(r"\.\w+$", last) or name.startswith(".ci/"):
            found.add(name)
    return found | set(TOP_FILE.findall(text))


def missing_paths(text: str, folder: Path = ROOT) -> list[str]:
    """The repository files and folders ``text`` names that the repository lacks (a bare file name
    such as ``ARCHITECTURE.md`` may also be one beside the page, in ``folder``)."""
    return sorted(name for name in named_paths(text)
                  if not any(ROOT.glob(name.rstrip("/"))) and not (folder / name).is_file())


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_every_relative_link_leads_to_a_file_and_heading():
    problems = [f"{page.relative_to(ROOT)}: {why}" for page in PAGES
                for why in broken_links(page, page.read_text(encoding="utf-8"))]
    assert problems == []
    assert sum(len(LINK.findall(p.read_text(encoding="utf-8"))) for p in PAGES) > 50


def test_every_repository_path_the_docs_name_exists():
    problems = [f"{page.relative_to(ROOT)}: {name}" for page in PAGES
                for name in missing_paths(page.read_text(encoding="utf-8"), page.parent)]
    assert problems == []
    named = set().union(*(named_paths(p.read_text(encoding="utf-8")) for p in PAGES))
    assert {"interpret/live_view.py", "tests/conftest.py", "BENCHMARKS.md"} <= named


def test_the_readme_links_every_page_of_docs():
    readme = README.read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    assert {f"docs/{p.name}" for p in PAGES[1:]} <= linked


def test_the_checks_catch_a_broken_link_a_missing_heading_and_a_missing_file():
    page = ROOT / "docs" / "cli.md"
    assert broken_links(page, "[x](python-api.md) [y](../README.md#limits) [z](https://a.b/c)") == []
    assert broken_links(page, "[x](pyhton-api.md)") == ["pyhton-api.md: no such file"]
    assert broken_links(page, "[x](python-api.md#the-nac-layers)") == [
        "python-api.md#the-nac-layers: no heading #the-nac-layers"]
    assert broken_links(page, "## A b, c\n[x](#a-b-c) [y](#a-b)") == ["#a-b: no heading #a-b"]
    assert broken_links(page, "[x](../../outside.md)") == ["../../outside.md: no such file"]
    text = ("`interpret/live_view.py`, `nac_drive/interpret/live_view.py`, benchmarks/recipes/*.sh, "
            "`tests/support/`, `.ci/run`, `.ci/runs`, BENCHMARKS.md, NOTES.md, runs/demos/nac_drive/x/seeds-1-2-v1, "
            '"nac_drive/UdacityEmulator-v0", best/README.md, `agents/teacher.py`.')
    assert missing_paths(text) == [".ci/runs", "NOTES.md", "nac_drive/interpret/live_view.py"]
    assert missing_paths("ARCHITECTURE.md") == ["ARCHITECTURE.md"]
    assert missing_paths("ARCHITECTURE.md", ROOT / "docs") == []
    assert slug("3. The NAC layer, equation by equation") == "3-the-nac-layer-equation-by-equation"
    assert slug("`quickstart --full`: the recipe") == "quickstart---full-the-recipe"


def test_every_flag_of_a_docs_command_is_one_its_verb_accepts():
    # the commands README.md and the guides give (findings.md is a log of what was run then)
    from test_docs_report import commands, unknown_flags

    found = [c for page in PAGES if page.name != "findings.md"
             for c in commands(page.read_text(encoding="utf-8").splitlines())
             if c.startswith("nac-drive ") and not c.startswith("nac-drive VERB")]
    assert len(found) >= 60
    assert [flag for command in found for flag in unknown_flags(command)] == []
