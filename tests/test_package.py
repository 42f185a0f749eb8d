"""Packaging: the namespace layout, the CLI, the README's commands and the CI script agree."""

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import nac_drive

ROOT = Path(__file__).resolve().parents[1]


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
    test_command = blocks[1].strip()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
