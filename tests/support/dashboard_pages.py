"""Helpers for the dashboard tests: the page's data block, a window-attribution file, and
the headless browser."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest

WINDOW_ATTRIBUTION_FORMAT = "nac-drive-window-attribution"


def run_data(page: str) -> dict:
    """The JSON the page script reads (its ``run-data`` block)."""
    m = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)
    assert m, "the run data block is missing"
    return json.loads(m.group(1))


def unpacked(p: dict) -> np.ndarray:
    """A ``{dtype, shape, b64}`` array of the page's data block -> numpy."""
    return np.frombuffer(base64.b64decode(p["b64"]), dtype=np.dtype(p["dtype"])).reshape(p["shape"])


def still_pictures(stream: dict) -> list[np.ndarray]:
    """The pictures of one of the page's frame / overlay videos (``{b64, fps, ...}``),
    decoded by PyAV: uint8 RGB ``[H, W, 3]`` each, in step order."""
    import io

    import av

    with av.open(io.BytesIO(base64.b64decode(stream["b64"]))) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def nearest_step(picture: np.ndarray, candidates: dict[int, np.ndarray]) -> int:
    """The step whose picture ``picture`` is closest to (mean absolute difference)."""
    return min(candidates, key=lambda i: np.abs(picture.astype(float) - candidates[i]).mean())


def write_window_attribution(run_dir: Path, window: int = 6, seed: int = 0, trace_sha256: str | None = None,
                             method: str = "integrated gradients") -> np.ndarray:
    """Write ``RUN_DIR/window_attribution.npz`` for the run's trace (or one naming
    ``trace_sha256``): random shares ``[N, window]`` summing to 1 over the frames the
    window reaches (NaN before an episode's start). Returns the shares."""
    from nac_drive.interpret.archive import write_archive
    from nac_drive.interpret.trace import load_trace

    run = load_trace(run_dir)
    rng = np.random.default_rng(seed)
    shares = np.full((run.num_steps, window), np.nan, dtype=np.float32)
    for _, a, b in run.episode_spans():
        for i in range(a, b):
            reach = min(window, i - a + 1)
            shares[i, :reach] = rng.dirichlet(np.ones(reach))
    write_archive(Path(run_dir) / "window_attribution.npz", {"shares": shares},
                  {"format": WINDOW_ATTRIBUTION_FORMAT, "version": 1, "num_steps": run.num_steps, "method": method,
                   "window": window, "trace_sha256": trace_sha256 or run.sha256})
    return shares


def chromium_dashboard_page():
    """:func:`support.browser.dashboard_page`, or skip the test when playwright
    or a Chromium is missing."""
    pytest.importorskip("playwright", reason="playwright-python is not installed (pip install nac-drive[dev])")
    from support.browser import dashboard_page, find_chromium

    if find_chromium() is None:
        pytest.skip("no Chromium found: apt-get install chromium (or set NAC_DRIVE_CHROMIUM)")
    return dashboard_page
