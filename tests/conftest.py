"""The tests run against the installed package, the way a user has it.

An editable install or ``python -m pytest`` from the repository root imports ``nac_drive``
from the checkout, which hides a module the wheel leaves out. So the run stops at once
unless ``nac_drive`` comes from an installed copy; a developer who wants to test an editable
install says so with ``NAC_DRIVE_TEST_SOURCE_TREE=1``. The subprocesses the tests start
(``python -m nac_drive.cli ...`` from the repository root) get ``PYTHONSAFEPATH=1`` for the
same reason: without it ``-m`` puts the working directory, the checkout, first on their path.
"""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    import nac_drive

    from_checkout = Path(nac_drive.__file__).resolve().is_relative_to(ROOT)
    if from_checkout and os.environ.get("NAC_DRIVE_TEST_SOURCE_TREE") != "1":
        raise pytest.UsageError(
            f"nac_drive was imported from the checkout ({nac_drive.__file__}), not from an installed "
            f"package: install it with `pip install \".[dev]\"` and run `pytest` (not `python -m pytest`, "
            f"which puts the checkout first on sys.path). To test an editable install on purpose, set "
            f"NAC_DRIVE_TEST_SOURCE_TREE=1.")
    os.environ["PYTHONSAFEPATH"] = "1"
