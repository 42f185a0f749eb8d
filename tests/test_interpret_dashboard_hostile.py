"""A trace file cannot script the dashboard: every string the page takes from a run's files
(action and class names, metadata values and keys, NAC, saliency and window-attribution
settings, the run folder's name) holds a hostile payload, and the page shows each one as
text, inline in a notebook too."""

from __future__ import annotations

import html
import json

import numpy as np
import pytest

from support.dashboard_pages import chromium_dashboard_page, run_data, write_window_attribution

from nac_drive.interpret.archive import METADATA_MEMBER, write_archive
from nac_drive.interpret.dashboard import Dashboard, _readable, build_dashboard
from support.synthetic_runs import make_synthetic_run
from nac_drive.interpret.trace import RunRecorder, load_trace

PAYLOADS = [
    "<script>window.__pwned = 'script'</script>",
    "<img src=x onerror=\"window.__pwned = 'img'\">",
    "</script><script>window.__pwned = 'closed the data block'</script>",
    "\"><svg onload=\"window.__pwned = 'attribute'\">",
    "'><iframe srcdoc='<script>parent.__pwned = 1</script>'></iframe>",
    "<!--<script>",
    "<a href=\"javascript:window.__pwned = 'link'\">link</a>",
    "<b>bold</b> &amp; \u2028 \u2029",
    "<img src=x onerror=alert(document.domain)>",
    "<style>body { display: none }</style>",
]
FOLDER = "run <img src=x onerror=\"window.__pwned = 'folder'\">"  # a folder name holds no "/"


class Poison:
    """Replaces strings by payloads, one payload per distinct string in turn (a string that
    appears twice gets the same payload, so fields that must agree still do)."""

    def __init__(self):
        self.seen: dict[str, str] = {}

    def __call__(self, value, keys: bool = False):
        if isinstance(value, str):
            return self.seen.setdefault(value, PAYLOADS[len(self.seen) % len(PAYLOADS)] + value)
        if isinstance(value, list):
            return [self(v, keys) for v in value]
        if isinstance(value, dict):
            return {(self(k) if keys else k): (v if k == "format" else self(v, keys or k == "run"))
                    for k, v in value.items()}
        return value


def poisoned(text: str) -> bool:
    return any(text.startswith(p) for p in PAYLOADS)


def rewrite_metadata(path, change) -> None:
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files if name != METADATA_MEMBER}
        meta = json.loads(archive[METADATA_MEMBER])
    write_archive(path, arrays, change(meta))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(continuous run with NAC and saliency, discrete run): their dirs and poisoned strings."""
    root = tmp_path_factory.mktemp("hostile")
    poison = Poison()
    continuous = root / FOLDER
    make_synthetic_run(continuous, steps=12, seed=3, episodes=2)
    rewrite_metadata(continuous / "trace" / "chunk-000000.npz", poison)
    trace_sha256 = load_trace(continuous).sha256      # the saliency file stays bound to its (poisoned) trace
    rewrite_metadata(continuous / "saliency.npz", lambda meta: {**poison(meta), "trace_sha256": trace_sha256})
    write_window_attribution(continuous, method=PAYLOADS[3] + "integrated gradients")

    discrete = root / "discrete"
    classes = [p + name for p, name in zip(PAYLOADS, ["noop", "right", "left", "gas", "brake"])]
    rec = RunRecorder(discrete, metadata={p: p for p in PAYLOADS}, action_names=classes,
                      expert_action_names=classes)
    for i in range(6):
        rec.add(frame=np.full((16, 16, 3), 40 * i, np.uint8), policy_action=i % 5, expert_action=3, timestamp=0.1 * i)
    rec.save()
    assert len(poison.seen) >= len(PAYLOADS)          # every payload is in the continuous run
    return continuous, discrete, classes


def test_no_payload_reaches_the_page_unescaped(runs, tmp_path):
    continuous, discrete, classes = runs
    for run_dir in (continuous, discrete):
        page = build_dashboard(run_dir, tmp_path / "page.html").read_text(encoding="utf-8")
        for payload in PAYLOADS + [FOLDER]:
            assert payload not in page
        # one data block, one page script, plotly: nothing closed the data block early
        assert page.count("</script>") == 3
        data = run_data(page)                             # escaped losslessly
        run = load_trace(run_dir)
        names = run.metadata["action_names"]
        if run_dir == discrete:
            assert data["readout"]["policy_classes"] == classes
            assert data["figures"]["actions"]["layout"]["yaxis"]["ticktext"] == [
                html.escape(c, quote=False) for c in classes]
        else:
            assert data["readout"]["policy_names"] == names and all(map(poisoned, names))
            titles = [a["text"] for a in data["figures"]["actions"]["layout"]["annotations"]]
            assert titles[:3] == [html.escape(n, quote=False) for n in names]
            method = PAYLOADS[3] + "integrated gradients"
            assert data["attribution"]["method"] == method
            assert html.escape(method, quote=False) in data["figures"]["attribution"]["layout"]["title"]["text"]


@pytest.mark.browser
@pytest.mark.slow
def test_payloads_show_as_text_and_run_nothing_in_chromium(runs, tmp_path):
    dashboard_page = chromium_dashboard_page()
    continuous, discrete, classes = runs
    page_state = """() => ({
        pwned: window.__pwned === undefined ? null : String(window.__pwned),
        title: document.title, h1: document.querySelector('h1').textContent,
        summary: document.getElementById('summary').textContent,
        summaryTags: [...new Set(Array.from(document.querySelectorAll('#summary *'), (e) => e.tagName))].sort(),
        readoutTags: [...new Set(Array.from(document.querySelectorAll('#readout *'), (e) => e.tagName))].sort(),
        table: document.getElementById('episode-table').textContent,
        tableTags: [...new Set(Array.from(document.querySelectorAll('#episode-table *'), (e) => e.tagName))].sort(),
        options: Array.from(document.querySelectorAll('#episode option'), (e) => e.textContent),
        readoutHeader: Array.from(document.querySelectorAll('#readout tr:first-child td'), (e) => e.textContent),
        readoutPolicy: Array.from(document.querySelectorAll('#readout tr:nth-child(2) td'), (e) => e.textContent),
        titles: Array.from(document.querySelectorAll('#fig-actions .annotation-text'), (e) => e.textContent),
        ticks: Array.from(document.querySelectorAll('#fig-actions .yaxislayer-above .ytick text'),
                          (e) => e.textContent),
        links: document.querySelectorAll('#fig-actions a').length,
        images: document.querySelectorAll('img').length, videos: document.querySelectorAll('video').length,
        iframes: document.querySelectorAll('iframe').length,
        scripts: document.scripts.length, bodyShown: getComputedStyle(document.body).display !== 'none'})"""

    build_dashboard(continuous, tmp_path / "continuous.html")
    run = load_trace(continuous)
    with dashboard_page(tmp_path / "continuous.html") as (page, problems):
        state = page.evaluate(page_state)
    names, nac_mode = run.metadata["action_names"], run.metadata["nac"]["mode"]
    assert state["pwned"] is None and problems == []
    assert state["title"] == state["h1"] == f"nac-drive run: {FOLDER}"
    assert poisoned(nac_mode) and f"mode {nac_mode}" in state["summary"]
    for key, value in run.metadata["run"].items():         # keys and values in words, as text
        assert poisoned(key) and f"{key} {_readable(value)}" in state["summary"]
    assert f"window attribution {PAYLOADS[3]}integrated gradients" in state["summary"]
    assert state["summaryTags"] == ["B", "SPAN"]
    assert state["readoutTags"] == ["B", "DIV", "TABLE", "TBODY", "TD", "TR"]
    assert state["readoutHeader"] == [""] + names
    assert state["titles"][:3] == names and state["links"] == 0
    assert all(f"{name} " in state["table"] for name in names)   # per-column agreement, names as text
    assert state["tableTags"] == ["TBODY", "TD", "TH", "THEAD", "TR"] and len(state["options"]) == 2
    # the frame, the overlay and the run's video: the pictures are videos, never an <img>
    assert (state["images"], state["videos"], state["iframes"], state["scripts"]) == (0, 3, 0, 3) and state["bodyShown"]

    # inline in a notebook: the page in an iframe's srcdoc, still text only
    notebook = tmp_path / "notebook.html"
    notebook.write_text("<!DOCTYPE html><html><body>" + Dashboard(tmp_path / "continuous.html")._repr_html_()
                        + "</body></html>", encoding="utf-8")
    inner = "document.querySelector('iframe').contentWindow"
    with dashboard_page(notebook, ready=f"{inner}.__dashboardReady === true", wait_all=False) as (page, problems):
        framed = page.frame_locator("iframe")
        assert framed.locator("h1").text_content() == f"nac-drive run: {FOLDER}"
        assert page.evaluate(f"[window.__pwned, {inner}.__pwned, {inner}.dashboard.data.n]") == [None, None, 12]
        assert framed.locator("#summary").text_content() == state["summary"]
    assert problems == []

    build_dashboard(discrete, tmp_path / "discrete.html")
    with dashboard_page(tmp_path / "discrete.html") as (page, problems):
        page.locator("#scrubber").fill("2")
        page.wait_for_function("window.dashboard.state.frame === 2")
        page.wait_for_timeout(100)
        state = page.evaluate(page_state)
    assert state["pwned"] is None and problems == []
    assert state["readoutPolicy"] == ["policy", f"{classes[2]} (2)"]
    assert sorted(state["ticks"]) == sorted(classes)
    assert all(f"{p} {p}" in state["summary"] for p in PAYLOADS)      # metadata {payload: payload}
    assert "same action on 16.7% of steps" in state["summary"] and "16.7% of steps" in state["table"]
    assert state["summaryTags"] == ["B", "SPAN"] and state["links"] == 0
    # the frame, the overlay and the run's video: the pictures are videos, never an <img>
    assert (state["images"], state["videos"], state["iframes"], state["scripts"]) == (0, 3, 0, 3) and state["bodyShown"]
