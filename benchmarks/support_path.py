"""Puts the repository's test support (``tests/support``: synthetic runs, the headless
browser, test policies) on ``sys.path`` for the benchmarks, which share it with the tests.
Run the benchmarks from a checkout: the installed package does not ship that support."""

from __future__ import annotations

import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[1] / "tests" / "support"
if str(SUPPORT) not in sys.path:
    sys.path.insert(0, str(SUPPORT))
