"""The tests run against an installed package, the way a user (or a developer) has it.

``python -m pytest`` with nothing installed imports ``nac_drive`` from the checkout, which hides
a module the wheel leaves out (and cannot import ``nac_drive.agents`` and the other folders the
wheel maps under ``nac_drive``). So the run stops at once unless ``nac_drive`` comes from an
installed copy, or from an editable install of this very checkout (``pip install -e ".[dev]"``,
whose finder maps those folders the way the wheel does). The subprocesses the tests start
(``python -m nac_drive.cli ...`` from the repository root) get ``PYTHONSAFEPATH=1``: without it
``-m`` puts the working directory, the checkout, first on their path.
"""

import json
import os
from importlib.metadata import distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# No real window in the tests: gymnasium's check_env opens CarRacing's "human" window, and
# without a display SDL would back it with OpenGL, whose Mesa driver puts libLLVM in the
# global namespace, where a later `import triton` (torch._dynamo, loading an expert zip)
# crashes on it. SDL's dummy driver draws the window in memory.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def editable_install_of(root: Path) -> bool:
    """Whether nac-drive is installed in editable mode from the checkout at ``root``."""
    # every nac-drive distribution on the path: a build leaves its own metadata in the checkout
    for dist in distributions(name="nac-drive"):
        origin = json.loads(dist.read_text("direct_url.json") or "{}")
        if origin.get("dir_info", {}).get("editable") and origin.get("url") == root.as_uri():
            return True
    return False


def pytest_configure(config):
    import nac_drive

    from_checkout = Path(nac_drive.__file__).resolve().is_relative_to(ROOT)
    if from_checkout and not editable_install_of(ROOT):
        raise pytest.UsageError(
            f"nac_drive was imported from the checkout ({nac_drive.__file__}), not from an installed "
            f"package: install it with `pip install \".[all,dev]\"` (or `pip install -e \".[all,dev]\"` while you "
            f"edit it) and run `pytest`.")
    os.environ["PYTHONSAFEPATH"] = "1"
