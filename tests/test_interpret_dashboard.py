"""The offline HTML dashboard: content, episodes, size, the CLI verb, the notebook views,
and a real headless Chromium."""

from __future__ import annotations

import base64
import dataclasses
import html
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from support.dashboard_pages import (chromium_dashboard_page, nearest_step, run_data, still_pictures, unpacked,
                                    write_window_attribution)

from nac_drive.cli import main
from nac_drive.interpret.dashboard import Dashboard, build_dashboard
from support.synthetic_runs import make_synthetic_run
from nac_drive.interpret.archive import decode_jpeg
from nac_drive.interpret.trace import RunRecorder, load_trace

N, EPISODES = 40, 2          # two episodes of 20 steps
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
PANELS = ("actions", "returns", "attribution", "attribution_now", "attention_now", "wiring", "sensory", "backbone",
          "dynamics", "attention_time")
TIME_PANELS = ["actions", "attribution", "sensory", "backbone", "dynamics", "attention_time"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    make_synthetic_run(d, steps=N, seed=1, episodes=EPISODES)
    write_window_attribution(d, window=6)
    return d


@pytest.fixture(scope="module")
def page_html(run_dir):
    out = build_dashboard(run_dir, run_dir / "dashboard.html")
    return out.read_text(encoding="utf-8")


def _array(a) -> np.ndarray:
    """A plotly JSON array (a list, or base64 typed-array JSON) -> numpy."""
    if not isinstance(a, dict):
        return np.array(a, dtype=float)
    arr = np.frombuffer(base64.b64decode(a["bdata"]), dtype=np.dtype(a["dtype"]))
    return arr.reshape([int(s) for s in str(a["shape"]).split(",")]) if "shape" in a else arr


def _heatmap_z(trace: dict, nan: int = -32768) -> tuple[np.ndarray, float]:
    """A heatmap's z, sent as int16 steps of ``meta.z_step`` (``nan``: NaN) -> (floats, step)."""
    step = trace["meta"]["z_step"]
    ints = _array(trace["z"])
    assert ints.dtype == np.int16 and step <= 1e-3
    return np.where(ints == nan, np.nan, ints * step), step


def _traces(data: dict, figure: str, episode: int, **match) -> list[dict]:
    """The traces of one episode (and backbone mode) in a time panel, in order."""
    return [t for t in data["figures"][figure]["data"] if t["meta"]["episode"] == episode
            and all(t["meta"].get(k, t.get(k)) == v for k, v in match.items())]


def _titles(figure: dict) -> list[str]:
    layout = figure["layout"]
    return [layout["title"]["text"]] + [a["text"] for a in layout.get("annotations", [])]


def _summary_text(page: str) -> str:
    summary = re.search(r'<div id="summary">(.*?)</div>', page, re.S).group(1)
    return html.unescape(re.sub(r"<[^>]+>", "", summary))


def test_page_holds_every_panel_and_the_data_of_every_frame(page_html, run_dir):
    run = load_trace(run_dir)
    data = run_data(page_html)
    frames, overlays = still_pictures(data["frames"]), still_pictures(data["overlays"])
    assert data["n"] == N and len(frames) == N and len(overlays) == N
    recorded = {i: decode_jpeg(run.frame_jpeg(i)).astype(float) for i in range(N)}
    assert [nearest_step(picture, recorded) for picture in frames] == list(range(N))   # one video frame a step
    assert np.abs(frames[7] - recorded[7]).mean() < 8
    assert set(PANELS) <= set(data["figures"])
    for name in PANELS:
        assert f'id="fig-{name}"' in page_html
    for text in ("Play", "scrubber", "saliency overlay", "Sensory gates q / k / v", "inter / command / motor",
                 "Attention over past frames", "NCP backbone wiring", "phi, tau, logits", 'id="episode"'):
        assert text in page_html
    assert run.episode_spans() == [(0, 0, 20), (1, 20, 40)]
    # each time panel holds one trace per episode, on the episode's own steps from 0
    sensory = _traces(data, "sensory", 1, type="heatmap")
    assert len(sensory) == 3 and list(_array(sensory[0]["x"])) == list(range(20))
    z, step = _heatmap_z(sensory[0])
    np.testing.assert_allclose(z, run.q[20:40].T, atol=step / 2 + 1e-7)
    H, n_inter = run.inter_mean.shape[1:]
    for mode, values in (("mean", run.inter_mean), ("top", run.inter_top)):   # both reductions, one shown at a time
        inter = _traces(data, "backbone", 1, mode=mode)[0]
        z, step = _heatmap_z(inter)
        assert z.shape == (H * n_inter, 20) and inter["visible"] is False
        np.testing.assert_allclose(z[n_inter + 2], values[20:40, 1, 2], atol=step / 2 + 1e-7, equal_nan=True)
    assert _traces(data, "backbone", 0, mode="mean")[0]["visible"] is True
    assert _traces(data, "backbone", 0, mode="top")[0]["visible"] is False
    # actions: policy and expert per episode
    actions = _traces(data, "actions", 1)
    assert {t["name"] for t in actions} == {"policy", "expert", "return so far", "cross-track error"}
    np.testing.assert_allclose(_array(actions[0]["y"]), run.policy_action[20:40, 0], rtol=1e-6)
    np.testing.assert_allclose(_array(actions[1]["y"]), run.expert_action[20:40, 0], rtol=1e-6)
    assert data["time_figures"] == TIME_PANELS
    for name in data["time_figures"]:
        assert f'id="cursor-{name}"' in page_html
    # wiring graph: one node per neuron of each group, coloured by group
    nodes = [t for t in data["figures"]["wiring"]["data"] if t.get("mode") == "markers"]
    groups = run.metadata["nac"]["groups"]
    sizes = {t["name"].split(" ")[0]: len(_array(t["x"])) for t in nodes}
    assert {k: sizes[k] for k in ("sensory", "inter", "command", "motor")} == groups
    assert len({t["marker"]["color"] for t in nodes}) == len(nodes)
    # the summary says how far from uniform the attention is
    median = np.nanmedian(run.attention_entropy())
    assert 0 < median <= 1 and f"<b>attention entropy</b> {median:.3f} of its maximum" in page_html


def test_episodes_have_their_returns_and_a_running_return_that_restarts(page_html, run_dir):
    run = load_trace(run_dir)
    data = run_data(page_html)
    spans = run.episode_spans()
    sums = [float(run.reward[a:b].astype(np.float64).sum()) for _, a, b in spans]
    assert [(e["id"], e["start"], e["stop"], e["steps"]) for e in data["episodes"]] == [(0, 0, 20, 20), (1, 20, 40, 20)]
    assert [e["return"] for e in data["episodes"]] == pytest.approx(sums, rel=1e-6)
    assert sums[0] != pytest.approx(sums[1]) and sum(sums) == pytest.approx(float(run.reward.sum()), rel=1e-5)
    bars = data["figures"]["returns"]["data"][0]
    assert list(bars["x"]) == ["0", "1"] and list(_array(bars["y"])) == pytest.approx(sums, rel=1e-6)
    for e, total in enumerate(sums):    # the table: one row per episode, its steps and return
        assert re.search(rf'<tr data-episode="{e}"><td>{e}</td><td>20</td><td>{total:.1f}</td>', page_html)
    # the return so far restarts at each episode: it is the running sum of that episode's rewards
    for e, (_, a, b) in enumerate(spans):
        running = _array(_traces(data, "actions", e, name="return so far")[0]["y"])
        np.testing.assert_allclose(running, np.cumsum(run.reward[a:b]), rtol=1e-5)
        assert running[0] == pytest.approx(run.reward[a])
    np.testing.assert_allclose(unpacked(data["readout"]["running_return"])[20:],
                               np.cumsum(run.reward[20:40]), rtol=1e-5)
    assert "reward" not in {t["name"] for t in data["figures"]["actions"]["data"]}   # no per-frame sawtooth
    # a continuous action: the mean |policy - expert| per column, per episode
    mad = np.abs(run.policy_action[20:40] - run.expert_action[20:40]).mean(axis=0)
    assert data["episodes"][1]["agreement"]["mad"] == pytest.approx(mad, rel=1e-5, abs=1e-7) and mad[0] > 0.01
    assert f"steer {mad[0]:.3f}, gas {mad[1]:.3f}" in page_html


def test_titles_say_policy_alone_without_an_expert_and_no_empty_panel(page_html, tmp_path):
    data = run_data(page_html)                     # an expert and a cross-track error: both shown
    assert _titles(data["figures"]["actions"])[0] == "Actions: policy vs expert"
    assert "cross-track error" in _titles(data["figures"]["actions"])

    no_expert = tmp_path / "no-expert"             # E = 0, no cross-track error recorded
    make_synthetic_run(no_expert, steps=12, seed=4, with_expert=False, with_cte=False, with_saliency=False)
    nan_expert = tmp_path / "nan-expert"           # an expert column that is all NaN, no reward either
    rec = RunRecorder(nan_expert, action_names=["steering"], expert_action_names=["steering"])
    for i in range(4):
        rec.add(frame=np.full((16, 16, 3), 40 * i, np.uint8), policy_action=0.1 * i, expert_action=np.nan,
                timestamp=0.1 * i)
    rec.save()
    assert load_trace(nan_expert).expert_action.shape == (4, 1)
    for run_dir in (no_expert, nan_expert):
        page = build_dashboard(run_dir).read_text(encoding="utf-8")
        data = run_data(page)
        titles = [t for fig in data["figures"].values() for t in _titles(fig)]
        names = [t.get("name", "") for fig in data["figures"].values() for t in fig["data"]]
        assert _titles(data["figures"]["actions"])[0] == "Actions: policy"
        assert not any("expert" in t for t in titles + names), titles
        assert "cross-track error" not in _titles(data["figures"]["actions"]) and data["readout"]["cte"] is None
        assert data["readout"]["expert"] is None and "agreement" not in data["episodes"][0]
        assert "policy vs expert" not in page and "mean |policy - expert|" not in page
    assert "returns" not in data["figures"] and data["episodes"][0]["return"] is None    # no reward: no returns
    assert _titles(data["figures"]["actions"])[1:] == ["steering"]      # the action alone: no empty row


def test_header_is_a_readable_summary_not_a_json_dump(tmp_path, page_html):
    from nac_drive.policy.driving_policy import PolicyConfig

    classes = ["noop", "right", "left", "gas", "brake"]
    config = dataclasses.asdict(PolicyConfig())      # what drive --trace records
    rec = RunRecorder(tmp_path, metadata={"env": "CarRacing-v3", "policy": "shipped", "policy_config": config,
                                          "laps": [True, False]},
                      action_names=classes, expert_action_names=classes)
    for episode, rewards in enumerate(([1.0, 2.0, -0.5], [3.0, 3.0, 3.0, 1.0])):
        rec.new_episode()
        for i, r in enumerate(rewards):
            rec.add(frame=np.full((16, 16, 3), 30 * i, np.uint8), policy_action=i % 5, expert_action=0, reward=r,
                    timestamp=0.02 * i)
    rec.save()
    page = build_dashboard(tmp_path).read_text(encoding="utf-8")
    text = _summary_text(page)
    for dump in ("{", "}", '"', "policy_config", "head_dropout", "format_version"):
        assert dump not in text, (dump, text)
    for part in ("env CarRacing-v3", "policy shipped, carracing, carracing_cnn, discrete actions (5)",
                 "core nac, window 16; no NAC trace in this run", "steps 7 in 2 episodes",
                 "return mean 6.2 (min 2.5, max 10.0)", "laps 1 of 2 finished",
                 "policy vs expert same action on 28.6% of steps"):
        assert part in text, (part, text)
    assert "<td>finished</td>" in page and "<td>not finished</td>" in page and "True" not in text
    data = run_data(page)
    assert [e["agreement"]["match"] for e in data["episodes"]] == pytest.approx([1 / 3, 1 / 4])
    # a NAC run: its settings in words
    text = _summary_text(page_html)
    assert "core NAC, mode exact, window 8, 2 heads, top-4 keys, d_model 16" in text and "{" not in text
    assert "steps 40 in 2 episodes" in text and "seed 1" in text


def test_window_attribution_stands_where_the_attention_stood(page_html, run_dir):
    with np.load(run_dir / "window_attribution.npz", allow_pickle=False) as f:
        shares = f["shares"]
    data = run_data(page_html)
    assert data["attribution"]["window"] == 6 and data["attribution"]["method"] == "integrated gradients"
    np.testing.assert_array_equal(unpacked(data["attribution"]["shares"]), shares)
    assert np.isnan(shares[20, 1]) and not np.isnan(shares[25, 5])   # NaN before the episode's start
    for e, (a, b) in enumerate(((0, 20), (20, 40))):
        heatmap = _traces(data, "attribution", e)[0]
        assert list(_array(heatmap["y"])) == list(range(6))
        z, step = _heatmap_z(heatmap)
        np.testing.assert_allclose(z, shares[a:b].T, atol=step / 2 + 1e-7, equal_nan=True)   # NaN kept
    assert "integrated gradients" in _titles(data["figures"]["attribution"])[0]
    # the attribution first, the flat attention further down, after the neuron panels
    at = page_html.index
    assert at('id="fig-attribution"') < at('id="fig-attribution_now"') < at('id="fig-wiring"') \
        < at('id="fig-dynamics"') < at('id="fig-attention_now"') < at('id="fig-attention_time"')


def test_window_attribution_of_another_trace_is_noted_not_shown(run_dir, tmp_path):
    shutil.copytree(run_dir / "trace", tmp_path / "trace")
    shutil.copy(run_dir / "saliency.npz", tmp_path / "saliency.npz")
    write_window_attribution(tmp_path, trace_sha256="0" * 64)
    page = build_dashboard(tmp_path).read_text(encoding="utf-8")
    data = run_data(page)
    assert data["attribution"] is None and "attribution" not in data["figures"]
    note = re.search(r'<div class="note" id="attribution-note">(.*?)</div>', page).group(1)
    assert "window_attribution.npz is not shown" in note and "computed from another trace " in note
    # the attention over past frames stands where it stood
    assert page.index('id="fig-attention_now"') < page.index('id="fig-wiring"') < page.index('id="fig-sensory"')
    write_window_attribution(tmp_path)             # recomputed for this trace: shown
    assert run_data(build_dashboard(tmp_path).read_text(encoding="utf-8"))["attribution"]["window"] == 6


def test_run_trace_and_dashboard_render_in_a_notebook(run_dir, page_html, tmp_path):
    run = load_trace(run_dir)
    text = repr(run)
    assert len(text) < 500 and "40 steps, 2 episodes" in text and "NAC" in text, text
    long = dataclasses.replace(run, path=Path("/" + "x" * 2000) / "trace",
                               metadata={**run.metadata, "action_names": ["y" * 1000] * 3})
    assert len(repr(long)) < 500
    view = run._repr_html_()
    assert ">40<" in view and "2: 20, 20 steps" in view and "cross-track error" in view and len(view) < 2000
    returns = [float(run.reward[a:b].sum()) for _, a, b in run.episode_spans()]
    assert f"{returns[0]:.1f}, {returns[1]:.1f}" in view
    frame = Dashboard(run_dir / "dashboard.html")._repr_html_()
    m = re.fullmatch(r'<iframe srcdoc="([^"]*)" [^>]*></iframe>', frame, re.S)
    assert m and html.unescape(m.group(1)) == page_html and "<" not in m.group(1) and m.group(1).isascii()
    with pytest.raises(ValueError, match="no such dashboard page"):
        Dashboard(tmp_path / "none.html")
    # a run folder: its page is built as `nac-drive dashboard RUN_DIR` builds it, then shown
    copy = tmp_path / "copied-run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("dashboard.html"))
    assert main(["dashboard", str(copy), "-o", str(tmp_path / "cli.html")]) == 0
    view = Dashboard(copy, title="from the notebook")
    assert view.path == copy / "dashboard.html"
    page = html.unescape(re.fullmatch(r'<iframe srcdoc="([^"]*)" [^>]*></iframe>', view._repr_html_(), re.S).group(1))
    cli_page = (tmp_path / "cli.html").read_text(encoding="utf-8")
    assert "<title>from the notebook</title>" in page
    notebook_data, cli_data = run_data(page), run_data(cli_page)
    for key in ("frames", "overlays"):   # a WebM holds a random segment id: the same pictures, other bytes
        assert len(still_pictures(notebook_data.pop(key))) == len(still_pictures(cli_data.pop(key))) == N
    assert notebook_data == cli_data
    with pytest.raises(ValueError, match="build options are for a run folder"):
        Dashboard(view.path, title="x")


def test_page_has_no_external_resources(page_html):
    assert "plotly.js v" in page_html[:2_000_000]                       # plotly inline
    tags = re.findall(r"<(?:script|link|img|iframe)\b[^>]*>", page_html)
    assert tags
    for tag in tags:
        assert not re.search(r"""\b(?:src|href)\s*=\s*["']?(?:https?:)?//""", tag), tag
    assert not re.search(r"""url\(\s*["']?https?://""", page_html.split("<script>")[0])   # CSS


def test_frame_videos_are_made_coarser_then_smaller_to_fit(run_dir, page_html, tmp_path):
    full = run_data(page_html)
    out = build_dashboard(run_dir, tmp_path / "small.html", image_budget=20_000)
    data = run_data(out.read_text(encoding="utf-8"))
    total = len(data["frames"]["b64"]) + len(data["overlays"]["b64"])
    assert total <= 20_000 < len(full["frames"]["b64"]) + len(full["overlays"]["b64"])
    pictures = still_pictures(data["frames"])
    assert len(pictures) == N and pictures[0].shape[0] == data["frames"]["height"] < 96


def test_run_without_nac_or_saliency_with_discrete_actions(tmp_path):
    classes = ["noop", "right", "left", "gas", "brake"]
    rec = RunRecorder(tmp_path, action_names=classes, expert_action_names=classes)
    for i in range(5):
        rec.add(frame=np.full((16, 16, 3), 40 * i, np.uint8), policy_action=i % 5, expert_action=3,
                timestamp=0.1 * i)
    rec.save()
    page = build_dashboard(tmp_path).read_text(encoding="utf-8")
    data = run_data(page)
    assert data["has_nac"] is False and data["overlays"] is None
    assert list(data["figures"]) == ["actions"] and len(still_pictures(data["frames"])) == 5
    assert 'id="no-nac"' in page and 'id="fig-sensory"' not in page          # no empty neuron panels
    # a discrete action is one column of class indices, labelled with the class names
    assert data["readout"]["policy_classes"] == classes and data["readout"]["policy_names"] == ["action"]
    assert data["figures"]["actions"]["layout"]["yaxis"]["ticktext"] == classes
    assert data["episodes"][0]["agreement"] == {"match": pytest.approx(0.2)}   # the same class at step 3 alone
    RunRecorder(tmp_path / "empty").save()                                      # a run of no steps still shows
    data = run_data(build_dashboard(tmp_path / "empty").read_text(encoding="utf-8"))
    assert (data["n"], data["episodes"], list(data["figures"])) == (0, [], ["actions"])


def test_cli_writes_the_dashboard_and_names_a_missing_trace(run_dir, tmp_path, capsys):
    out = tmp_path / "d.html"
    assert main(["dashboard", str(run_dir), "-o", str(out)]) == 0
    assert run_data(out.read_text(encoding="utf-8"))["n"] == N
    assert main(["dashboard", str(tmp_path / "nowhere")]) == 2
    assert "nowhere: no such file or folder" in capsys.readouterr().err


@pytest.mark.slow
def test_five_thousand_frame_episodes_with_saliency_fit_25_mb(tmp_path):
    # 5 CarRacing episodes of 1000 steps at the policy's default NAC size (d_model 64, 4 heads,
    # top-8, window 16), with saliency. The synthetic road frames are flat road and grass like
    # CarRacing's, plus a per-pixel grain CarRacing does not have: they compress worse than the
    # real frames (the grain changes every frame), so the size measured here is an upper bound.
    make_synthetic_run(tmp_path, steps=5000, seed=2, d_model=64, num_heads=4, topk=8, window=16, input_dim=64,
                       episodes=5)
    out = build_dashboard(tmp_path)
    size = out.stat().st_size
    assert size <= 25e6, f"{size / 1e6:.1f} MB"
    data = run_data(out.read_text(encoding="utf-8"))
    run = load_trace(tmp_path)
    assert [e["steps"] for e in data["episodes"]] == [1000] * 5
    frames, overlays = still_pictures(data["frames"]), still_pictures(data["overlays"])
    assert len(frames) == len(overlays) == 5000
    for i in (0, 999, 1000, 2500, 4999):   # still one video frame a step, at the recorded size
        recorded = {j: decode_jpeg(run.frame_jpeg(j)).astype(float) for j in range(max(0, i - 2), min(5000, i + 3))}
        assert frames[i].shape == (96, 96, 3) and nearest_step(frames[i], recorded) == i


# ------------------------------------------------------------------ real browser
def _shown_picture_step(page, pictures: dict[int, np.ndarray], stream: str = "frames") -> int:
    """Wait until the shown frame (or overlay) video has seeked to the selected step, then
    read its picture from a canvas: the step of ``pictures`` it is closest to."""
    page.wait_for_function(f"""() => {{ const v = window.dashboard.stills.{stream}, d = window.dashboard.data.{stream};
        return !v.hidden && !v.seeking && v.readyState >= 2
            && Math.abs(v.currentTime - (window.dashboard.state.frame + 0.5) / d.fps) < 1e-3; }}""", timeout=10_000)
    height, width = next(iter(pictures.values())).shape[:2]
    picture = page.evaluate(f"""() => {{
        const v = window.dashboard.stills.{stream}, c = document.createElement('canvas');
        c.width = {width}; c.height = {height};
        const g = c.getContext('2d'); g.imageSmoothingEnabled = false;
        g.drawImage(v, 0, 0, {width}, {height});
        return Array.from(g.getImageData(0, 0, {width}, {height}).data); }}""")
    return nearest_step(np.array(picture, dtype=float).reshape(height, width, 4)[..., :3], pictures)


@pytest.mark.browser
@pytest.mark.slow
def test_dashboard_in_headless_chromium(run_dir, page_html):
    dashboard_page = chromium_dashboard_page()
    run = load_trace(run_dir)
    recorded = {i: decode_jpeg(run.frame_jpeg(i)).astype(float) for i in range(N)}
    with np.load(run_dir / "window_attribution.npz", allow_pickle=False) as f:
        shares = f["shares"]
    with dashboard_page(run_dir / "dashboard.html") as (page, problems):
        state = """() => ({frame: window.dashboard.state.frame,
                          episode: window.dashboard.state.episode, slider: document.getElementById('scrubber').value,
                          sliderMax: document.getElementById('scrubber').max,
                          cursors: window.dashboard.data.time_figures.map(
                              (n) => document.getElementById('cursor-' + n).dataset.frame),
                          x: document.getElementById('cursor-sensory').getBoundingClientRect().left,
                          ages: Array.from(document.getElementById('fig-attention_now').data[0].x),
                          shares: Array.from(document.getElementById('fig-attribution_now').data[0].y),
                          shownEpisodes: [...new Set(document.getElementById('fig-actions').data
                              .filter((t) => t.visible !== false).map((t) => t.meta.episode))],
                          shownPolicy: Array.from(document.getElementById('fig-actions')._fullData
                              .find((t) => t.visible === true && t.name === 'policy').y),
                          selectedRow: document.querySelector('#episode-table tr.selected').dataset.episode,
                          label: document.getElementById('frame-label').textContent})"""
        before = page.evaluate(state)
        assert before["cursors"] == ["0"] * 6 and _shown_picture_step(page, recorded) == 0
        assert before["shownEpisodes"] == [0] and before["sliderMax"] == "19" and before["selectedRow"] == "0"
        # per-episode returns are on screen: the table and the bars
        returns = [f"{run.reward[a:b].sum():.1f}" for _, a, b in run.episode_spans()]
        cells = page.locator("#episode-table tbody td").all_text_contents()
        assert cells[2] == returns[0] and cells[cells.index("1") + 2] == returns[1]
        assert page.locator("#episode-table").is_visible() and page.locator("#fig-returns .bars").is_visible()

        # the episode selector shows episode 1 on its own axis: step 0 is the run's step 20
        page.locator("#episode").select_option("1")
        page.wait_for_function("document.getElementById('cursor-sensory').dataset.frame === '20'")
        shown = page.evaluate(state)
        assert (shown["episode"], shown["frame"], shown["slider"], shown["sliderMax"]) == (1, 20, "0", "19")
        assert shown["shownEpisodes"] == [1] and shown["selectedRow"] == "1"
        np.testing.assert_allclose(shown["shownPolicy"], run.policy_action[20:40, 0], rtol=1e-6)
        assert "episode 1 · step 0 / 19" in shown["label"]
        assert _shown_picture_step(page, recorded) == 20

        page.locator("#scrubber").fill("5")
        page.wait_for_function("document.getElementById('cursor-sensory').dataset.frame === '25'")
        after = page.evaluate(state)
        assert _shown_picture_step(page, recorded) == 25
        assert after["cursors"] == ["25"] * 6 and "episode 1 · step 5 / 19" in after["label"]
        # the cursor sits at step 5 of the episode on the heatmap's x axis
        axis = page.evaluate("""() => { const ax = document.getElementById('fig-sensory')._fullLayout.xaxis;
            const box = document.getElementById('fig-sensory').getBoundingClientRect();
            return [box.left + ax._offset + ax.l2p(0), box.left + ax._offset + ax.l2p(5)]; }""")
        assert after["x"] - axis[0] == pytest.approx(axis[1] - axis[0], abs=1.5) and axis[1] - axis[0] > 100
        assert sorted(after["ages"]) == sorted(a for a in run.key_age[25, 0] if a >= 0)
        np.testing.assert_allclose(after["shares"], shares[25][~np.isnan(shares[25])], rtol=1e-6)

        page.locator("#overlay-toggle").check()
        overlays = {i: picture.astype(float) for i, picture in enumerate(still_pictures(run_data(page_html)["overlays"]))}
        assert _shown_picture_step(page, overlays, "overlays") == 25
        assert page.locator("#overlay").is_visible() and not page.locator("#frame").is_visible()

        shown_heatmap = """document.getElementById('fig-backbone')._fullData   // plotly's decoded arrays
                     .find((t) => t.type === 'heatmap' && t.visible === true)"""
        for mode, values in (("top", run.inter_top), ("mean", run.inter_mean)):   # head 0, inter neuron 3
            page.locator("#backbone-mode").select_option(mode)
            page.wait_for_timeout(200)
            row, step = page.evaluate(f"[Array.from(({shown_heatmap}).z[3]), ({shown_heatmap}).meta.z_step]")
            np.testing.assert_allclose(np.array(row, dtype=float), values[20:40, 0, 3].astype(float),
                                       atol=step / 2 + 1e-7, equal_nan=True)   # int16 steps of meta.z_step
        assert not np.allclose(run.inter_top[20:40, 0, 3], run.inter_mean[20:40, 0, 3])

        page.locator("#play").click()      # plays to the episode's end and stops there
        page.wait_for_function("window.dashboard.state.frame === 39 && !window.dashboard.state.playing",
                               timeout=10_000)
        # clicking a time panel jumps to that step of the episode
        page.locator("#fig-sensory").scroll_into_view_if_needed()
        box = page.locator("#fig-sensory .nsewdrag").first.bounding_box()
        page.mouse.click(box["x"] + box["width"] * 0.2, box["y"] + box["height"] / 2)
        page.wait_for_function("window.dashboard.state.frame >= 20 && window.dashboard.state.frame < 28",
                               timeout=5_000)
        page.wait_for_function("document.getElementById('cursor-sensory').dataset.frame"
                               " === String(window.dashboard.state.frame)", timeout=5_000)
        # a row of the episode table selects its episode
        page.locator('#episode-table tr[data-episode="0"]').click()
        page.wait_for_function("window.dashboard.state.episode === 0 && window.dashboard.state.frame === 0")
        assert page.evaluate(state)["shownEpisodes"] == [0]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        assert problems == []


# ------------------------------------------------------------------ explain.json's newer sections
def _explain_report(run_dir) -> dict:
    """An explain.json of a non-NAC policy with every section the dashboard draws for one."""
    def summary(mean, half=0.05):
        return {"mean": mean, "ci95": [mean - half, mean + half], "frames": 8, "blocks": 4}

    methods = ("gradcam", "occlusion", "random", "random_cam_grid")
    paired = {m: {b: {"deletion_auc": dict(summary(-0.1 * (i + 1) - 0.01 * j), items=8),
                      "insertion_auc": dict(summary(0.1 * (i + 1) + 0.01 * j), items=8)}
                  for j, b in enumerate(("random", "random_cam_grid"))} for i, m in enumerate(methods[:2])}
    return {"trace_sha256": load_trace(run_dir).sha256, "core": "gru",
            "skipped": {"fig4": "needs the NAC's <tau>; this policy's core is gru", "atlas": "needs the NAC"},
            "fig4": None, "atlas": None, "closed_loop": None,
            "saliency": {"frames": 8, "steps": 16, "cascade": [], "blocks": {"by": "time", "count": 4},
                         "methods": {m: {"deletion_auc": summary(0.3), "insertion_auc": summary(0.6),
                                         "sanity_spearman": {}} for m in methods},
                         "paired": paired, "road_share": {m: summary(0.2 + 0.1 * i) for i, m in enumerate(methods)},
                         "road_pixel_share": summary(0.18), "road_mask": "grey pixels above the car"},
            "window": {"method": "integrated_gradients", "window": 6, "completeness": {
                "rule": "steps doubled", "tolerance": 0.05, "decisions": 40, "incomplete": 1,
                **{key: {"median": 0.01 * (k + 1), "max": 0.02 * (k + 1)}
                   for k, key in enumerate(("steps", "error", "difference", "ratio"))}}},
            "mirror": {"frames": 40, "decision": "action", "turn_frames": 12, "flips": 0.75, "stays": 0.25,
                       "mirror_agreement": 0.8, "units": {"core": _swapped_units()}},
            **_probes_and_dictionary()}


def _swapped_units() -> dict:
    """The mirror's unit report of 4 units, units 0 and 1 swapped (unit_partners)."""
    from nac_drive.interpret.mirror import unit_partners

    rng = np.random.default_rng(0)
    intact = rng.normal(size=(200, 4))
    mirrored = intact[:, [1, 0, 2, 3]] * [1, 1, 1, -1]
    return unit_partners(intact, mirrored, ["<y0>", "y1", "y2", "y3"])


def _probes_and_dictionary() -> dict:
    """The probes and dictionary sections (linear_probes, sparse_dictionary) of a core output
    of 6 units over 3 episodes, whose unit 0 is the curvature; a push made up beside them."""
    from nac_drive.interpret.dictionary import sparse_dictionary
    from nac_drive.interpret.probes import linear_probes

    rng = np.random.default_rng(1)
    x = rng.normal(size=(450, 6))
    variables = {"curvature": x[:, 0] + 0.1 * rng.normal(size=450), "speed": rng.normal(size=450)}
    episode = np.repeat([0, 1, 2], 150)
    probes = linear_probes({"core": x}, variables, episode, resamples=50)
    probes["intervention"] = {"steering": "P(right) - P(left)", "verdict": "follows",
                              "random_directions": {"count": 20, "outdone": 0.95}, "pushes": [
        {"push": name, "change": {"mean": mean, "ci95": [mean - 0.01, mean + 0.01]}}
        for name, mean in (("left", -0.2), ("right", 0.2), ("random +", 0.01), ("random -", -0.01))]}
    return {"probes": probes, "dictionary": sparse_dictionary(x, episode, variables)}


@pytest.fixture(scope="module")
def explained_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("explained")
    make_synthetic_run(d, steps=N, seed=2, episodes=EPISODES)
    report = _explain_report(d)
    (d / "explain.json").write_text(json.dumps(report))
    build_dashboard(d, d / "dashboard.html")
    return d, report


NEW_EXPLAIN_PANELS = ("explain_skipped", "explain_paired", "explain_road_share", "explain_mirror",
                      "explain_mirror_units", "explain_probes", "explain_dictionary", "explain_completeness")


def test_the_newer_explain_sections_are_drawn_with_the_reports_figures(explained_run):
    run_dir, report = explained_run
    page = (run_dir / "dashboard.html").read_text(encoding="utf-8")
    figures = run_data(page)["figures"]
    assert set(NEW_EXPLAIN_PANELS) <= set(figures) and all(f'id="fig-{n}"' in page for n in NEW_EXPLAIN_PANELS)
    sections, reasons = figures["explain_skipped"]["data"][0]["cells"]["values"]
    assert sections == list(report["skipped"]) and reasons[0] == "needs the NAC's &lt;tau&gt;; this policy's core is gru"
    saliency = report["saliency"]
    for trace in figures["explain_paired"]["data"]:
        key = "deletion_auc" if trace["xaxis"] == "x" else "insertion_auc"
        expected = [saliency["paired"][m][trace["name"]][key]["mean"] for m in trace["x"]]
        assert _array(trace["y"]) == pytest.approx(expected)
        assert _array(trace["error_y"]["array"]) == pytest.approx([0.05] * len(expected))
    road = figures["explain_road_share"]
    assert _array(road["data"][0]["y"]) == pytest.approx([s["mean"] for s in saliency["road_share"].values()])
    assert road["layout"]["shapes"][0]["y0"] == pytest.approx(saliency["road_pixel_share"]["mean"])
    mirror = report["mirror"]
    assert _array(figures["explain_mirror"]["data"][0]["y"]) == pytest.approx(
        [mirror["flips"], mirror["stays"], mirror["mirror_agreement"]])
    cells = figures["explain_completeness"]["data"][0]["cells"]["values"]
    complete = report["window"]["completeness"]
    assert cells[0] == ["steps", "error", "difference", "ratio"]
    assert cells[2] == pytest.approx([complete[k]["max"] for k in cells[0]])


def test_the_mirror_units_probes_and_dictionary_are_drawn_with_the_reports_figures(explained_run):
    run_dir, report = explained_run
    page = (run_dir / "dashboard.html").read_text(encoding="utf-8")
    figures = run_data(page)["figures"]
    units = {trace["name"]: _array(trace["y"])[0] for trace in figures["explain_mirror_units"]["data"]}
    assert units == report["mirror"]["units"]["core"]["counts"] and units["swap"] == 2
    assert "&lt;y0&gt;&lt;-&gt;y1" in figures["explain_mirror_units"]["layout"]["title"]["text"]   # escaped
    probes = report["probes"]
    r2, control, push = figures["explain_probes"]["data"]
    assert r2["name"] == "core" and r2["x"] == ["curvature", "speed"]
    assert _array(r2["y"]) == pytest.approx([row["r2"] for row in probes["scores"]])
    assert _array(control["y"]) == pytest.approx([row["control_r2"] for row in probes["scores"]])
    assert _array(r2["y"])[0] > 0.9 and push["x"] == ["left", "right", "random +", "random -"]
    assert _array(push["y"]) == pytest.approx([-0.2, 0.2, 0.01, -0.01])
    assert "follows (beyond 95% of 20 random directions)" in figures["explain_probes"]["layout"]["title"]["text"]
    dictionary = report["dictionary"]
    bars, pca, table = figures["explain_dictionary"]["data"]
    assert _array(bars["y"]) == pytest.approx([row["variance_explained"] for row in dictionary["by_sparsity"]])
    assert table["cells"]["values"][2] == [f["label"] for f in dictionary["features"][:10]]


@pytest.mark.browser
@pytest.mark.slow
def test_the_newer_explain_panels_draw_in_headless_chromium(explained_run):
    """Every explain panel of the page is drawn with its data, and the page reports no error
    (a figure without its panel, or one plotly cannot draw, fails here)."""
    dashboard_page = chromium_dashboard_page()
    run_dir, _ = explained_run
    with dashboard_page(run_dir / "dashboard.html") as (page, problems):
        drawn = page.evaluate("""() => Object.keys(window.dashboard.data.figures).filter((n) => n.startsWith('explain_'))
            .map((n) => [n, window.dashboard.drawn.has(n), document.getElementById('fig-' + n).data.length,
                         document.querySelectorAll('#fig-' + n + ' .main-svg').length])""")
        assert {name for name, *_ in drawn} >= set(NEW_EXPLAIN_PANELS)
        assert all(is_drawn and traces > 0 and svgs > 0 for _, is_drawn, traces, svgs in drawn), drawn
        assert problems == []
