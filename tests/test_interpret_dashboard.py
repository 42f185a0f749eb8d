"""The offline HTML dashboard: content, size, the CLI verb, and a real headless Chromium."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import pytest

from support.dashboard_pages import chromium_dashboard_page, run_data

from nac_drive.cli import main
from nac_drive.interpret.dashboard import build_dashboard
from support.synthetic_runs import make_synthetic_run
from nac_drive.interpret.trace import RunRecorder, load_trace

N = 40
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
PANELS = ("actions", "attention_now", "wiring", "sensory", "backbone", "dynamics", "attention_time")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    make_synthetic_run(d, steps=N, seed=1)
    return d


@pytest.fixture(scope="module")
def page_html(run_dir):
    out = build_dashboard(run_dir, run_dir / "dashboard.html")
    return out.read_text(encoding="utf-8")


def _bdata(a: dict) -> np.ndarray:
    """plotly's base64 typed-array JSON -> numpy."""
    arr = np.frombuffer(base64.b64decode(a["bdata"]), dtype=np.dtype(a["dtype"]))
    return arr.reshape([int(s) for s in str(a["shape"]).split(",")]) if "shape" in a else arr


def test_page_holds_every_panel_and_the_data_of_every_frame(page_html, run_dir):
    run = load_trace(run_dir)
    data = run_data(page_html)
    assert data["n"] == N and len(data["frames"]) == N and len(data["overlays"]) == N
    assert base64.b64decode(data["frames"][7]) == run.frame_jpeg(7)       # frames embedded as recorded
    assert set(PANELS) <= set(data["figures"])
    for name in PANELS:
        assert f'id="fig-{name}"' in page_html
    for text in ("Play", "scrubber", "saliency overlay", "Sensory gates q / k / v", "inter / command / motor",
                 "Attention over past frames", "NCP backbone wiring", "phi, tau, logits"):
        assert text in page_html
    # heatmaps carry neurons x time of the recorded values
    sensory = [t for t in data["figures"]["sensory"]["data"] if t["type"] == "heatmap"]
    np.testing.assert_allclose(_bdata(sensory[0]["z"]), run.q.T, rtol=1e-6)
    backbone = [t for t in data["figures"]["backbone"]["data"] if t["type"] == "heatmap"]
    H, n_inter = run.inter_mean.shape[1:]
    assert _bdata(backbone[0]["z"]).shape == (H * n_inter, N)
    np.testing.assert_allclose(_bdata(backbone[0]["z"])[n_inter + 2], run.inter_mean[:, 1, 2], rtol=1e-6)
    # actions: policy and expert traces over all steps
    actions = data["figures"]["actions"]["data"]
    assert {t["name"] for t in actions} >= {"policy", "expert", "reward", "cross-track error"}
    np.testing.assert_allclose(_bdata(actions[0]["y"]), run.policy_action[:, 0], rtol=1e-6)
    # every time panel has its cursor
    assert set(data["time_figures"]) == {"actions", "sensory", "backbone", "dynamics", "attention_time"}
    for name in data["time_figures"]:
        assert f'id="cursor-{name}"' in page_html
    # wiring graph: one node per neuron of each group, coloured by group
    nodes = [t for t in data["figures"]["wiring"]["data"] if t.get("mode") == "markers"]
    groups = run.metadata["nac"]["groups"]
    sizes = {t["name"].split(" ")[0]: len(t["x"]) if isinstance(t["x"], list) else len(_bdata(t["x"]))
             for t in nodes}
    assert {k: sizes[k] for k in ("sensory", "inter", "command", "motor")} == groups
    assert len({t["marker"]["color"] for t in nodes}) == len(nodes)
    # the summary says how far from uniform the attention is
    median = np.nanmedian(run.attention_entropy())
    assert 0 < median <= 1 and f"<b>attention entropy</b> {median:.3f} of its maximum" in page_html


def test_page_has_no_external_resources(page_html):
    assert "plotly.js v" in page_html[:2_000_000]                       # plotly inline
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page_html)
    assert tags
    for tag in tags:
        assert not re.search(r"""\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", tag), tag
    assert not re.search(r"""url\(\s*["']?https?://""", page_html.split("<script>")[0])   # CSS


def test_oversized_images_are_reencoded_to_fit(run_dir, tmp_path):
    out = build_dashboard(run_dir, tmp_path / "small.html", image_budget=100_000)
    data = run_data(out.read_text(encoding="utf-8"))
    total = sum(len(s) for s in data["frames"] + data["overlays"])
    assert total <= 100_000 * 1.1
    from nac_drive.interpret.archive import decode_jpeg
    assert decode_jpeg(base64.b64decode(data["frames"][0])).shape[0] < 96


def test_run_without_nac_or_saliency_with_discrete_actions(tmp_path):
    classes = ["noop", "right", "left", "gas", "brake"]
    rec = RunRecorder(tmp_path, action_names=classes, expert_action_names=classes)
    for i in range(5):
        rec.add(frame=np.full((16, 16, 3), 40 * i, np.uint8), policy_action=i % 5, expert_action=3,
                timestamp=0.1 * i)
    rec.save()
    data = run_data(build_dashboard(tmp_path).read_text(encoding="utf-8"))
    assert data["has_nac"] is False and data["overlays"] is None
    assert list(data["figures"]) == ["actions"] and len(data["frames"]) == 5
    # a discrete action is one column of class indices, labelled with the class names
    assert data["readout"]["policy_classes"] == classes and data["readout"]["policy_names"] == ["action"]
    assert data["figures"]["actions"]["layout"]["yaxis"]["ticktext"] == classes


def test_cli_writes_the_dashboard_and_names_a_missing_trace(run_dir, tmp_path, capsys):
    out = tmp_path / "d.html"
    assert main(["dashboard", str(run_dir), "-o", str(out)]) == 0
    assert run_data(out.read_text(encoding="utf-8"))["n"] == N
    assert main(["dashboard", str(tmp_path / "nowhere")]) == 2
    assert "trace.npz" in capsys.readouterr().err


@pytest.mark.slow
def test_thousand_frame_run_fits_the_size_budget(tmp_path):
    # the policy's default NAC size (d_model 64, 4 heads, top-8, window 16), CarRacing frames
    make_synthetic_run(tmp_path, steps=1000, seed=2, d_model=64, num_heads=4, topk=8, window=16, input_dim=64)
    out = build_dashboard(tmp_path)
    size = out.stat().st_size
    assert size <= 25e6, f"{size / 1e6:.1f} MB"
    assert len(run_data(out.read_text(encoding="utf-8"))["overlays"]) == 1000


# ------------------------------------------------------------------ real browser
@pytest.mark.browser
@pytest.mark.slow
def test_dashboard_in_headless_chromium(run_dir, page_html):
    dashboard_page = chromium_dashboard_page()
    run = load_trace(run_dir)
    with dashboard_page(run_dir / "dashboard.html") as (page, problems):
        state = """() => ({src: document.getElementById('frame').src,
                          cursors: window.dashboard.data.time_figures.map(
                              (n) => document.getElementById('cursor-' + n).dataset.frame),
                          x: document.getElementById('cursor-sensory').getBoundingClientRect().left,
                          ages: Array.from(document.getElementById('fig-attention_now').data[0].x),
                          label: document.getElementById('frame-label').textContent})"""
        before = page.evaluate(state)
        assert before["cursors"] == ["0"] * 5 and before["src"].startswith("data:image/jpeg;base64,")

        page.locator("#scrubber").fill("25")
        page.wait_for_function("document.getElementById('cursor-sensory').dataset.frame === '25'")
        after = page.evaluate(state)
        assert after["src"] != before["src"]
        assert after["src"].endswith(base64.b64encode(run.frame_jpeg(25)).decode())
        assert after["cursors"] == ["25"] * 5
        # the cursor sits at step 25 of the heatmap's x axis
        axis = page.evaluate("""() => { const ax = document.getElementById('fig-sensory')._fullLayout.xaxis;
            const box = document.getElementById('fig-sensory').getBoundingClientRect();
            return [box.left + ax._offset + ax.l2p(0), box.left + ax._offset + ax.l2p(25)]; }""")
        assert after["x"] - before["x"] == pytest.approx(axis[1] - axis[0], abs=1.5) and axis[1] - axis[0] > 100
        assert sorted(after["ages"]) == sorted(a for a in run.key_age[25, 0] if a >= 0)
        assert after["ages"] != before["ages"] and "frame 25 / 39" in after["label"]

        page.locator("#overlay-toggle").check()
        page.wait_for_timeout(200)
        overlay_src = page.evaluate(state)["src"]
        assert overlay_src != after["src"] and overlay_src.endswith(page.evaluate(
            "window.dashboard.data.overlays[25]"))

        row = "Array.from(document.getElementById('fig-backbone').data[0].z[3])"
        for mode, values in (("top", run.inter_top), ("mean", run.inter_mean)):   # head 0, inter neuron 3
            page.locator("#backbone-mode").select_option(mode)
            page.wait_for_timeout(200)
            np.testing.assert_allclose(np.array(page.evaluate(row), dtype=float), values[:, 0, 3].astype(float),
                                       rtol=1e-5, equal_nan=True)
        assert not np.allclose(run.inter_top[:, 0, 3], run.inter_mean[:, 0, 3])

        page.locator("#play").click()
        page.wait_for_function("window.dashboard.state.frame >= 28", timeout=10_000)
        page.locator("#play").click()
        # clicking a time panel jumps to that step
        page.locator("#fig-sensory").scroll_into_view_if_needed()
        box = page.locator("#fig-sensory .nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.2, box["y"] + box["height"] / 2)
        page.wait_for_function("window.dashboard.state.frame < 12", timeout=5_000)
        # the cursors follow on the next animation frame (renders are batched)
        page.wait_for_function("document.getElementById('cursor-sensory').dataset.frame"
                               " === String(window.dashboard.state.frame)", timeout=5_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        assert problems == []
