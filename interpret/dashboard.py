"""One self-contained HTML dashboard per recorded run (works offline, no server).

:func:`build_dashboard` reads ``RUN_DIR/trace.npz`` (and ``RUN_DIR/saliency.npz`` and
the run's WebM video, ``RUN_DIR/video.webm`` or one named, if present) and writes a single
HTML file: plotly.js inline (the copy bundled with the plotly package), frames and
saliency overlays as base64 JPEG, the video as base64 WebM, the figures as plotly JSON
(numeric arrays base64-packed by plotly), and a small script that ties every panel to one
frame scrubber.

Panels: the frame (saliency overlay on/off) and the video, which follows the scrubber and,
while it plays, moves it; policy vs expert actions, reward and
cross-track error over time; the attention over past frames for the current frame,
per head; the NCP backbone wiring coloured by neuron group; heatmaps (neurons x time)
of the sensory q/k/v gates and of the backbone's inter/command/motor layers (mean over
the selected pairs, or the top-weighted pair); phi, tau, logits and t_interp over
time per head (attention-weighted mean over the selected keys); attention weight by
key age over time, per head. Every time panel carries a cursor at the current frame.

Every string that comes from the run's files (action and class names, metadata, the
run folder's name) reaches the page as text, never as markup: HTML-escaped in the page,
escaped for plotly's own tags in figure text, ``<``, ``>`` and ``&`` escaped in the JSON
block (so it cannot end its ``<script>`` element or open a comment), and placed with
``textContent`` by the page script.
"""

from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from nac_drive.atomic import atomic_write
from nac_drive.interpret.archive import decode_jpeg, encode_jpeg
from nac_drive.interpret.saliency import SALIENCY_FILE, load_saliency
from nac_drive.interpret.trace import BACKBONE_GROUPS, RunTrace, load_trace
from nac_drive.video import read_webm_info

DEFAULT_IMAGE_BUDGET = 20_000_000  # bytes of base64 images; the whole page should stay <= 25 MB
VIDEO_FILE = "video.webm"
MAX_VIDEO_BYTES = 50_000_000       # a larger video is refused (it is embedded as it is)
PLAYABLE_CODECS = ("V_VP9", "V_VP8", "V_AV1")   # what browsers play in WebM
GROUP_COLOURS = {"sensory": "#1f77b4", "inter": "#2ca02c", "command": "#ff7f0e", "motor": "#d62728",
                 "readout": "#7f7f7f"}
HEAD_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]


def build_dashboard(run_dir: str | os.PathLike, out_html: str | os.PathLike | None = None,
                    image_budget: int = DEFAULT_IMAGE_BUDGET, title: str | None = None,
                    video: str | os.PathLike | None = None) -> Path:
    """Write the dashboard of the run in ``run_dir`` to ``out_html`` (default
    ``RUN_DIR/dashboard.html``); returns its path.

    Frames are embedded as recorded; if frames plus overlays would exceed
    ``image_budget`` bytes of base64, they are re-encoded smaller to fit. ``video``: the
    run's WebM, one video frame per recorded step (``drive --video``; default
    ``RUN_DIR/video.webm`` if it exists), embedded as it is.
    """
    from plotly.offline import get_plotlyjs

    run_dir = Path(run_dir)
    run = load_trace(run_dir)
    saliency_path = (run_dir if run_dir.is_dir() else run_dir.parent) / SALIENCY_FILE
    saliency = load_saliency(saliency_path, run) if saliency_path.exists() else None
    out_html = Path(out_html) if out_html is not None else run.path.parent / "dashboard.html"
    if video is None and (run.path.parent / VIDEO_FILE).is_file():
        video = run.path.parent / VIDEO_FILE
    video_data = _video_data(Path(video), run) if video is not None else None

    frames = [run.frame_jpeg(i) for i in range(run.num_steps)]
    overlays = [saliency.overlay_bytes(i) for i in range(run.num_steps)] if saliency else None
    frames, overlays = _fit_images(frames, overlays, image_budget)

    has_nac = run.q.shape[1] > 0 and bool(run.has_nac.any())
    figures = {"actions": _actions_figure(run)}
    if has_nac:
        figures.update(attention_now=_attention_now_figure(run), wiring=_wiring_figure(run),
                       sensory=_sensory_figure(run), backbone=_backbone_figure(run, "mean"),
                       dynamics=_dynamics_figure(run), attention_time=_attention_time_figure(run))
    data: dict[str, Any] = {
        "n": run.num_steps,
        "fps": _playback_fps(run.timestamp),
        "timestamp": _packed(run.timestamp.astype(np.float32)),
        "frames": [base64.b64encode(b).decode("ascii") for b in frames],
        "overlays": [base64.b64encode(b).decode("ascii") for b in overlays] if overlays else None,
        "saliency": saliency.metadata if saliency else None,
        "video": video_data,
        "readout": _readout(run),
        "has_nac": has_nac,
        "figures": {name: json.loads(fig.to_json()) for name, fig in figures.items()},
        "time_figures": [n for n in ("actions", "sensory", "backbone", "dynamics", "attention_time") if n in figures],
    }
    if has_nac:
        H, K = run.weights.shape[1:]
        data["attention"] = {name: _packed(getattr(run, name)) for name in ("weights", "phi", "tau", "logits")}
        data["attention"]["key_age"] = _packed(run.key_age.astype(np.int32))
        data["attention"]["heads"], data["attention"]["k"] = H, K
        data["backbone_z"] = {mode: [_packed(z) for z in _backbone_z(run, mode)] for mode in ("mean", "top")}
    page = _PAGE.format(title=html.escape(title or f"nac-drive run: {run.path.parent.name}"),
                        summary=_summary_html(run, saliency, video_data), plotly_js=get_plotlyjs(),
                        data=_script_json(data),
                        script=_SCRIPT, style=_STYLE)
    atomic_write(out_html, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    return out_html


# ------------------------------------------------------------------ data helpers
def _script_json(value: Any) -> str:
    """JSON for a ``<script>`` element: no ``<``, ``>`` or ``&`` (a string holding
    ``</script>`` or ``<!--`` would end the element or change how it is parsed) and no
    U+2028 / U+2029. The escapes are JSON's own, so ``JSON.parse`` reads the same data."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    for char in "<>&\u2028\u2029":
        text = text.replace(char, f"\\u{ord(char):04x}")
    return text


def _plotly_text(text: Any) -> str:
    """A string shown by plotly as it is: plotly reads ``<b>``, ``<a href>``, ``<span
    style>``... in titles and tick labels, and turns ``&lt;`` back into ``<``."""
    return html.escape(str(text), quote=False)


def _packed(a: np.ndarray) -> dict[str, Any]:
    """A float32 / int32 array as {dtype, shape, b64} for the page script (NaN kept)."""
    a = np.ascontiguousarray(a, dtype=np.int32 if a.dtype.kind in "iu" else np.float32)
    return {"dtype": "i4" if a.dtype == np.int32 else "f4", "shape": list(a.shape),
            "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def _fit_images(frames: list[bytes], overlays: list[bytes] | None, budget: int):
    """Re-encode the JPEGs smaller (quality 75, scaled down) until their base64 fits ``budget``."""
    images = frames + (overlays or [])

    def b64_size(blobs: list[bytes]) -> int:
        return sum(4 * ((len(b) + 2) // 3) for b in blobs)

    total = b64_size(images)
    if total <= budget or not frames:
        return frames, overlays
    import cv2

    decoded = [decode_jpeg(b) for b in images]
    scale = 1.0
    for _ in range(8):  # JPEG size is not proportional to area (headers, quality): iterate
        scale *= min(0.95, 0.95 * float(np.sqrt(budget / total)))
        smaller = []
        for img in decoded:
            h, w = img.shape[:2]
            size = (max(8, round(w * scale)), max(8, round(h * scale)))
            smaller.append(encode_jpeg(cv2.resize(img, size, interpolation=cv2.INTER_AREA), 75))
        total = b64_size(smaller)
        if total <= budget:
            break
    n = len(frames)
    return smaller[:n], (smaller[n:] if overlays else None)


def _video_data(path: Path, run: RunTrace) -> dict[str, Any]:
    """The run's video for the page: base64 WebM, its frame rate and size, after checking
    (from its container, nothing decoded) that it is a WebM browsers play with one frame
    per recorded step."""
    info = read_webm_info(path, max_bytes=MAX_VIDEO_BYTES)
    if info.codec not in PLAYABLE_CODECS:
        raise ValueError(f"{path}: codec {info.codec!r}, browsers play {', '.join(PLAYABLE_CODECS)} in WebM")
    if info.frames != run.num_steps:
        raise ValueError(f"{path}: {info.frames} video frames but the run's trace has {run.num_steps} steps "
                         f"(not this run's video: drive writes both with --video and --trace)")
    return {"b64": base64.b64encode(path.read_bytes()).decode("ascii"), "name": path.name, "codec": info.codec,
            "fps": info.fps or _playback_fps(run.timestamp), "width": info.width, "height": info.height,
            "frames": info.frames}


def _playback_fps(timestamp: np.ndarray) -> float:
    dt = np.diff(timestamp)
    dt = dt[np.isfinite(dt) & (dt > 0)]
    return float(np.clip(1.0 / np.median(dt), 1.0, 30.0)) if len(dt) else 10.0


def _columns(names: list[str] | None, width: int, prefix: str) -> tuple[list[str], list[str] | None]:
    """(column labels, class names). One column with several names is a discrete action:
    its values are indices into the class names."""
    if names and len(names) == width:
        return list(names), None
    if names and width == 1:
        return ["action"], list(names)
    return [f"{prefix}[{j}]" for j in range(width)], None


def _readout(run: RunTrace) -> dict[str, Any]:
    meta = run.metadata
    policy_names, policy_classes = _columns(meta.get("action_names"), run.policy_action.shape[1], "action")
    expert_names, expert_classes = _columns(meta.get("expert_action_names"), run.expert_action.shape[1], "expert")
    return {"policy": _packed(run.policy_action), "policy_names": policy_names, "policy_classes": policy_classes,
            "expert": _packed(run.expert_action) if run.expert_action.shape[1] else None,
            "expert_names": expert_names, "expert_classes": expert_classes,
            "reward": _packed(run.reward), "cte": _packed(run.cross_track_error)}


def _weighted(run: RunTrace, name: str) -> np.ndarray:
    """Attention-weighted mean of a per-key quantity: [N, H, K] -> [N, H] (NaN: no trace)."""
    x, w = getattr(run, name), run.weights
    valid = run.key_age >= 0
    total = np.where(valid, w, 0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(valid, w * np.nan_to_num(x), 0).sum(-1) / total
    return np.where(total > 0, out, np.nan)


def _backbone_z(run: RunTrace, mode: str) -> list[np.ndarray]:
    """Per group, z ``[H * n, N]``: rows head-major (h0 n0, h0 n1, ..., h1 n0, ...)."""
    out = []
    for g in BACKBONE_GROUPS:
        x = getattr(run, f"{g}_{mode}")                            # [N, H, n]
        out.append(x.reshape(len(x), -1).T)
    return out


def _summary_html(run: RunTrace, saliency, video: dict[str, Any] | None) -> str:
    meta = run.metadata
    items = [("steps", str(run.num_steps)), ("frame", "x".join(map(str, meta.get("frame_shape") or [])))]
    user = meta.get("run") or {}
    for key, value in user.items():
        items.append((key, json.dumps(value, sort_keys=True)[:160]))
    nac = meta.get("nac")
    if nac:
        g = nac["groups"]
        items.append(("NAC", f"d_model={nac['d_model']}, heads={nac['num_heads']}, topk={nac['topk']}, "
                             f"window={nac['window']}, mode={nac['mode']}; backbone per head: "
                             f"{g['sensory']} sensory, {g['inter']} inter, {g['command']} command, {g['motor']} motor"))
        entropy = run.attention_entropy()
        if np.isfinite(entropy).any():
            low, mid = np.nanpercentile(entropy, [5, 50])
            items.append(("attention entropy", f"{mid:.3f} of its maximum (median; 5th percentile {low:.3f}): "
                                               f"1 = uniform over the selected keys"))
    else:
        items.append(("NAC", "no NAC trace in this run"))
    if saliency:
        items.append(("saliency", f"{saliency.metadata.get('method')} on {saliency.metadata.get('target_layer')}, "
                                  f"target {saliency.metadata.get('target')}"))
    if video:
        items.append(("video", f"{video['name']}: {video['codec']} {video['width']}x{video['height']}, "
                               f"{video['frames']} frames at {video['fps']:g} fps"))
    return "".join(f"<span><b>{html.escape(k)}</b> {html.escape(v)}</span>" for k, v in items)


# ------------------------------------------------------------------ figures
def _layout(fig, height: int, title: str, **kw) -> None:
    fig.update_layout(template="plotly_white", height=height, title=dict(text=title, x=0.01, font=dict(size=15)),
                      margin=dict(l=70, r=20, t=50, b=45), hovermode="closest", **kw)


def _actions_figure(run: RunTrace):
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    meta, steps = run.metadata, np.arange(run.num_steps)
    A, E = run.policy_action.shape[1], run.expert_action.shape[1]
    pn, p_classes = _columns(meta.get("action_names"), A, "action")
    en, e_classes = _columns(meta.get("expert_action_names"), E, "expert")
    classes = p_classes or e_classes
    shape = "hv" if classes else "linear"
    rows = max(A, E)
    titles = [_plotly_text(pn[j] if j < A else en[j]) for j in range(rows)] + ["reward / cross-track error"]
    fig = make_subplots(rows=rows + 1, cols=1, shared_xaxes=True, vertical_spacing=0.07, subplot_titles=titles)
    for j in range(rows):
        if j < A:
            fig.add_trace(go.Scatter(x=steps, y=run.policy_action[:, j], name="policy", legendgroup="policy",
                                     showlegend=j == 0, line=dict(color="#1f77b4", width=1.5, shape=shape)),
                          row=j + 1, col=1)
        if j < E:
            fig.add_trace(go.Scatter(x=steps, y=run.expert_action[:, j], name="expert", legendgroup="expert",
                                     showlegend=j == 0, line=dict(color="#ff7f0e", width=1.5, dash="dot", shape=shape)),
                          row=j + 1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=run.reward, name="reward", line=dict(color="#2ca02c", width=1)),
                  row=rows + 1, col=1)
    fig.add_trace(go.Scatter(x=steps, y=run.cross_track_error, name="cross-track error",
                             line=dict(color="#9467bd", width=1)), row=rows + 1, col=1)
    if classes:   # discrete actions: name the classes on the y axis
        fig.update_yaxes(tickvals=list(range(len(classes))), ticktext=[_plotly_text(c) for c in classes],
                         range=[-0.5, len(classes) - 0.5],
                         row=1, col=1)
    fig.update_xaxes(title_text="step", row=rows + 1, col=1)
    _layout(fig, 130 + 110 * (rows + 1) + (20 * len(classes) if classes else 0), "Actions: policy vs expert",
            legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"))
    return fig


def _heatmap_rows(fig, z_list, labels_list, titles, H: int, zrange, colorbar_title: str):
    import plotly.graph_objects as go

    for r, (z, labels) in enumerate(zip(z_list, labels_list), start=1):
        fig.add_trace(go.Heatmap(z=z.astype(np.float32), x=np.arange(z.shape[1]), y=labels, colorscale="RdBu_r",
                                 zmin=zrange[0], zmax=zrange[1], zmid=0 if zrange[0] is None else None,
                                 showscale=r == 1, colorbar=dict(title=colorbar_title, len=0.5, y=1, yanchor="top"),
                                 hovertemplate="step %{x}<br>%{y}<br>%{z:.3f}<extra></extra>"), row=r, col=1)
        rows_per_head = z.shape[0] // H
        for h in range(1, H):  # thin separators between heads
            fig.add_shape(type="line", xref=f"x{'' if r == 1 else r} domain", yref=f"y{'' if r == 1 else r}",
                          x0=0, x1=1, y0=h * rows_per_head - 0.5, y1=h * rows_per_head - 0.5,
                          line=dict(color="rgba(0,0,0,0.5)", width=1))
        fig.update_yaxes(title_text=titles[r - 1], autorange="reversed", showticklabels=z.shape[0] <= 48,
                         tickfont=dict(size=8), row=r, col=1)


def _sensory_figure(run: RunTrace):
    from plotly.subplots import make_subplots

    H, D = run.weights.shape[1], run.q.shape[1]
    depth = D // H
    labels = [f"h{j // depth}·{j % depth}" for j in range(D)]
    limit = float(np.nanpercentile(np.abs(np.concatenate([run.q, run.k, run.v], 1)), 99) or 1.0)
    titles = ["q (query gate)", "k (key gate)", "v (value gate)"]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=titles)
    _heatmap_rows(fig, [run.q.T, run.k.T, run.v.T], [labels] * 3, ["q neuron", "k neuron", "v neuron"], H,
                  (-limit, limit), "activation")
    fig.update_xaxes(title_text="step", row=3, col=1)
    _layout(fig, 120 + 3 * max(140, 4 * D), "Sensory gates q / k / v (neurons x time)")
    return fig


def _backbone_figure(run: RunTrace, mode: str):
    from plotly.subplots import make_subplots

    H = run.weights.shape[1]
    zs = _backbone_z(run, mode)
    labels = [[f"h{r // (len(z) // H)}·{g[0]}{r % (len(z) // H)}" for r in range(len(z))]
              for g, z in zip(BACKBONE_GROUPS, zs)]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["inter", "command", "motor"], row_heights=[max(1, len(z)) for z in zs])
    _heatmap_rows(fig, zs, labels, ["inter neuron", "command neuron", "motor neuron"], H, (-1.0, 1.0), "tanh")
    fig.update_xaxes(title_text="step", row=3, col=1)
    total_rows = sum(len(z) for z in zs)
    _layout(fig, 160 + max(360, 7 * total_rows), "Backbone inter / command / motor (neurons x time, per head)")
    return fig


def _dynamics_figure(run: RunTrace):
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    H, steps = run.weights.shape[1], np.arange(run.num_steps)
    names = [("phi", "phi (content target)"), ("tau", "tau (time constant)"), ("logits", "logit"),
             ("t_interp", "t_interp (time vector)")]
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[t for _, t in names])
    for r, (name, label) in enumerate(names, start=1):
        y = _weighted(run, name)
        for h in range(H):
            fig.add_trace(go.Scatter(x=steps, y=y[:, h], name=f"head {h}", legendgroup=f"h{h}", showlegend=r == 1,
                                     line=dict(color=HEAD_COLOURS[h % len(HEAD_COLOURS)], width=1.2)), row=r, col=1)
        fig.update_yaxes(title_text=name, row=r, col=1)
    fig.update_xaxes(title_text="step", row=4, col=1)
    _layout(fig, 620, "phi, tau, logits, t_interp per head (attention-weighted mean over the selected keys)",
            legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"))
    return fig


def _attention_time_figure(run: RunTrace):
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    N, H, _ = run.weights.shape
    ages = run.key_age
    max_age = int(max(0, ages.max()))
    z = np.zeros((H, max_age + 1, N), dtype=np.float32)
    n_idx, h_idx, k_idx = np.nonzero(ages >= 0)
    np.add.at(z, (h_idx, ages[n_idx, h_idx, k_idx], n_idx), np.nan_to_num(run.weights[n_idx, h_idx, k_idx]))
    z[:, :, ~run.has_nac] = np.nan
    fig = make_subplots(rows=H, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=[f"head {h}" for h in range(H)])
    for h in range(H):
        fig.add_trace(go.Heatmap(z=z[h], x=np.arange(N), y=np.arange(max_age + 1), colorscale="Viridis", zmin=0,
                                 zmax=1, showscale=h == 0, colorbar=dict(title="weight", len=0.5, y=1, yanchor="top"),
                                 hovertemplate="step %{x}<br>%{y} frames ago<br>weight %{z:.3f}<extra></extra>"),
                      row=h + 1, col=1)
        fig.update_yaxes(title_text="frames ago", row=h + 1, col=1)
    fig.update_xaxes(title_text="step", row=H, col=1)
    _layout(fig, 100 + 160 * H, "Attention over past frames through the run (weight by key age)")
    return fig


def _attention_now_figure(run: RunTrace):
    import plotly.graph_objects as go

    H = run.weights.shape[1]
    max_age = int(max(0, run.key_age.max()))
    fig = go.Figure()
    for h in range(H):  # filled per frame by the page script
        fig.add_trace(go.Bar(x=[], y=[], name=f"head {h}", marker_color=HEAD_COLOURS[h % len(HEAD_COLOURS)],
                             hovertemplate="head " + str(h) + ": %{x} frames ago<br>weight %{y:.3f}<br>"
                                           "phi %{customdata[0]:.3f}, tau %{customdata[1]:.3f}, "
                                           "logit %{customdata[2]:.3f}<extra></extra>"))
    fig.update_xaxes(title_text="key age (frames ago)", range=[max_age + 0.5, -0.5], dtick=1 if max_age <= 32 else None)
    fig.update_yaxes(title_text="attention weight", rangemode="tozero")
    _layout(fig, 360, "Attention over past frames, current frame", barmode="group",
            legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"))
    return fig


def _wiring_figure(run: RunTrace):
    import plotly.graph_objects as go

    groups = run.metadata.get("nac", {}).get("groups") if run.metadata.get("nac") else None
    w = run.wiring
    if "wiring_sensory_to_inter" not in w:
        fig = go.Figure()
        fig.add_annotation(text="wiring masks were not recorded (RunRecorder(nac=...) not given)", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
        _layout(fig, 360, "NCP backbone wiring")
        return fig
    s2i, i2c, c2m = w["wiring_sensory_to_inter"], w["wiring_inter_to_command"], w["wiring_command_to_motor"]
    depth = s2i.shape[0] // 2
    columns = [("sensory", [f"q{j}" for j in range(depth)] + [f"k{j}" for j in range(depth)]),
               ("inter", [f"i{j}" for j in range(s2i.shape[1])]), ("command", [f"c{j}" for j in range(i2c.shape[1])]),
               ("motor", [f"m{j}" for j in range(c2m.shape[1])]), ("readout", ["phi", "tau"])]
    pos: dict[tuple[int, int], tuple[float, float]] = {}
    fig = go.Figure()
    for c, (_, labels) in enumerate(columns):
        n = len(labels)
        for j in range(n):
            pos[c, j] = (float(c), (j - (n - 1) / 2) / max(n - 1, 1) * min(1.0, n / 8))
    ex, ey = [], []
    masks = [s2i, i2c, c2m, np.ones((c2m.shape[1], 2))]
    for c, mask in enumerate(masks):
        for a, b in zip(*np.nonzero(mask)):
            (x0, y0), (x1, y1) = pos[c, a], pos[c + 1, b]
            ex += [x0, x1, None]
            ey += [y0, y1, None]
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="rgba(120,120,120,0.35)", width=1),
                             hoverinfo="skip", showlegend=False))
    for c, (group, labels) in enumerate(columns):
        xs, ys = zip(*(pos[c, j] for j in range(len(labels))))
        size = (groups or {}).get(group, len(labels))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"{group} ({size})" if group != "readout" else
                                 "phi / tau heads", text=labels, hovertemplate="%{text}<extra>" + group + "</extra>",
                                 marker=dict(size=11, color=GROUP_COLOURS[group], line=dict(color="white", width=1))))
    fig.update_xaxes(visible=False, range=[-0.3, len(columns) - 0.7])
    fig.update_yaxes(visible=False, range=[-0.6, 0.6])
    density = float(np.mean([w[k].mean() for k in ("wiring_q", "wiring_k", "wiring_v") if k in w] or [np.nan]))
    _layout(fig, 360, f"NCP backbone wiring (one head; sensory = [q_i ; k_j]); q/k/v gate density {density:.2f}",
            legend=dict(orientation="h", y=-0.02, yanchor="top", x=0.5, xanchor="center"))
    return fig


# ------------------------------------------------------------------ page
_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; background: #f4f5f7;
       color: #222; }
header { padding: 14px 22px 6px; }
header h1 { font-size: 20px; margin: 0 0 6px; }
#summary { font-size: 12.5px; color: #444; display: flex; flex-wrap: wrap; gap: 4px 18px; }
#controls { position: sticky; top: 0; z-index: 10; background: #fff; border-bottom: 1px solid #ddd;
            padding: 8px 22px; display: flex; align-items: center; gap: 14px; flex-wrap: wrap;
            box-shadow: 0 1px 3px rgba(0,0,0,0.06); }
#controls button { font-size: 14px; padding: 4px 14px; min-width: 78px; }
#scrubber { flex: 1; min-width: 240px; }
#frame-label { font-variant-numeric: tabular-nums; min-width: 190px; font-size: 14px; }
main { padding: 12px 22px 30px; display: grid; grid-template-columns: minmax(320px, 420px) 1fr; gap: 14px; }
.panel { background: #fff; border: 1px solid #e1e3e6; border-radius: 6px; padding: 8px; min-width: 0; }
.wide { grid-column: 1 / -1; }
.panel h2 { font-size: 15px; margin: 4px 6px 8px; font-weight: 600; }
#frame, #video { width: 100%; image-rendering: pixelated; border-radius: 4px; display: block; background: #000; }
#video-box { margin-top: 10px; }
#readout { font-size: 13px; margin: 8px 4px 0; line-height: 1.6; font-variant-numeric: tabular-nums; }
#readout td { padding: 0 10px 0 0; }
.note { color: #777; font-size: 13px; padding: 12px; }
.row2 { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
.fig-wrap { position: relative; }
.cursor { position: absolute; top: 0; left: 0; width: 2px; margin-left: -1px; background: rgba(0,0,0,0.7);
          pointer-events: none; display: none; z-index: 5; }
.pending { color: #999; font-size: 13px; padding: 20px; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
<script>{plotly_js}</script>
</head><body>
<header><h1>{title}</h1><div id="summary">{summary}</div></header>
<div id="controls">
  <button id="play" type="button">&#9654; Play</button>
  <input id="scrubber" type="range" min="0" max="0" step="1" value="0" aria-label="frame">
  <span id="frame-label"></span>
  <label>speed <select id="speed"><option value="0.25">0.25x</option><option value="0.5">0.5x</option>
    <option value="1" selected>1x</option><option value="2">2x</option><option value="4">4x</option></select></label>
  <label title="Grad-CAM overlay from saliency.npz"><input id="overlay-toggle" type="checkbox"> saliency overlay</label>
  <label>backbone <select id="backbone-mode"><option value="mean">mean over selected pairs</option>
    <option value="top">top-weighted pair</option></select></label>
</div>
<main>
  <section class="panel"><h2>Frame</h2><img id="frame" alt="current frame"><div id="readout"></div>
    <div id="video-box" hidden><h2>Video</h2><video id="video" controls muted playsinline preload="auto"></video></div>
  </section>
  <section class="panel"><div class="fig-wrap"><div id="fig-actions"></div><div class="cursor" id="cursor-actions"></div></div></section>
  <section class="panel wide nac"><div class="row2"><div id="fig-attention_now"></div><div id="fig-wiring"></div></div></section>
  <section class="panel wide nac"><div class="fig-wrap"><div id="fig-sensory"></div><div class="cursor" id="cursor-sensory"></div></div></section>
  <section class="panel wide nac"><div class="fig-wrap"><div id="fig-backbone"></div><div class="cursor" id="cursor-backbone"></div></div></section>
  <section class="panel wide nac"><div class="fig-wrap"><div id="fig-dynamics"></div><div class="cursor" id="cursor-dynamics"></div></div></section>
  <section class="panel wide nac"><div class="fig-wrap"><div id="fig-attention_time"></div><div class="cursor" id="cursor-attention_time"></div></div></section>
  <section class="panel wide" id="no-nac" hidden><div class="note">This run has no NAC trace: the neuron panels
    are not shown.</div></section>
</main>
<script type="application/json" id="run-data">{data}</script>
<script>{script}</script>
</body></html>
"""

_SCRIPT = r"""
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("run-data").textContent);
  const N = DATA.n;
  function unpack(p) {
    if (!p) return null;
    const bin = atob(p.b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return p.dtype === "i4" ? new Int32Array(bytes.buffer) : new Float32Array(bytes.buffer);
  }
  const fmt = (x) => (x === null || Number.isNaN(x)) ? "–" : x.toFixed(3);
  const R = DATA.readout;
  const policy = unpack(R.policy), expert = unpack(R.expert), reward = unpack(R.reward), cte = unpack(R.cte);
  const ts = unpack(DATA.timestamp);
  const A = R.policy.shape[1], E = R.expert ? R.expert.shape[1] : 0;
  const att = DATA.has_nac ? Object.fromEntries(["weights", "phi", "tau", "logits", "key_age"].map(
      (k) => [k, unpack(DATA.attention[k])])) : null;
  const bz = DATA.has_nac ? {mean: DATA.backbone_z.mean.map((p) => [p, unpack(p)]),
                             top: DATA.backbone_z.top.map((p) => [p, unpack(p)])} : null;

  const slider = document.getElementById("scrubber"), label = document.getElementById("frame-label");
  const img = document.getElementById("frame"), readout = document.getElementById("readout");
  const playBtn = document.getElementById("play"), speed = document.getElementById("speed");
  const overlayToggle = document.getElementById("overlay-toggle");
  const video = document.getElementById("video"), V = DATA.video;
  slider.max = String(Math.max(0, N - 1));
  if (!DATA.overlays) { overlayToggle.disabled = true; overlayToggle.parentElement.title = "no saliency.npz in this run"; }
  if (!DATA.has_nac) {
    document.querySelectorAll(".nac").forEach((el) => { el.hidden = true; });
    document.getElementById("no-nac").hidden = false;
    document.getElementById("backbone-mode").disabled = true;
  }
  const config = {responsive: true, displaylogo: false};
  const state = {frame: 0, playing: false, timer: null, pending: null, backbone: "mean"};

  // The names come from the run's files: text nodes only, never innerHTML.
  function renderReadout(i) {
    const table = document.createElement("table");
    const addRow = (label, texts, bold) => {
      const row = table.insertRow();
      row.insertCell().textContent = label;
      for (const text of texts) {
        const cell = row.insertCell();
        (bold ? cell.appendChild(document.createElement("b")) : cell).textContent = text;
      }
    };
    const value = (x, classes) => (classes && Number.isInteger(x) && classes[x] !== undefined
        ? classes[x] + " (" + x + ")" : fmt(x));
    addRow("", R.policy_names, true);
    addRow("policy", R.policy_names.map((_, j) => value(policy[i * A + j], R.policy_classes)));
    if (E) addRow("expert", R.expert_names.map((_, j) => value(expert[i * E + j], R.expert_classes)));
    readout.replaceChildren(table, "reward " + fmt(reward[i]) + " · cross-track error " + fmt(cte[i]));
  }

  function renderAttention(i) {
    const H = DATA.attention.heads, K = DATA.attention.k, xs = [], ys = [], cds = [];
    for (let h = 0; h < H; h++) {
      const x = [], y = [], cd = [];
      for (let k = 0; k < K; k++) {
        const o = (i * H + h) * K + k, age = att.key_age[o];
        if (age < 0) continue;
        x.push(age); y.push(att.weights[o]); cd.push([att.phi[o], att.tau[o], att.logits[o]]);
      }
      xs.push(x); ys.push(y); cds.push(cd);
    }
    Plotly.restyle("fig-attention_now", {x: xs, y: ys, customdata: cds});
  }

  // Cursor: a thin absolutely positioned line over each time panel, placed with the
  // panel's x axis (cheap: no plotly redraw while scrubbing or playing).
  function placeCursor(name) {
    const div = document.getElementById("fig-" + name), line = document.getElementById("cursor-" + name);
    const fl = div._fullLayout;
    if (!fl || !fl.xaxis || !line) return;
    const ax = fl.xaxis, x = ax._offset + ax.l2p(state.frame);
    const visible = x >= ax._offset - 0.5 && x <= ax._offset + ax._length + 0.5;
    line.style.display = visible ? "block" : "none";
    line.style.transform = "translateX(" + x.toFixed(1) + "px)";
    line.style.top = fl._size.t + "px";
    line.style.height = fl._size.h + "px";
    line.dataset.frame = String(state.frame);
  }

  function render() {
    state.pending = null;
    const i = state.frame;
    slider.value = String(i);
    label.textContent = "frame " + i + " / " + (N - 1) + "   t = " + (ts[i] - ts[0]).toFixed(2) + " s";
    const src = (overlayToggle.checked && DATA.overlays) ? DATA.overlays[i] : DATA.frames[i];
    img.src = "data:image/jpeg;base64," + src;
    renderReadout(i);
    // the video follows the scrubber (to the middle of frame i) unless it is playing
    if (V && video.paused && Math.abs(video.currentTime - (i + 0.5) / V.fps) >= 0.5 / V.fps) {
      video.currentTime = (i + 0.5) / V.fps;
    }
    for (const name of DATA.time_figures) if (drawn.has(name)) placeCursor(name);
    if (DATA.has_nac && drawn.has("attention_now")) renderAttention(i);
  }

  function setFrame(i) {
    state.frame = Math.max(0, Math.min(N - 1, Math.round(i)));
    if (state.pending === null) state.pending = requestAnimationFrame(render);
  }

  function setPlaying(on) {
    if (on && V) video.pause();
    state.playing = on;
    playBtn.innerHTML = on ? "&#10073;&#10073; Pause" : "&#9654; Play";
    clearInterval(state.timer);
    if (on) {
      if (state.frame >= N - 1) setFrame(0);
      state.timer = setInterval(() => {
        if (state.frame >= N - 1) { setPlaying(false); return; }
        setFrame(state.frame + 1);
      }, 1000 / (DATA.fps * Number(speed.value)));
    }
  }

  function setBackboneMode(mode) {
    state.backbone = mode;
    if (!drawn.has("backbone")) return;   // applied when drawn
    const z = bz[mode].map(([p, a]) => {
      const rows = [], [nr, nc] = p.shape;
      for (let r = 0; r < nr; r++) rows.push(Array.from(a.subarray(r * nc, (r + 1) * nc)));
      return rows;
    });
    const div = document.getElementById("fig-backbone");
    const idx = div.data.map((t, j) => t.type === "heatmap" ? j : -1).filter((j) => j >= 0);
    Plotly.restyle(div, {z: z}, idx);
  }

  // The run's video: one video frame per recorded step, so step = floor(time x fps).
  // While it plays, each frame it shows moves the scrubber (and every panel) there.
  if (V) {
    const bin = atob(V.b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    video.src = URL.createObjectURL(new Blob([bytes], {type: "video/webm"}));
    document.getElementById("video-box").hidden = false;
    const stepAt = (time) => Math.min(N - 1, Math.floor(time * V.fps + 1e-6));
    const follow = (now, meta) => {
      if (video.paused) return;
      setFrame(stepAt(meta.mediaTime));
      video.requestVideoFrameCallback(follow);
    };
    video.addEventListener("play", () => { setPlaying(false); video.requestVideoFrameCallback(follow); });
    const settle = () => { if (video.paused) setFrame(stepAt(video.currentTime)); };   // where it stopped
    video.addEventListener("seeked", settle);
    video.addEventListener("pause", settle);
  }

  function stop() { setPlaying(false); if (V) video.pause(); }   // the user picked a frame
  slider.addEventListener("input", () => { stop(); setFrame(Number(slider.value)); });
  playBtn.addEventListener("click", () => setPlaying(!state.playing));
  speed.addEventListener("change", () => { if (state.playing) setPlaying(true); });
  overlayToggle.addEventListener("change", () => setFrame(state.frame));
  document.getElementById("backbone-mode").addEventListener("change", (e) => setBackboneMode(e.target.value));
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "SELECT") return;
    if (e.key === "ArrowRight") { stop(); setFrame(state.frame + 1); }
    else if (e.key === "ArrowLeft") { stop(); setFrame(state.frame - 1); }
    else if (e.key === " " && e.target.tagName !== "BUTTON") { e.preventDefault(); setPlaying(!state.playing); }
  });

  // Draw the panels one at a time, those on the first screen first; the page is
  // interactive once they are drawn, the rest follow without blocking scrubbing.
  const drawn = new Set();
  function draw(name) {
    const fig = DATA.figures[name];
    return Plotly.newPlot("fig-" + name, fig.data, fig.layout, config).then((div) => {
      drawn.add(name);
      if (name === "backbone" && state.backbone !== "mean") setBackboneMode(state.backbone);
      if (DATA.time_figures.includes(name)) {
        div.on("plotly_afterplot", () => placeCursor(name));
        div.on("plotly_click", (ev) => {
          if (ev.points && ev.points.length) { stop(); setFrame(Number(ev.points[0].x)); }
        });
      }
    });
  }
  const names = Object.keys(DATA.figures);
  for (const name of names) {   // reserve each panel's height so the layout does not jump
    document.getElementById("fig-" + name).style.minHeight = (DATA.figures[name].layout.height || 400) + "px";
  }
  const onScreen = (name) => document.getElementById("fig-" + name).getBoundingClientRect().top < window.innerHeight;
  const first = names.filter(onScreen), rest = names.filter((n) => !onScreen(n));
  window.dashboard = {data: DATA, state: state, setFrame: setFrame, setPlaying: setPlaying, drawn: drawn,
                      video: V ? video : null};
  first.reduce((p, name) => p.then(() => draw(name)), Promise.resolve()).then(() => {
    if (N > 0) render();
    window.__dashboardReadyAt = performance.now();
    window.__dashboardReady = true;
    const next = () => {
      const name = rest.shift();
      if (name === undefined) {
        render();
        window.__dashboardAllDrawnAt = performance.now();
        window.__dashboardAllDrawn = true;
        return;
      }
      draw(name).then(() => setTimeout(next, 0));
    };
    setTimeout(next, 0);
  });
})();
"""
