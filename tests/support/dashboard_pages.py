"""Helpers for the dashboard tests: the page's data block, and the headless browser."""

from __future__ import annotations

import json
import re

import pytest


def run_data(page: str) -> dict:
    """The JSON the page script reads (its ``run-data`` block)."""
    m = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)
    assert m, "the run data block is missing"
    return json.loads(m.group(1))


def chromium_dashboard_page():
    """:func:`support.browser.dashboard_page`, or skip the test when playwright
    or a Chromium is missing."""
    pytest.importorskip("playwright", reason="playwright-python is not installed (pip install nac-drive[dev])")
    from support.browser import dashboard_page, find_chromium

    if find_chromium() is None:
        pytest.skip("no Chromium found: apt-get install chromium (or set NAC_DRIVE_CHROMIUM)")
    return dashboard_page
