"""Open a dashboard in headless Chromium (for the browser test and the load benchmark).

Uses playwright-python (the ``dev`` extra) driving the system's Chromium (Debian's
``chromium`` package); playwright's own browser downloads are never used.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def find_chromium() -> str | None:
    """Path of a Chromium executable: ``$NAC_DRIVE_CHROMIUM``, a Debian/Ubuntu path, or PATH."""
    env = os.environ.get("NAC_DRIVE_CHROMIUM")
    if env:
        return env if os.path.isfile(env) else None
    for path in CANDIDATES:
        if os.path.isfile(path):
            return path
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@contextmanager
def dashboard_page(html_path: str | os.PathLike, viewport: tuple[int, int] = (1400, 1000), timeout_s: float = 60.0,
                   wait_all: bool = True, ready: str = "window.__dashboardReady === true"):
    """Open ``html_path`` and wait until the page is interactive (the first screen's
    panels drawn: the JavaScript expression ``ready``, e.g. about a dashboard in an
    iframe) and, with ``wait_all``, until every panel is drawn.

    Yields ``(page, problems)``: ``problems`` collects console errors, uncaught page
    errors and dialogs (dismissed) as strings, for the whole life of the page.
    """
    from playwright.sync_api import sync_playwright

    executable = find_chromium()
    if executable is None:
        raise FileNotFoundError("no Chromium found (install Debian's `chromium` or set NAC_DRIVE_CHROMIUM)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.type} {d.message}"), d.dismiss()))
            page.goto(Path(html_path).resolve().as_uri())
            page.wait_for_function(ready, timeout=timeout_s * 1000)
            if wait_all:
                page.wait_for_function("window.__dashboardAllDrawn === true", timeout=timeout_s * 1000)
            yield page, problems
        finally:
            browser.close()
