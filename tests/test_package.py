"""Packaging: the namespace layout, the CLI, the README's commands and the CI script agree."""

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

from support.cli_parsers import verb_parsers

import nac_drive

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


FOLDERS = ("nac_drive", "agents", "simulators", "data_collection", "interpret")


def package_dirs() -> dict[str, str]:
    """Each folder of the checkout -> the package it installs as (``agents`` -> ``nac_drive/agents``)."""
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    return {folder: package.replace(".", "/") for package, folder in mapping.items()}


def shipped_files() -> dict[str, Path]:
    """Every file the wheel must hold, by its path inside the wheel -> its path in the checkout.

    All ``.py`` files of the five package folders and every asset, placed where pyproject's
    ``package-dir`` table puts them (``agents/x.py`` -> ``nac_drive/agents/x.py``).
    """
    targets = package_dirs()
    files = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and (
                    path.suffix == ".py" or (ROOT / "nac_drive" / "assets") in path.parents):
                files[f"{targets[folder]}/{path.relative_to(ROOT / folder).as_posix()}"] = path
    return files


def test_pyproject_lists_every_package_of_the_five_folders():
    # setuptools installs the packages it is told of: a new subpackage must be listed
    targets = package_dirs()
    assert set(targets) == set(FOLDERS)
    found = {targets[folder] + "/" + init.parent.relative_to(ROOT / folder).as_posix()
             for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")}
    assert {p.removesuffix("/.").replace("/", ".") for p in found} == set(PYPROJECT["tool"]["setuptools"]["packages"])


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
        names = {n for n in zf.namelist() if ".dist-info/" not in n}
        expected = shipped_files()
        assert len(expected) > 60 and "nac_drive/cli/commands/quickstart.py" in expected
        assert names == set(expected), (f"the wheel leaves out {sorted(set(expected) - names)}, "
                                        f"and holds what the checkout does not: {sorted(names - set(expected))}")
        for name, path in expected.items():
            assert zf.read(name) == path.read_bytes(), name
    # A user or a distribution that builds from the sdist gets the same wheel: the same files,
    # byte for byte (the zip's own timestamps are the build's, unless SOURCE_DATE_EPOCH is set)
    rebuilt = build(sdist, tmp_path / "from_sdist", "--wheel")
    assert [p.name for p in rebuilt] == [wheel.name]
    assert wheel_contents(rebuilt[0]) == wheel_contents(wheel)


def test_the_licence_and_changelog_match_the_metadata(tmp_path):
    # pyproject says MIT and a version; the files a user reads must say the same, and ship
    assert PYPROJECT["project"]["license"] == "MIT"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    version = PYPROJECT["project"]["version"]
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings and headings[0] == version, f"CHANGELOG.md's newest entry is {headings[:1]}, pyproject says {version}"
    built = build(ROOT, tmp_path / "dist", "--sdist", "--wheel")
    sdist, wheel = (next(p for p in built if p.name.endswith(ext)) for ext in (".tar.gz", ".whl"))
    with tarfile.open(sdist) as tf:
        assert {"LICENSE", "CHANGELOG.md"} <= {Path(n).name for n in tf.getnames()}
    with zipfile.ZipFile(wheel) as zf:
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in zf.namelist())


def wheel_contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def test_tests_run_against_the_installed_package():
    installed = Path(nac_drive.__file__).resolve()
    site_packages = Path(sysconfig.get_paths()["purelib"]).resolve()
    if installed.is_relative_to(ROOT):   # conftest allows this for an editable install of this checkout only
        from conftest import editable_install_of

        assert editable_install_of(ROOT)
    else:
        assert installed.is_relative_to(site_packages), installed


def source_tree_copy(tmp_path: Path) -> Path:
    """What a build of the checkout reads, copied (so the test can edit it)."""
    src = tmp_path / "src"
    for name in (*FOLDERS, "build_backend"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, src / name)
    return src


def venv_with_our_dependencies(tmp_path: Path) -> Path:
    """A fresh venv that sees this environment's packages except nac-drive itself; its python."""
    venv.create(tmp_path / "venv", with_pip=False)
    deps = tmp_path / "deps"
    deps.mkdir()
    stdlib = {Path(sysconfig.get_paths()[k]).resolve() for k in ("stdlib", "platstdlib")}
    site_dirs = [Path(p).resolve() for p in sys.path if p and Path(p).is_dir()]
    for site_dir in site_dirs:
        if site_dir in stdlib or site_dir.is_relative_to(ROOT) or not any(site_dir.glob("*.dist-info")):
            continue   # not a folder that installed distributions live in
        for entry in site_dir.iterdir():
            if not entry.name.startswith(("nac_drive", "__editable__")) and not (deps / entry.name).exists():
                (deps / entry.name).symlink_to(entry)
    python = tmp_path / "venv" / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(f"{deps}\n")
    return python


def pip(python: Path, *args: str, cwd: Path) -> None:
    done = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args, "--no-deps",
                           "--no-build-isolation", "--no-index"], capture_output=True, text=True, cwd=cwd)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_an_editable_install_sees_edits_and_new_modules_without_reinstalling(tmp_path):
    src, python = source_tree_copy(tmp_path), venv_with_our_dependencies(tmp_path)
    pip(python, "install", "-e", str(src), cwd=tmp_path)
    with (src / "agents" / "teacher.py").open("a") as f:
        f.write("\nEDITED_AFTER_INSTALL = 45\n")
    (src / "interpret" / "brand_new.py").write_text("ANSWER = 42\n")
    probe = ("import nac_drive, nac_drive.agents.teacher as t, nac_drive.interpret.brand_new as n\n"
             "print(t.EDITED_AFTER_INSTALL, n.ANSWER, t.__file__, nac_drive.__file__)")
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    edited, answer, teacher, package = out.stdout.split()
    assert (edited, answer) == ("45", "42")
    assert Path(teacher) == src / "agents" / "teacher.py" and Path(package) == src / "nac_drive" / "__init__.py"
    cli = subprocess.run([tmp_path / "venv" / "bin" / "nac-drive", "--version"], capture_output=True, text=True)
    assert cli.returncode == 0 and cli.stdout.startswith("nac-drive "), cli.stderr


def test_a_module_deleted_from_the_checkout_leaves_the_next_wheel(tmp_path):
    # setuptools alone would ship it again from the build/lib of the previous build
    src, python = source_tree_copy(tmp_path), venv_with_our_dependencies(tmp_path)
    pip(python, "wheel", "-w", str(tmp_path / "first"), str(src), cwd=src)
    (src / "agents" / "random_actor.py").unlink()
    pip(python, "wheel", "-w", str(tmp_path / "second"), str(src), cwd=src)
    first, second = (zipfile.ZipFile(next((tmp_path / d).glob("*.whl"))).namelist() for d in ("first", "second"))
    assert "nac_drive/agents/random_actor.py" in first
    assert set(first) - set(second) == {"nac_drive/agents/random_actor.py"}


def test_every_installed_module_imports_and_pip_check_passes(tmp_path):
    # In a fresh interpreter started outside the checkout, import every module the checkout
    # has, under its installed name: a module that is missing, or imports one that is, fails here.
    names = sorted(name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                   for name in shipped_files() if name.endswith(".py"))
    probe = ("import importlib, sys, nac_drive\n"
             "for name in sys.argv[1:]: importlib.import_module(name)\n"
             "print(len(sys.argv) - 1, nac_drive.__file__)")
    done = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    count, origin = done.stdout.split()
    assert int(count) == len(names) > 60
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


def test_no_code_imports_a_subpackage_by_its_folder_name():
    # `from simulators...` works in the checkout (its folder is on sys.path) and fails once installed.
    bare = re.compile(r"^\s*(from|import)\s+(agents|simulators|data_collection|interpret)\b", re.M)
    found = [f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
             for folder in ("nac_drive", "agents", "simulators", "data_collection", "interpret", "tests", "benchmarks")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for match in bare.finditer(path.read_text(encoding="utf-8"))]
    assert found == []


def test_cli_version_and_help():
    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"nac-drive {nac_drive.__version__}"
    out = subprocess.run([sys.executable, "-m", "nac_drive.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: nac-drive" in out.stdout


def test_every_verb_help_shows_each_default_once():
    import argparse

    from nac_drive.cli import build_parser

    verbs = dict(verb_parsers(build_parser()))
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


def test_the_policy_room_imports_torch_only_for_the_policy():
    # tasks and actor (the bridge, the CLI, the agents need them) stay light; the model card's
    # `from nac_drive.policy import DrivingPolicy` still finds the class
    probe = ("import sys, nac_drive.policy.tasks, nac_drive.policy.actor\n"
             "light = 'torch' not in sys.modules\n"
             "from nac_drive.policy import DrivingPolicy, PolicyConfig\n"
             "print(light, DrivingPolicy.__module__, PolicyConfig.__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "nac_drive.policy.driving_policy", "PolicyConfig"]
