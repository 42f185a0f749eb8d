"""The tests run against the installed package, the way a user has it.

``python -m pytest`` from the repository root imports ``nac_drive`` from the checkout, which
hides a module the wheel leaves out (and cannot import ``nac_drive.agents`` and the other
folders the wheel maps under ``nac_drive``). So the run stops at once unless ``nac_drive``
comes from an installed copy. The subprocesses the tests start
(``python -m nac_drive.cli ...`` from the repository root) get ``PYTHONSAFEPATH=1`` for the
same reason: without it ``-m`` puts the working directory, the checkout, first on their path.
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# No real window in the tests: gymnasium's check_env opens CarRacing's "human" window, and
# without a display SDL would back it with OpenGL, whose Mesa driver puts libLLVM in the
# global namespace, where a later `import triton` (torch._dynamo, loading an expert zip)
# crashes on it. SDL's dummy driver draws the window in memory.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def pytest_configure(config):
    import nac_drive

    from_checkout = Path(nac_drive.__file__).resolve().is_relative_to(ROOT)
    if from_checkout:
        raise pytest.UsageError(
            f"nac_drive was imported from the checkout ({nac_drive.__file__}), not from an installed "
            f"package: install it with `pip install \".[dev]\"` and run `pytest` (not `python -m pytest`, "
            f"which puts the checkout first on sys.path).")
    os.environ["PYTHONSAFEPATH"] = "1"
