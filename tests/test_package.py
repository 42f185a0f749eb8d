"""Packaging: the namespace layout, the CLI, the README's commands and the CI script agree."""

import importlib
import importlib.util
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path


import nac_drive

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def shipped_files() -> dict[str, Path]:
    """Every file the wheel must hold, by its path inside the wheel -> its path in the checkout.

    All ``.py`` files of the five package folders and every asset, placed where pyproject's
    ``sources`` table puts them (``agents/x.py`` -> ``nac_drive/agents/x.py``).
    """
    wheel = PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]
    files = {}
    for folder in ("nac_drive", "agents", "simulators", "data_collection", "interpret"):
        assert folder in wheel["only-include"]
        target = wheel["sources"].get(folder, folder)
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and (
                    path.suffix == ".py" or (ROOT / "nac_drive" / "assets") in path.parents):
                files[f"{target}/{path.relative_to(ROOT / folder).as_posix()}"] = path
    return files


def build(source: Path, out: Path, *kinds: str) -> list[Path]:
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", *kinds, "--outdir", str(out), str(source)],
                          capture_output=True, text=True, cwd=out.parent)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "would be ignored" not in done.stdout + done.stderr
    return sorted(out.iterdir())


def test_wheel_holds_every_module_and_asset_and_the_sdist_rebuilds_it(tmp_path):
    built = build(ROOT, tmp_path / "dist", "--sdist", "--wheel")
    sdist, wheel = (next(p for p in built if p.name.endswith(ext)) for ext in (".tar.gz", ".whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        expected = shipped_files()
        assert len(expected) > 60 and "nac_drive/cli/commands/quickstart.py" in expected
        missing = sorted(set(expected) - names)
        assert not missing, f"the wheel leaves out {missing}"
        for name, path in expected.items():
            assert zf.read(name) == path.read_bytes(), name
        strays = [n for n in names if "__pycache__" in n or n.endswith(".pyc")
                  or not (n.startswith("nac_drive/") or n.startswith("nac_drive-"))]
        assert not strays, strays
    # A user or a distribution that builds from the sdist gets the same wheel, byte for byte.
    rebuilt = build(sdist, tmp_path / "from_sdist", "--wheel")
    assert [p.name for p in rebuilt] == [wheel.name]
    assert rebuilt[0].read_bytes() == wheel.read_bytes()


def test_tests_run_against_the_installed_package():
    installed = Path(nac_drive.__file__).resolve()
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert installed.is_relative_to(site_packages) and not installed.is_relative_to(ROOT), installed


def test_every_installed_module_imports_and_pip_check_passes(tmp_path):
    # In a fresh interpreter started outside the checkout, walk the installed package and
    # import every module: a module that is missing, or imports one that is, fails here.
    probe = ("import importlib, pkgutil, nac_drive\n"
             "names = [m.name for m in pkgutil.walk_packages(nac_drive.__path__, 'nac_drive.')]\n"
             "for name in names: importlib.import_module(name)\n"
             "print(len(names), nac_drive.__file__)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    count, origin = done.stdout.split()
    # walk_packages names every module and subpackage below nac_drive, one per .py file
    assert int(count) == sum(n.endswith(".py") for n in shipped_files()) - 1
    assert Path(origin).resolve() == Path(nac_drive.__file__).resolve()
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_subpackages_install_under_the_nac_drive_namespace():
    for name in ("agents", "simulators", "data_collection", "interpret"):
        module = importlib.import_module(f"nac_drive.{name}")
        assert Path(module.__file__).parent.name == name
    # Never a top-level `agents` / `interpret` (other popular packages own those names).
    # Asked from another folder: `python -m pytest` puts the checkout itself on sys.path.
    probe = "import importlib.util as u; print([n for n in ('agents', 'interpret', 'simulators', " \
            "'data_collection') if (s := u.find_spec(n)) and str(s.origin or '').startswith(%r)])" % str(ROOT)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT.parent)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_cli_version_and_help():
    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"nac-drive {nac_drive.__version__}"
    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: nac-drive" in out.stdout


def _verb_parsers(parser, name="nac-drive"):
    """(command line, parser) of every verb that takes flags, e.g. ("nac-drive expert eval", ...)."""
    import argparse

    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield name, parser
    for group in groups:
        for verb, child in group.choices.items():
            yield from _verb_parsers(child, f"{name} {verb}")


def test_every_verb_help_shows_each_default_once():
    import argparse

    from nac_drive.cli import build_parser

    verbs = dict(_verb_parsers(build_parser()))
    assert {"nac-drive train", "nac-drive dagger", "nac-drive expert eval", "nac-drive sim udacity-emulator"} <= set(verbs)
    for name, parser in verbs.items():
        text = " ".join(parser.format_help().split())
        assert "(default: None)" not in text, name
        formatter = parser._get_formatter()
        for action in parser._actions:
            if not action.option_strings or action.help in (None, argparse.SUPPRESS):
                continue
            shown = formatter._get_help_string(action).replace("%(default)s", "")
            assert len(re.findall("default", shown, flags=re.I)) <= 1, (name, action.dest, shown)
            unset_switch = action.const is True and action.default is False
            if action.default not in (None, argparse.SUPPRESS) and not unset_switch:
                assert f"(default: {action.default})" in text, (name, action.dest)

def test_cv2_and_pytorch_grad_cam_import_together():
    # grad-cam needs opencv-python-headless; a second cv2 distribution breaks imports
    import cv2
    import pytorch_grad_cam  # noqa: F401
    from importlib.metadata import distributions

    cv2_dists = {d.metadata["Name"].lower() for d in distributions()
                 if d.metadata["Name"] and d.metadata["Name"].lower().startswith("opencv")}
    assert cv2_dists == {"opencv-python-headless"}, cv2_dists
    assert cv2.imencode(".jpg", __import__("numpy").zeros((4, 4, 3), "uint8"))[0]


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    assert len(blocks) >= 2, "README must start with the install+run and the test command"
    install_and_run, test_command = blocks[0].strip(), blocks[1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
    # ... and installs and runs the main command as the README does (not editable; quickstart)
    assert install_and_run == 'pip install ".[all]" && nac-drive quickstart'
    assert 'python -m pip install --quiet ".[all]"' in ci_lines
    assert any(line.startswith("nac-drive quickstart ") for line in ci_lines)
    assert not any("pip install" in line and " -e " in line for line in ci_lines)
