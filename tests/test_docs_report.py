"""BENCHMARKS.md is a report: short, every table with the command that produced it, and every
command it or a recipe (``benchmarks/recipes/*.sh``) gives runs as written: the scripts exist and
each flag is one the installed CLI's verb (or the benchmark script) accepts."""

import functools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_parsers import parser_of

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "BENCHMARKS.md"
FINDINGS = ROOT / "docs" / "findings.md"
RECIPES = sorted((ROOT / "benchmarks" / "recipes").glob("*.sh"))
MAX_LINES = 300
COMMAND = re.compile(r"^(nac-drive |python benchmarks/|bash benchmarks/recipes/)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def sections(text: str) -> list[list[str]]:
    """The report's lines cut at every heading (a heading starts its section)."""
    cut, fenced = [[]], False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            cut.append([])
        cut[-1].append(line)
    return cut


def commands(lines: list[str]) -> list[str]:
    """The commands ``lines`` give: code spans, and the lines of fenced blocks, that start with a
    command (continued lines joined)."""
    found, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if found and found[-1].endswith("\\"):
                found[-1] = found[-1][:-1] + line.strip()
            elif COMMAND.match(line.strip()):
                found.append(line.strip())
        else:
            found += [span for span in re.findall(r"`([^`]+)`", line) if COMMAND.match(span)]
    return found


def tables(lines: list[str]) -> list[tuple[int, int]]:
    """(first, last + 1) line of every Markdown table in ``lines``."""
    spans, start = [], None
    for i, line in enumerate(lines + [""]):
        if line.startswith("|") and start is None:
            start = i
        elif not line.startswith("|") and start is not None:
            spans.append((start, i))
            start = None
    return spans


def tables_without_command(text: str) -> list[str]:
    """The first row of each table that has no command of its own: none in its rows, nor between
    it and the table (or heading) before it, nor between it and the table (or heading) after it."""
    missing = []
    for lines in sections(text):
        spans = tables(lines)
        for k, (first, end) in enumerate(spans):
            before = lines[spans[k - 1][1] if k else 0:first]
            after = lines[end:spans[k + 1][0] if k + 1 < len(spans) else len(lines)]
            if not (commands(lines[first:end]) or commands(before) or commands(after)):
                missing.append(lines[first])
    return missing


def test_the_report_is_short_and_every_table_has_its_command():
    text = REPORT.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"BENCHMARKS.md has {len(text.splitlines())} lines"
    assert len(tables(text.splitlines())) >= 10
    assert tables_without_command(text) == []


def test_the_table_check_finds_a_table_without_its_command():
    """The check above can fail: a table whose command sits beyond another table is caught."""
    text = "## 1. x\n\n`nac-drive drive carracing --json`\n\n| a |\n|---|\n| 1 |\n\ntext\n\n| b |\n|---|\n| 2 |\n"
    assert tables_without_command(text) == ["| b |"]
    assert tables_without_command(text.replace("text", "```bash\npython benchmarks/x.py\n```")) == []


def test_reports_name_no_files_outside_the_repository():
    """No checkpoint that only a past commit holds, no `git show` to dig it out: say the commit."""
    for path in (REPORT, FINDINGS):
        text = path.read_text()
        assert "checkpoints/" not in text and "git show" not in text, path
        assert "../shared" not in text and "/work/" not in text, path


def test_every_script_and_recipe_the_report_names_exists():
    text = REPORT.read_text() + FINDINGS.read_text()
    named = set(re.findall(r"benchmarks/[\w/.-]+\.(?:py|sh)", text))
    assert {"benchmarks/nac_layer.py", "benchmarks/recipes/ppo_expert.sh"} <= named
    assert [name for name in sorted(named) if not (ROOT / name).is_file()] == []
    for recipe in RECIPES:   # and the report says where each recipe's asset comes from
        assert f"benchmarks/recipes/{recipe.name}" in REPORT.read_text(), recipe.name


@functools.cache
def usage(*argv: str) -> str:
    """The usage lines of ``argv --help``, ``argv`` a program and verb: ``nac-drive expert train``,
    ``python benchmarks/x.py`` (argparse lists every option there). The CLI's from its parser in
    this process (a process per verb cost its imports), a script's from a run of it."""
    if argv[0] == "nac-drive":
        return parser_of(argv).format_help().split("\n\n")[0]
    # a benchmark script: its own folder goes first on its path (support_path.py), which conftest's safe path stops
    env = {name: value for name, value in os.environ.items() if name != "PYTHONSAFEPATH"}
    done = subprocess.run([sys.executable, *argv[1:], "--help"], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)
    assert done.returncode == 0, (argv, done.stderr[-2000:])
    return done.stdout.split("\n\n")[0]


def unknown_flags(command: str) -> list[str]:
    """The flags of ``command`` that its verb does not list."""
    words = shlex.split(command, comments=True)
    verb = tuple(words[:2])
    if verb[0] == "nac-drive" and usage(*verb).rstrip().endswith("..."):
        verb = tuple(words[:3])   # a verb of subcommands: collect carracing, expert train, ...
    accepted = set(FLAG.findall(usage(*verb)))
    return [f"{' '.join(verb)} {flag}" for flag in FLAG.findall(" ".join(words[len(verb):])) if flag not in accepted]


def recipe_commands(path: Path) -> list[str]:
    """Every ``nac-drive`` command of a recipe, continued lines joined, comments left out; a call of
    lib.bash's ``resumed_train OUT RUN FLAGS...`` as the ``nac-drive train FLAGS...`` it runs."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    found = []
    for line in text.splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#") else ""
        if "nac-drive " in code:
            found.append(code[code.index("nac-drive "):].rstrip(" &"))
        elif re.match(r"\s*resumed_train ", code):
            found.append("nac-drive train " + " ".join(shlex.split(code)[3:]))
    return found


def test_the_recipes_are_strict_bash_scripts_that_parse():
    assert {p.name for p in RECIPES} >= {"carracing_policy.sh", "udacity_policy.sh", "ppo_expert.sh"}
    for recipe in RECIPES:
        text = recipe.read_text()
        assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text, recipe.name
        assert "What it should score" in text and "Time on" in text, recipe.name
        done = subprocess.run(["bash", "-n", str(recipe)], capture_output=True, text=True)
        assert done.returncode == 0, (recipe.name, done.stderr)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_flag_of_a_recipe_is_one_its_verb_accepts(recipe):
    found = recipe_commands(recipe)
    assert len(found) >= 3
    assert [flag for command in found for flag in unknown_flags(command)] == []


def test_the_functions_recipes_share_parse_and_use_flags_their_verbs_accept():
    lib = ROOT / "benchmarks" / "recipes" / "lib.bash"
    users = [recipe.name for recipe in RECIPES if 'source "$(dirname "$0")/lib.bash"' in recipe.read_text()]
    assert {"compare_cores.sh", "compare_regime.sh"} <= set(users)
    assert subprocess.run(["bash", "-n", str(lib)], capture_output=True).returncode == 0
    found = recipe_commands(lib)
    assert len(found) == 4 and [flag for command in found for flag in unknown_flags(command)] == []


def test_every_flag_of_a_report_command_is_one_its_verb_accepts():
    found = commands(REPORT.read_text().splitlines())
    assert len(found) >= 15
    runnable = [c for c in found if not c.startswith("bash ")]
    assert [flag for command in runnable for flag in unknown_flags(command)] == []


def test_the_flag_check_finds_a_flag_the_verb_does_not_have():
    assert unknown_flags("nac-drive expert train --seed 1 --combined-actions") == [
        "nac-drive expert train --combined-actions"]
    assert unknown_flags("nac-drive dagger --policy p --disturb-rate 0.02") == []
    assert unknown_flags("python benchmarks/nac_layer.py --sections step --repeats 3") == [
        "python benchmarks/nac_layer.py --repeats"]
