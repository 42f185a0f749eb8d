"""One self-contained HTML dashboard per recorded run (works offline, no server).

:func:`build_dashboard` reads the trace ``RUN_DIR/trace/`` (and, if present,
``RUN_DIR/saliency.npz``, ``RUN_DIR/window_attribution.npz`` and the run's WebM video,
``RUN_DIR/video.webm`` or one named) and writes a single HTML file: plotly.js inline (the
copy bundled with the plotly package), the frames and the saliency overlays as one base64
VP8 WebM each (one video frame per step, which the page seeks to the selected step: a
5-episode CarRacing run's 10,000 pictures take a few MB where one JPEG each took 18), the
run's video as base64 WebM, the figures as plotly JSON (numeric arrays base64-packed by
plotly), and a small script that ties every panel to one episode selector and one frame
scrubber.

Episodes are the stretches of equal ``episode`` values of the trace
(:meth:`RunTrace.episode_spans`). The selector picks one; the scrubber and every time
panel then show that episode alone, on its own step axis from 0 (the video, one video
frame per recorded step of the whole run, moves the selector when it plays into the next
episode).

Panels: the header, a readable summary of the run (env, policy, core and its NAC
settings, episodes, steps, returns, expert agreement; never a raw JSON dump); the frame
(saliency overlay on/off) with the policy's action, the expert's if one labelled the
steps, the reward and the return so far, and the video, which follows the scrubber and,
while it plays, moves it; actions over time, "policy vs expert" where an expert labelled
them, "policy" alone otherwise, with the return so far of the episode (the running sum
of its rewards) and the cross-track error, each shown only when the trace has finite
values of it; the episodes: a table of each one's steps, return, lap (when the ``run``
metadata holds ``laps``, one true/false per episode) and policy/expert agreement (the
share of steps where a discrete action matches, the mean absolute difference per column
of a continuous one), and a bar chart of the returns; the window attribution, when
``window_attribution.npz`` belongs to this trace: the share of each decision owed to each
frame of the policy's window (frames ago x time), and the current frame's shares as bars
(a file of another trace is not shown, a note says why); the attention over past frames
for the current frame, per head (where the window attribution stands when there is none,
further down when there is: the learned attention is nearly uniform); the NCP backbone
wiring coloured by neuron group; heatmaps (neurons x time) of the sensory q/k/v gates and
of the backbone's inter/command/motor layers (mean over the selected pairs, or the
top-weighted pair); phi, tau, logits and t_interp over time per head (attention-weighted
mean over the selected keys); attention weight by key age over time, per head. Every time
panel carries a cursor at the current frame; clicking one moves there.

In Jupyter a :class:`~nac_drive.interpret.trace.RunTrace` shows a short summary, and
:class:`Dashboard` shows a written page inline (an ``iframe`` holding the page)::

    from nac_drive.interpret.dashboard import Dashboard
    Dashboard("runs/run1")      # builds runs/run1/dashboard.html, as the CLI does, and shows it

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

from nac_drive.io import bounded_json
from nac_drive.io.atomic import atomic_write
from nac_drive.interpret.archive import ArchiveError, decode_jpeg
from nac_drive.interpret.explain_report import EXPLAIN_PANELS, explain_figures, load_explain
from nac_drive.interpret.saliency import SALIENCY_FILE, load_saliency
from nac_drive.interpret.temporal_attribution import WINDOW_FILE as WINDOW_ATTRIBUTION_FILE
from nac_drive.interpret.temporal_attribution import load_window_attribution
from nac_drive.interpret.trace import BACKBONE_GROUPS, RunTrace, load_trace
from nac_drive.io.capped_read import read_capped
from nac_drive.io.video import webm_info

DEFAULT_IMAGE_BUDGET = 12_000_000  # bytes of base64 frame + overlay video; the whole page should stay <= 25 MB
HEATMAP_NAN = -32768  # the int16 of a heatmap's NaN (see _fixed_point_heatmaps)
STILL_FPS = 25         # of the frame and overlay videos: 40 ms a step, whole milliseconds (WebM's time unit)
STILL_LADDER = (20, 32, 44)   # libvpx crf of those videos, tried in turn until they fit the budget
VIDEO_FILE = "video.webm"
MAX_VIDEO_BYTES = 50_000_000       # a larger video is refused (it is embedded as it is)
PLAYABLE_CODECS = ("V_VP9", "V_VP8", "V_AV1")   # what browsers play in WebM
GROUP_COLOURS = {"sensory": "#1f77b4", "inter": "#2ca02c", "command": "#ff7f0e", "motor": "#d62728",
                 "readout": "#7f7f7f"}
HEAD_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
MAD_TEXT = "mean |policy - expert|"
TIME_FIGURES = ("actions", "attribution", "sensory", "backbone", "dynamics", "attention_time")


def build_dashboard(run_dir: str | os.PathLike, out_html: str | os.PathLike | None = None,
                    image_budget: int = DEFAULT_IMAGE_BUDGET, title: str | None = None,
                    video: str | os.PathLike | None = None) -> Path:
    """Write the dashboard of the run in ``run_dir`` to ``out_html`` (default
    ``RUN_DIR/dashboard.html``); returns its path.

    Frames and saliency overlays are embedded as one VP8 WebM each (one video frame per
    step); coarser, then smaller, until their base64 fits ``image_budget`` bytes. ``video``: the
    run's WebM, one video frame per recorded step (``drive --video``; default
    ``RUN_DIR/video.webm`` if it exists), embedded as it is.
    """
    from plotly.offline import get_plotlyjs

    run = load_trace(run_dir)
    folder = run.path.parent
    saliency = load_saliency(folder / SALIENCY_FILE, run) if (folder / SALIENCY_FILE).exists() else None
    attribution, attribution_note = None, None
    if (folder / WINDOW_ATTRIBUTION_FILE).exists():
        try:
            attribution = load_window_attribution(folder / WINDOW_ATTRIBUTION_FILE, run)
        except ArchiveError as e:   # e.g. left in the folder by an earlier run: shown as a note
            attribution_note = f"{WINDOW_ATTRIBUTION_FILE} is not shown: {e}"
    out_html = Path(out_html) if out_html is not None else folder / "dashboard.html"
    if video is None and (folder / VIDEO_FILE).is_file():
        video = folder / VIDEO_FILE
    video_data = _video_data(Path(video), run) if video is not None else None

    frames, overlays = _still_streams(run, saliency, image_budget)

    spans = run.episode_spans()
    episodes = _episode_table(run, spans)
    has_nac = run.q.shape[1] > 0 and bool(run.has_nac.any())
    figures = {"actions": _actions_figure(run, spans)}
    if len(spans) > 1 and any(e["return"] is not None for e in episodes):
        figures["returns"] = _returns_figure(episodes)
    if attribution is not None:
        figures.update(attribution=_attribution_figure(attribution, spans),
                       attribution_now=_attribution_now_figure(attribution))
    report, explain_note = load_explain(folder, run.sha256)
    notes = [(key, text) for key, text in (("attribution-note", attribution_note), ("explain-note", explain_note))
             if text]
    if report is not None:
        explained, malformed = explain_figures(report, _plotly_text, trace_heads=run.tau.shape[1])
        figures.update(explained)
        notes += [("explain-note", text) for text in malformed]
    if has_nac:
        figures.update(attention_now=_attention_now_figure(run), wiring=_wiring_figure(run),
                       sensory=_sensory_figure(run, spans), backbone=_backbone_figure(run, spans),
                       dynamics=_dynamics_figure(run, spans), attention_time=_attention_time_figure(run, spans))
    data: dict[str, Any] = {
        "n": run.num_steps,
        "fps": _playback_fps(run.timestamp),
        "timestamp": _packed(run.timestamp.astype(np.float32)),
        "episodes": episodes,
        "frames": frames,
        "overlays": overlays,
        "saliency": saliency.metadata if saliency else None,
        "video": video_data,
        "readout": _readout(run, spans),
        "has_nac": has_nac,
        "figures": {name: _fixed_point_heatmaps(bounded_json.loads(fig.to_json())) for name, fig in figures.items()},
        "time_figures": [n for n in TIME_FIGURES if n in figures],
        "heatmap_nan": HEATMAP_NAN,
        "attribution": None if attribution is None else {
            "shares": _packed(attribution.shares), "window": attribution.shares.shape[1],
            "method": str(attribution.metadata.get("method"))},
    }
    if has_nac:
        H, K = run.weights.shape[1:]
        data["attention"] = {name: _packed(getattr(run, name)) for name in ("weights", "phi", "tau", "logits")}
        data["attention"]["key_age"] = _packed(run.key_age.astype(np.int32))
        data["attention"]["heads"], data["attention"]["k"] = H, K
    page = _PAGE.format(title=html.escape(title or f"nac-drive run: {folder.name}"),
                        summary=_summary_html(run, episodes, saliency, attribution, video_data),
                        panels=_panels_html(figures, _episode_table_html(run, episodes), notes, has_nac),
                        plotly_js=get_plotlyjs(), data=_script_json(data), script=_SCRIPT, style=_STYLE)
    atomic_write(out_html, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    return out_html


class Dashboard:
    """A dashboard page, shown inline by Jupyter (``_repr_html_``: an ``iframe`` whose
    ``srcdoc`` holds the whole page, attribute-escaped, ASCII). ``path``: a written page, or
    a run folder, whose page :func:`build_dashboard` writes first (``RUN_DIR/dashboard.html``,
    as ``nac-drive dashboard RUN_DIR`` does; ``build_options`` go to it). ``height`` in pixels."""

    def __init__(self, path: str | os.PathLike, height: int = 900, **build_options: Any):
        self.path, self.height = Path(path), int(height)
        if self.path.is_dir():
            self.path = build_dashboard(self.path, **build_options)
        elif build_options:
            raise ValueError(f"{self.path}: build options are for a run folder, not a written page")
        if not self.path.is_file():
            raise ValueError(f"{self.path}: no such dashboard page or run folder (write a page with build_dashboard)")

    def __repr__(self) -> str:
        return f"Dashboard({str(self.path)!r})"

    def _repr_html_(self) -> str:
        # ASCII only (character references), so the page reads the same whatever the host page's encoding
        page = html.escape(self.path.read_text(encoding="utf-8"), quote=True).encode("ascii", "xmlcharrefreplace")
        page = page.decode("ascii")
        return (f'<iframe srcdoc="{page}" title="{html.escape(self.path.name, quote=True)}" '
                f'style="width: 100%; height: {self.height}px; border: 1px solid #ddd"></iframe>')


# ------------------------------------------------------------------ the run's files
def _expert_labelled(run: RunTrace) -> bool:
    return run.expert_action.shape[1] > 0 and bool(np.isfinite(run.expert_action).any())


def _episode_table(run: RunTrace, spans: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    """Per episode: id, start, stop, steps, return (None: no reward known), lap (when
    known) and agreement (when an expert labelled): ``{"match": share}`` for one discrete
    action column, ``{"mad": [mean |policy - expert| per column]}`` otherwise."""
    user = run.metadata.get("run")
    laps = user.get("laps") if isinstance(user, dict) else None
    if not (isinstance(laps, list) and len(laps) == len(spans) and all(isinstance(x, bool) for x in laps)):
        laps = None
    _, classes = _columns(run.metadata.get("action_names"), run.policy_action.shape[1], "action")
    discrete = classes is not None and run.policy_action.shape[1] == run.expert_action.shape[1] == 1
    cols = min(run.policy_action.shape[1], run.expert_action.shape[1])
    out = []
    for j, (episode, a, b) in enumerate(spans):
        reward = run.reward[a:b]
        row: dict[str, Any] = {"id": episode, "start": a, "stop": b, "steps": b - a,
                               "return": float(np.nansum(reward)) if np.isfinite(reward).any() else None}
        if laps:
            row["lap"] = laps[j]
        if _expert_labelled(run):
            p, e = run.policy_action[a:b, :cols], run.expert_action[a:b, :cols]
            known = np.isfinite(p) & np.isfinite(e)
            if discrete:
                row["agreement"] = {"match": float(np.mean(p[known] == e[known])) if known.any() else None}
            else:
                mad = [float(np.abs(p[known[:, c], c] - e[known[:, c], c]).mean()) if known[:, c].any() else None
                       for c in range(cols)]
                row["agreement"] = {"mad": mad}
        out.append(row)
    return out


def _running_return(run: RunTrace, spans) -> np.ndarray:
    """``[N]`` the return so far of each step's episode (unknown rewards count 0)."""
    out = np.zeros(run.num_steps, dtype=np.float32)
    for _, a, b in spans:
        out[a:b] = np.cumsum(np.nan_to_num(run.reward[a:b].astype(np.float64)))
    return out


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


def _still_streams(run: RunTrace, saliency, budget: int) -> tuple[dict | None, dict | None]:
    """The frames and the saliency overlays as one VP8 WebM each, one video frame per step
    (the page seeks to a step's frame): a video codes what stays the same from one frame to
    the next once, where a JPEG per frame codes it every time. Encoded at ``STILL_LADDER``'s
    first quality, then coarser and smaller until their base64 fits ``budget``."""
    if run.num_steps == 0:
        return None, None
    sources = [run.frame_jpeg] + ([saliency.overlay_bytes] if saliency else [])
    height, width = decode_jpeg(run.frame_jpeg(0)).shape[:2]
    scale = 1.0
    for step, crf in enumerate(STILL_LADDER + (STILL_LADDER[-1],) * 6):
        streams = [_still_stream(source, run.num_steps, crf, scale, (height, width)) for source in sources]
        total = sum(len(s["b64"]) for s in streams)
        if total <= budget:
            break
        if step >= len(STILL_LADDER) - 1:   # the coarsest quality: smaller pictures
            scale *= min(0.95, 0.95 * float(np.sqrt(budget / total)))
    return streams[0], (streams[1] if saliency else None)


def _still_stream(jpeg_of_step, steps: int, crf: int, scale: float, shape: tuple[int, int]) -> dict[str, Any]:
    """One WebM of the JPEGs ``jpeg_of_step(0..steps-1)`` (resized to ``scale`` of ``shape``, even
    sides, as the encoder's 4:2:0 picture needs) for the page: base64, fps, size."""
    import tempfile

    import cv2

    from nac_drive.io.video import WebmWriter

    height, width = (max(8, 2 * round(side * scale / 2)) for side in shape)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "stills.webm"
        with WebmWriter(path, STILL_FPS, options={"crf": str(crf), "b": "4M"}) as writer:
            for i in range(steps):
                img = decode_jpeg(jpeg_of_step(i))
                if img.shape[:2] != (height, width):
                    img = cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)
                writer.write(img)
        data = path.read_bytes()
    return {"b64": base64.b64encode(data).decode("ascii"), "fps": STILL_FPS, "width": width, "height": height}


def _fixed_point_heatmaps(figure: dict[str, Any]) -> dict[str, Any]:
    """The heatmaps' float32 ``z`` (plotly's ``{dtype, bdata, shape}``) as int16 steps of
    ``meta.z_step`` (NaN: ``HEATMAP_NAN``), which the page turns back into floats before
    drawing: half the bytes of the neuron panels, the largest part of a long run's page, at
    a step no larger than the 3 decimals their hover shows (unless ``|z|`` exceeds 32)."""
    for trace in figure.get("data", []):
        z = trace.get("z")
        if trace.get("type") != "heatmap" or not (isinstance(z, dict) and z.get("dtype") == "f4"):
            continue
        shape = [int(n) for n in str(z.get("shape", "")).split(",") if n]
        values = np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.float32)
        finite = np.isfinite(values)
        top = float(np.abs(values[finite]).max()) if finite.any() else 0.0
        step = max(1e-3, top / (np.iinfo(np.int16).max - 1))
        ints = np.where(finite, np.round(np.nan_to_num(values) / step), HEATMAP_NAN).astype(np.int16)
        trace["z"] = {"dtype": "i2", "bdata": base64.b64encode(ints.tobytes()).decode("ascii"),
                      "shape": ",".join(map(str, shape or [len(values)]))}
        trace["meta"] = {**(trace.get("meta") or {}), "z_step": step}
    return figure


def _video_data(path: Path, run: RunTrace) -> dict[str, Any]:
    """The run's video for the page: base64 WebM, its frame rate and size, after checking
    (from its container, nothing decoded) that it is a WebM browsers play with one frame
    per recorded step."""
    data = read_capped(path, MAX_VIDEO_BYTES)   # once: what is checked is what is embedded
    info = webm_info(data, path)
    if info.codec not in PLAYABLE_CODECS:
        raise ValueError(f"{path}: codec {info.codec!r}, browsers play {', '.join(PLAYABLE_CODECS)} in WebM")
    if info.frames != run.num_steps:
        raise ValueError(f"{path}: {info.frames} video frames but the run's trace has {run.num_steps} steps "
                         f"(not this run's video: drive writes both with --video and --trace)")
    return {"b64": base64.b64encode(data).decode("ascii"), "name": path.name, "codec": info.codec,
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


def _readout(run: RunTrace, spans) -> dict[str, Any]:
    meta = run.metadata
    policy_names, policy_classes = _columns(meta.get("action_names"), run.policy_action.shape[1], "action")
    expert_names, expert_classes = _columns(meta.get("expert_action_names"), run.expert_action.shape[1], "expert")
    has_reward, has_cte = bool(np.isfinite(run.reward).any()), bool(np.isfinite(run.cross_track_error).any())
    return {"policy": _packed(run.policy_action), "policy_names": policy_names, "policy_classes": policy_classes,
            "expert": _packed(run.expert_action) if _expert_labelled(run) else None,
            "expert_names": expert_names, "expert_classes": expert_classes,
            "reward": _packed(run.reward) if has_reward else None,
            "running_return": _packed(_running_return(run, spans)) if has_reward else None,
            "cte": _packed(run.cross_track_error) if has_cte else None}


def _weighted(run: RunTrace, name: str) -> np.ndarray:
    """Attention-weighted mean of a per-key quantity: [N, H, K] -> [N, H] (NaN: no trace)."""
    x, w = getattr(run, name), run.weights
    valid = run.key_age >= 0
    total = np.where(valid, w, 0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(valid, w * np.nan_to_num(x), 0).sum(-1) / total
    return np.where(total > 0, out, np.nan)


# ------------------------------------------------------------------ page text
def _readable(value: Any, limit: int = 160) -> str:
    """A metadata value in words: ``key value, key value`` for a mapping, items joined by
    commas for a list; cut at ``limit`` characters. Never JSON."""
    if isinstance(value, dict):
        text = ", ".join(f"{k} {_readable(v, limit)}" for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        text = ", ".join(_readable(v, limit) for v in value)
    elif value is None:
        text = "none"
    else:
        text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _agreement_text(run: RunTrace, agreement: dict[str, Any] | None, named: bool = True) -> str:
    """``{"match": share}`` -> "same action on 83.1% of steps"; ``{"mad": [...]}`` ->
    "mean |policy - expert|: steer 0.118, gas 0.037" (``named``: with that lead-in)."""
    if not agreement:
        return ""
    if "match" in agreement:
        share = agreement["match"]
        if share is None:
            return "no labelled step"
        return f"same action on {100 * share:.1f}% of steps" if named else f"{100 * share:.1f}% of steps"
    names, _ = _columns(run.metadata.get("action_names"), run.policy_action.shape[1], "action")
    values = ", ".join(f"{names[c]} {'-' if v is None else f'{v:.3f}'}" for c, v in enumerate(agreement["mad"]))
    return f"{MAD_TEXT}: {values}" if named else values


def _overall_agreement(run: RunTrace, episodes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The agreement over all episodes, weighted by their steps."""
    rows = [e for e in episodes if "agreement" in e]
    if not rows:
        return None
    def mean(values, weights):
        pairs = [(v, w) for v, w in zip(values, weights) if v is not None]
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs) if pairs else None
    if "match" in rows[0]["agreement"]:
        return {"match": mean([e["agreement"]["match"] for e in rows], [e["steps"] for e in rows])}
    return {"mad": [mean([e["agreement"]["mad"][c] for e in rows], [e["steps"] for e in rows])
                    for c in range(len(rows[0]["agreement"]["mad"]))]}


def _summary_html(run: RunTrace, episodes, saliency, attribution, video: dict[str, Any] | None) -> str:
    """The header: the run in a few readable lines (every value escaped)."""
    meta = run.metadata
    user = meta.get("run") if isinstance(meta.get("run"), dict) else {}
    config = user.get("policy_config") if isinstance(user.get("policy_config"), dict) else {}
    items = []
    if "env" in user:
        env = user["env"]
        items.append(("env", _readable(env["id"] if isinstance(env, dict) and "id" in env else env)))
    policy = [_readable(user["policy"])] if "policy" in user else []
    if config:
        policy += [_readable(config.get(k)) for k in ("task", "encoder") if k in config]
        if "action" in config:
            policy.append(f"{_readable(config['action'])} actions"
                          + (f" ({_readable(config['num_outputs'])})" if "num_outputs" in config else ""))
    if policy:
        items.append(("policy", ", ".join(policy)))
    nac = meta.get("nac")
    core = config.get("core") if isinstance(config.get("core"), dict) else {}
    if nac:
        g = nac["groups"]
        items.append(("core", f"NAC, mode {nac['mode']}, window {nac['window']}, {nac['num_heads']} heads, "
                              f"top-{nac['topk']} keys, d_model {nac['d_model']}; backbone per head: "
                              f"{g['sensory']} sensory, {g['inter']} inter, {g['command']} command, {g['motor']} motor"))
    elif core:
        window = f", window {_readable(core['window'])}" if "window" in core else ""
        items.append(("core", f"{_readable(core.get('core'))}{window}; no NAC trace in this run"))
    else:
        items.append(("core", "no NAC trace in this run"))
    returns = [e["return"] for e in episodes if e["return"] is not None]
    items.append(("steps", f"{run.num_steps} in {len(episodes)} episode{'s' if len(episodes) != 1 else ''}"))
    if returns:
        items.append(("return", f"{returns[0]:.1f}" if len(returns) == 1 else
                                f"mean {np.mean(returns):.1f} (min {min(returns):.1f}, max {max(returns):.1f})"))
    laps = [e["lap"] for e in episodes if "lap" in e]
    if laps:
        items.append(("laps", f"{sum(laps)} of {len(laps)} finished"))
    agreement = _overall_agreement(run, episodes)
    if agreement:
        items.append(("policy vs expert", _agreement_text(run, agreement)))
    shown = {"env", "policy", "policy_config", "laps"}
    items += [(str(k), _readable(v)) for k, v in user.items() if k not in shown]
    shape = meta.get("frame_shape")
    if isinstance(shape, list):
        items.append(("frame", "x".join(map(str, shape))))
    if nac:
        entropy = run.attention_entropy()
        if np.isfinite(entropy).any():
            low, mid = np.nanpercentile(entropy, [5, 50])
            items.append(("attention entropy", f"{mid:.3f} of its maximum (median; 5th percentile {low:.3f}): "
                                               f"1 = uniform over the selected keys"))
    if attribution is not None:
        items.append(("window attribution", f"{_readable(attribution.metadata.get('method'))} over "
                                            f"{attribution.shares.shape[1]} frames"))
    if saliency:
        items.append(("saliency", f"{saliency.metadata.get('method')} on {saliency.metadata.get('target_layer')}, "
                                  f"target {saliency.metadata.get('target')}"))
    if video:
        items.append(("video", f"{video['name']}: {video['codec']} {video['width']}x{video['height']}, "
                               f"{video['frames']} frames at {video['fps']:g} fps"))
    return "".join(f"<span><b>{html.escape(k)}</b> {html.escape(v)}</span>" for k, v in items)


def _episode_table_html(run: RunTrace, episodes: list[dict[str, Any]]) -> str:
    """Each episode's steps, return, lap and agreement; a row selects its episode."""
    lap = any("lap" in e for e in episodes)
    agreement = any("agreement" in e for e in episodes)
    discrete = any("match" in e.get("agreement", {}) for e in episodes)
    head = ["episode", "steps", "return"] + (["lap"] if lap else []) + (
        [("policy = expert" if discrete else MAD_TEXT)] if agreement else [])
    rows = []
    for j, e in enumerate(episodes):
        cells = [str(e["id"]), str(e["steps"]), "-" if e["return"] is None else f"{e['return']:.1f}"]
        cells += (["finished" if e["lap"] else "not finished"] if lap else [])
        cells += ([_agreement_text(run, e.get("agreement"), named=False)] if agreement else [])
        rows.append(f'<tr data-episode="{j}">' + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return ("<table id=\"episode-table\"><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _panels_html(figures: dict[str, Any], episode_table: str, notes: list[tuple[str, str]], has_nac: bool) -> str:
    """The panels below the frame and actions, in reading order; none for a figure not
    built. The window attribution stands where the attention over past frames stood,
    which then moves down beside the attention over time; the measurements of ``nac-drive
    explain`` (explain.json) follow the episodes. ``notes``: (element id, why a file is not shown)."""
    def fig(name: str) -> str:
        cursor = f'<div class="cursor" id="cursor-{name}"></div>' if name in TIME_FIGURES else ""
        return f'<div class="fig-wrap"><div id="fig-{name}"></div>{cursor}</div>'

    def section(*names: str) -> str:
        names = tuple(n for n in names if n in figures)
        if not names:
            return ""
        inner = fig(names[0]) if len(names) == 1 else f'<div class="row2">{"".join(map(fig, names))}</div>'
        return f'<section class="panel wide">{inner}</section>'

    attribution = "attribution" in figures
    returns = fig("returns") if "returns" in figures else ""
    out = [f'<section class="panel wide" id="episodes"><h2>Episodes</h2><div class="episodes">'
           f'<div class="table-box">{episode_table}</div>{returns}</div></section>']
    out += [section(name) for name in EXPLAIN_PANELS]
    out.append(section("attribution"))
    for key, note in notes:
        out.append(f'<section class="panel wide"><div class="note" id="{key}">{html.escape(note)}</div></section>')
    out.append(section("attribution_now" if attribution else "attention_now", "wiring"))
    out += [section("sensory"), section("backbone"), section("dynamics")]
    if attribution:
        out.append(section("attention_now"))
    out.append(section("attention_time"))
    if not has_nac:
        out.append('<section class="panel wide" id="no-nac"><div class="note">This run has no NAC trace: the neuron '
                   'panels are not shown.</div></section>')
    return "\n".join(s for s in out if s)


# ------------------------------------------------------------------ figures
def _layout(fig, height: int, title: str, **kw) -> None:
    fig.update_layout(template="plotly_white", height=height, title=dict(text=title, x=0.01, font=dict(size=15)),
                      margin=dict(l=70, r=20, t=50, b=45), hovermode="closest", **kw)


def _add(fig, trace, episode: int, row: int, mode: str | None = None) -> None:
    """Add one episode's trace to a time panel (x: its steps from 0). The page shows it
    while that episode (and backbone ``mode``) is selected: its ``meta`` says which."""
    trace.meta = {"episode": episode, **({"mode": mode} if mode else {})}
    trace.visible = episode == 0 and mode in (None, "mean")
    fig.add_trace(trace, row=row, col=1)


def _actions_figure(run: RunTrace, spans):
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    meta = run.metadata
    A, E = run.policy_action.shape[1], run.expert_action.shape[1] if _expert_labelled(run) else 0
    pn, p_classes = _columns(meta.get("action_names"), A, "action")
    en, e_classes = _columns(meta.get("expert_action_names"), E, "expert")
    classes = p_classes or e_classes
    shape = "hv" if classes else "linear"
    rows = max(A, E, 1)   # one (empty) action row for a run of no steps
    extra = [(name, label, colour, values) for name, label, colour, values, known in (
        ("return so far", "return so far (episode)", "#2ca02c", _running_return(run, spans), run.reward),
        ("cross-track error", "cross-track error", "#9467bd", run.cross_track_error, run.cross_track_error))
        if np.isfinite(known).any()]
    titles = [_plotly_text(pn[j] if j < A else en[j] if j < E else "") for j in range(rows)]
    titles += [label for _, label, _, _ in extra]
    fig = make_subplots(rows=rows + len(extra), cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=titles)
    for e, (_, a, b) in enumerate(spans):
        steps = np.arange(b - a)
        for j in range(rows):
            if j < A:
                _add(fig, go.Scatter(x=steps, y=run.policy_action[a:b, j], name="policy", legendgroup="policy",
                                     showlegend=j == 0, line=dict(color="#1f77b4", width=1.5, shape=shape)), e, j + 1)
            if j < E:
                _add(fig, go.Scatter(x=steps, y=run.expert_action[a:b, j], name="expert", legendgroup="expert",
                                     showlegend=j == 0, line=dict(color="#ff7f0e", width=1.5, dash="dot",
                                                                  shape=shape)), e, j + 1)
        for r, (name, _, colour, values) in enumerate(extra, start=rows + 1):
            _add(fig, go.Scatter(x=steps, y=values[a:b], name=name, showlegend=False,
                                 line=dict(color=colour, width=1.2)), e, r)
    if classes:   # discrete actions: name the classes on the y axis
        fig.update_yaxes(tickvals=list(range(len(classes))), ticktext=[_plotly_text(c) for c in classes],
                         range=[-0.5, len(classes) - 0.5], row=1, col=1)
    fig.update_xaxes(title_text="step in the episode", row=rows + len(extra), col=1)
    _layout(fig, 130 + 110 * (rows + len(extra)) + (20 * len(classes) if classes else 0),
            "Actions: policy vs expert" if E else "Actions: policy",
            legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"))
    return fig


def _returns_figure(episodes: list[dict[str, Any]]):
    import plotly.graph_objects as go

    known = [e for e in episodes if e["return"] is not None]
    fig = go.Figure(go.Bar(x=[str(e["id"]) for e in known], y=[e["return"] for e in known],
                           customdata=[[e["steps"], episodes.index(e)] for e in known], marker_color="#2ca02c",
                           hovertemplate="episode %{x}: return %{y:.1f} in %{customdata[0]} steps<extra></extra>"))
    fig.update_xaxes(title_text="episode", type="category")
    fig.update_yaxes(title_text="return")
    _layout(fig, 260, "Return per episode (click a bar to show that episode)")
    return fig


def _heatmap_rows(fig, z_list, labels_list, titles, H: int, zrange, colorbar_title: str, spans,
                  mode: str | None = None):
    """One heatmap per row (z ``[rows, N]``), one trace per episode (its columns)."""
    import plotly.graph_objects as go

    for r, (z, labels) in enumerate(zip(z_list, labels_list), start=1):
        for e, (_, a, b) in enumerate(spans):
            _add(fig, go.Heatmap(z=z[:, a:b].astype(np.float32), x=np.arange(b - a), y=labels, colorscale="RdBu_r",
                                 zmin=zrange[0], zmax=zrange[1], zmid=0 if zrange[0] is None else None,
                                 showscale=r == 1, colorbar=dict(title=colorbar_title, len=0.5, y=1, yanchor="top"),
                                 hovertemplate="step %{x}<br>%{y}<br>%{z:.3f}<extra></extra>"), e, r, mode)
        if mode in (None, "mean"):   # thin separators between heads, once per row
            rows_per_head = z.shape[0] // H
            for h in range(1, H):
                fig.add_shape(type="line", xref=f"x{'' if r == 1 else r} domain", yref=f"y{'' if r == 1 else r}",
                              x0=0, x1=1, y0=h * rows_per_head - 0.5, y1=h * rows_per_head - 0.5,
                              line=dict(color="rgba(0,0,0,0.5)", width=1))
            fig.update_yaxes(title_text=titles[r - 1], autorange="reversed", showticklabels=z.shape[0] <= 48,
                             tickfont=dict(size=8), row=r, col=1)


def _sensory_figure(run: RunTrace, spans):
    from plotly.subplots import make_subplots

    H, D = run.weights.shape[1], run.q.shape[1]
    depth = D // H
    labels = [f"h{j // depth}·{j % depth}" for j in range(D)]
    limit = float(np.nanpercentile(np.abs(np.concatenate([run.q, run.k, run.v], 1)), 99) or 1.0)
    titles = ["q (query gate)", "k (key gate)", "v (value gate)"]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=titles)
    _heatmap_rows(fig, [run.q.T, run.k.T, run.v.T], [labels] * 3, ["q neuron", "k neuron", "v neuron"], H,
                  (-limit, limit), "activation", spans)
    fig.update_xaxes(title_text="step in the episode", row=3, col=1)
    _layout(fig, 120 + 3 * max(140, 4 * D), "Sensory gates q / k / v (neurons x time)")
    return fig


def _backbone_z(run: RunTrace, mode: str) -> list[np.ndarray]:
    """Per group, z ``[H * n, N]``: rows head-major (h0 n0, h0 n1, ..., h1 n0, ...)."""
    out = []
    for g in BACKBONE_GROUPS:
        x = getattr(run, f"{g}_{mode}")                            # [N, H, n]
        out.append(x.reshape(len(x), -1).T)
    return out


def _backbone_figure(run: RunTrace, spans):
    """Both reductions (mean over the selected pairs, top-weighted pair): the page shows
    the one the backbone selector names."""
    from plotly.subplots import make_subplots

    H = run.weights.shape[1]
    zs = _backbone_z(run, "mean")
    labels = [[f"h{r // (len(z) // H)}·{g[0]}{r % (len(z) // H)}" for r in range(len(z))]
              for g, z in zip(BACKBONE_GROUPS, zs)]
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["inter", "command", "motor"], row_heights=[max(1, len(z)) for z in zs])
    for mode in ("mean", "top"):
        _heatmap_rows(fig, _backbone_z(run, mode), labels, ["inter neuron", "command neuron", "motor neuron"], H,
                      (-1.0, 1.0), "tanh", spans, mode)
    fig.update_xaxes(title_text="step in the episode", row=3, col=1)
    total_rows = sum(len(z) for z in zs)
    _layout(fig, 160 + max(360, 7 * total_rows), "Backbone inter / command / motor (neurons x time, per head)")
    return fig


def _dynamics_figure(run: RunTrace, spans):
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    H = run.weights.shape[1]
    names = [("phi", "phi (content target)"), ("tau", "tau (time constant)"), ("logits", "logit"),
             ("t_interp", "t_interp (time vector)")]
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[t for _, t in names])
    for r, (name, label) in enumerate(names, start=1):
        y = _weighted(run, name)
        for e, (_, a, b) in enumerate(spans):
            for h in range(H):
                _add(fig, go.Scatter(x=np.arange(b - a), y=y[a:b, h], name=f"head {h}", legendgroup=f"h{h}",
                                     showlegend=r == 1, line=dict(color=HEAD_COLOURS[h % len(HEAD_COLOURS)],
                                                                  width=1.2)), e, r)
        fig.update_yaxes(title_text=name, row=r, col=1)
    fig.update_xaxes(title_text="step in the episode", row=4, col=1)
    _layout(fig, 620, "phi, tau, logits, t_interp per head (attention-weighted mean over the selected keys)",
            legend=dict(orientation="h", y=1.0, yanchor="bottom", x=1, xanchor="right"))
    return fig


def _attention_time_figure(run: RunTrace, spans):
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
        for e, (_, a, b) in enumerate(spans):
            _add(fig, go.Heatmap(z=z[h][:, a:b], x=np.arange(b - a), y=np.arange(max_age + 1), colorscale="Viridis",
                                 zmin=0, zmax=1, showscale=h == 0, colorbar=dict(title="weight", len=0.5, y=1,
                                                                                 yanchor="top"),
                                 hovertemplate="step %{x}<br>%{y} frames ago<br>weight %{z:.3f}<extra></extra>"),
                 e, h + 1)
        fig.update_yaxes(title_text="frames ago", row=h + 1, col=1)
    fig.update_xaxes(title_text="step in the episode", row=H, col=1)
    _layout(fig, 100 + 160 * H, "Attention weight by key age through the episode")
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


def _share_colours(shares: np.ndarray) -> dict[str, Any]:
    """Viridis from 0 for shares that are all >= 0; a diverging scale around 0 otherwise."""
    known = shares[np.isfinite(shares)]
    top = max(float(np.abs(known).max()) if known.size else 0.0, 1e-6)
    if not known.size or known.min() >= 0:
        return dict(colorscale="Viridis", zmin=0, zmax=top)
    return dict(colorscale="RdBu_r", zmin=-top, zmax=top)


def _attribution_figure(attribution, spans):
    """Frames ago x time: the share of each step's decision owed to each frame of the window."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    shares = attribution.shares
    W = shares.shape[1]
    fig = make_subplots(rows=1, cols=1)
    for e, (_, a, b) in enumerate(spans):
        _add(fig, go.Heatmap(z=shares[a:b].T, x=np.arange(b - a), y=np.arange(W), colorbar=dict(title="share"),
                             hovertemplate="step %{x}<br>%{y} frames ago<br>share %{z:.3f}<extra></extra>",
                             **_share_colours(shares)), e, 1)
    fig.update_xaxes(title_text="step in the episode")
    fig.update_yaxes(title_text="frames ago")
    method = _plotly_text(_readable(attribution.metadata.get("method"), 100))
    _layout(fig, 130 + max(160, 12 * W), f"Which frames of the window each decision owes to ({method})")
    return fig


def _attribution_now_figure(attribution):
    import plotly.graph_objects as go

    W = attribution.shares.shape[1]
    fig = go.Figure(go.Bar(x=[], y=[], name="share", marker_color="#1f77b4",   # filled per frame by the page
                           hovertemplate="%{x} frames ago: share %{y:.3f}<extra></extra>"))
    fig.update_xaxes(title_text="frames ago", range=[W - 0.5, -0.5], dtick=1 if W <= 32 else None)
    fig.update_yaxes(title_text="share of the decision", rangemode="tozero")
    _layout(fig, 360, "Share of the current decision owed to each frame of the window")
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
#episode { font-size: 14px; max-width: 340px; }
#scrubber { flex: 1; min-width: 240px; }
#frame-label { font-variant-numeric: tabular-nums; min-width: 250px; font-size: 14px; }
main { padding: 12px 22px 30px; display: grid; grid-template-columns: minmax(320px, 420px) 1fr; gap: 14px; }
.panel { background: #fff; border: 1px solid #e1e3e6; border-radius: 6px; padding: 8px; min-width: 0; }
.wide { grid-column: 1 / -1; }
.panel h2 { font-size: 15px; margin: 4px 6px 8px; font-weight: 600; }
#frame, #overlay, #video { width: 100%; image-rendering: pixelated; border-radius: 4px; display: block; background: #000; }
#frame[hidden], #overlay[hidden] { display: none; }
#video-box { margin-top: 10px; }
#readout { font-size: 13px; margin: 8px 4px 0; line-height: 1.6; font-variant-numeric: tabular-nums; }
#readout td { padding: 0 10px 0 0; }
.episodes { display: grid; grid-template-columns: minmax(300px, max-content) 1fr; gap: 14px; align-items: start; }
.table-box { max-height: 300px; overflow-y: auto; }
#episode-table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
#episode-table th, #episode-table td { padding: 3px 12px 3px 6px; text-align: right; border-bottom: 1px solid #eee; }
#episode-table th { position: sticky; top: 0; background: #fff; font-weight: 600; }
#episode-table td:last-child, #episode-table th:last-child { text-align: left; }
#episode-table tbody tr { cursor: pointer; }
#episode-table tbody tr:hover { background: #f0f4fa; }
#episode-table tbody tr.selected { background: #dbe7f7; font-weight: 600; }
.note { color: #777; font-size: 13px; padding: 12px; }
.row2 { display: grid; grid-template-columns: 1fr 1fr; gap: 14px; }
.fig-wrap { position: relative; min-width: 0; }
.cursor { position: absolute; top: 0; left: 0; width: 2px; margin-left: -1px; background: rgba(0,0,0,0.7);
          pointer-events: none; display: none; z-index: 5; }
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
  <label>episode <select id="episode" aria-label="episode"></select></label>
  <button id="play" type="button">&#9654; Play</button>
  <input id="scrubber" type="range" min="0" max="0" step="1" value="0" aria-label="step in the episode">
  <span id="frame-label"></span>
  <label>speed <select id="speed"><option value="0.25">0.25x</option><option value="0.5">0.5x</option>
    <option value="1" selected>1x</option><option value="2">2x</option><option value="4">4x</option></select></label>
  <label title="Grad-CAM overlay from saliency.npz"><input id="overlay-toggle" type="checkbox"> saliency overlay</label>
  <label>backbone <select id="backbone-mode"><option value="mean">mean over selected pairs</option>
    <option value="top">top-weighted pair</option></select></label>
</div>
<main>
  <section class="panel"><h2>Frame</h2><video id="frame" title="current frame" muted playsinline preload="auto"></video><video id="overlay" title="saliency overlay" muted playsinline preload="auto" hidden></video><div id="readout"></div>
    <div id="video-box" hidden><h2>Video</h2><video id="video" controls muted playsinline preload="auto"></video></div>
  </section>
  <section class="panel"><div class="fig-wrap"><div id="fig-actions"></div><div class="cursor" id="cursor-actions"></div></div></section>
{panels}
</main>
<script type="application/json" id="run-data">{data}</script>
<script>{script}</script>
</body></html>
"""

_SCRIPT = r"""
(function () {
  "use strict";
  const DATA = JSON.parse(document.getElementById("run-data").textContent);
  const N = DATA.n, EPISODES = DATA.episodes;
  function unpack(p) {
    if (!p) return null;
    const bin = atob(p.b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return p.dtype === "i4" ? new Int32Array(bytes.buffer) : new Float32Array(bytes.buffer);
  }
  const fmt = (x) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : x.toFixed(3);
  const R = DATA.readout;
  const policy = unpack(R.policy), expert = unpack(R.expert), reward = unpack(R.reward);
  const running = unpack(R.running_return), cte = unpack(R.cte);
  const ts = unpack(DATA.timestamp);
  const A = R.policy.shape[1], E = R.expert ? R.expert.shape[1] : 0;
  const att = DATA.has_nac ? Object.fromEntries(["weights", "phi", "tau", "logits", "key_age"].map(
      (k) => [k, unpack(DATA.attention[k])])) : null;
  const shares = DATA.attribution ? unpack(DATA.attribution.shares) : null;

  const slider = document.getElementById("scrubber"), label = document.getElementById("frame-label");
  const stills = {frames: document.getElementById("frame"), overlays: document.getElementById("overlay")};
  const readout = document.getElementById("readout");
  const playBtn = document.getElementById("play"), speed = document.getElementById("speed");
  const overlayToggle = document.getElementById("overlay-toggle"), episodeSelect = document.getElementById("episode");
  const tableRows = Array.from(document.querySelectorAll("#episode-table tbody tr"));
  const video = document.getElementById("video"), V = DATA.video;
  if (!DATA.overlays) { overlayToggle.disabled = true; overlayToggle.parentElement.title = "no saliency.npz in this run"; }
  if (!DATA.has_nac) document.getElementById("backbone-mode").disabled = true;
  const config = {responsive: true, displaylogo: false};
  const state = {frame: 0, episode: 0, playing: false, timer: null, pending: null, backbone: "mean"};
  const drawn = new Set();   // the figures plotly has drawn so far
  const span = () => EPISODES[state.episode] || {start: 0, stop: N, id: 0};

  // The episode selector: one option per episode (numbers only, set as text).
  EPISODES.forEach((e, j) => {
    const option = document.createElement("option");
    option.value = String(j);
    option.textContent = e.id + " · " + e.steps + " steps" + (e.return === null ? "" : " · return " + e.return.toFixed(1));
    episodeSelect.appendChild(option);
  });
  if (EPISODES.length < 2) episodeSelect.disabled = true;
  const episodeOf = (i) => {   // the episode holding step i (episodes are in step order)
    let lo = 0, hi = EPISODES.length - 1;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (EPISODES[mid].stop <= i) lo = mid + 1; else hi = mid; }
    return lo;
  };

  // A time panel holds one trace per episode (and backbone mode); its meta says which.
  const shownNow = (t) => {
    const m = (t.meta && typeof t.meta === "object") ? t.meta : {};
    return (m.episode === undefined || m.episode === state.episode) && (m.mode === undefined || m.mode === state.backbone);
  };
  function showTraces(name) {
    if (!drawn.has(name)) return;   // applied when drawn
    const div = document.getElementById("fig-" + name);
    const visible = div.data.map(shownNow);
    if (visible.some((v, j) => v !== (div.data[j].visible !== false))) Plotly.restyle(div, {visible: visible});
  }

  function showEpisode(j) {
    state.episode = j;
    const s = span();
    slider.max = String(Math.max(0, s.stop - s.start - 1));
    episodeSelect.value = String(j);
    tableRows.forEach((row) => row.classList.toggle("selected", row.dataset.episode === String(j)));
    for (const name of DATA.time_figures) showTraces(name);
  }

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
    const parts = [];
    if (reward) parts.push("reward " + fmt(reward[i]), "return so far " + fmt(running[i]));
    if (cte) parts.push("cross-track error " + fmt(cte[i]));
    readout.replaceChildren(table, ...parts.map((text) => {
      const line = document.createElement("div");
      line.textContent = text;
      return line;
    }));
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

  function renderAttribution(i) {
    const W = DATA.attribution.window, x = [], y = [];
    for (let a = 0; a < W; a++) {
      const v = shares[i * W + a];
      if (!Number.isNaN(v)) { x.push(a); y.push(v); }
    }
    Plotly.restyle("fig-attribution_now", {x: [x], y: [y]});
  }

  // Cursor: a thin absolutely positioned line over each time panel, placed with the
  // panel's x axis at the step in the episode (no plotly redraw while scrubbing or playing).
  function placeCursor(name) {
    const div = document.getElementById("fig-" + name), line = document.getElementById("cursor-" + name);
    const fl = div._fullLayout;
    if (!fl || !fl.xaxis || !line) return;
    const ax = fl.xaxis, x = ax._offset + ax.l2p(state.frame - span().start);
    const visible = x >= ax._offset - 0.5 && x <= ax._offset + ax._length + 0.5;
    line.style.display = visible ? "block" : "none";
    line.style.transform = "translateX(" + x.toFixed(1) + "px)";
    line.style.top = fl._size.t + "px";
    line.style.height = fl._size.h + "px";
    line.dataset.frame = String(state.frame);
  }

  function render() {
    state.pending = null;
    const i = state.frame, s = span();
    slider.value = String(i - s.start);
    label.textContent = "episode " + s.id + " · step " + (i - s.start) + " / " + (s.stop - s.start - 1) +
        " · t = " + (ts[i] - ts[s.start]).toFixed(2) + " s";
    const overlaid = Boolean(overlayToggle.checked && DATA.overlays);
    stills.frames.hidden = overlaid;
    stills.overlays.hidden = !overlaid;
    for (const key of ["frames", "overlays"]) if (DATA[key]) seekToStep(stills[key], DATA[key].fps, i);
    renderReadout(i);
    // the video follows the scrubber (to the middle of frame i) unless it is playing
    if (V && video.paused) seekToStep(video, V.fps, i);
    for (const name of DATA.time_figures) if (drawn.has(name)) placeCursor(name);
    if (DATA.has_nac && drawn.has("attention_now")) renderAttention(i);
    if (shares && drawn.has("attribution_now")) renderAttribution(i);
  }

  // The run's step i (0..N-1); a step of another episode selects that episode.
  function setFrame(i) {
    state.frame = Math.max(0, Math.min(N - 1, Math.round(i)));
    if (N > 0 && episodeOf(state.frame) !== state.episode) showEpisode(episodeOf(state.frame));
    if (state.pending === null) state.pending = requestAnimationFrame(render);
  }
  const setStep = (k) => { const s = span(); setFrame(s.start + Math.max(0, Math.min(s.stop - s.start - 1, k))); };

  function setPlaying(on) {
    if (on && V) video.pause();
    state.playing = on;
    playBtn.innerHTML = on ? "&#10073;&#10073; Pause" : "&#9654; Play";
    clearInterval(state.timer);
    if (on) {
      if (state.frame >= span().stop - 1) setFrame(span().start);
      state.timer = setInterval(() => {   // plays to the end of the episode
        if (state.frame >= span().stop - 1) { setPlaying(false); return; }
        setFrame(state.frame + 1);
      }, 1000 / (DATA.fps * Number(speed.value)));
    }
  }

  function setBackboneMode(mode) {
    state.backbone = mode;
    showTraces("backbone");
  }

  // A WebM of one video frame per step shows step i at [i, i + 1) / fps: seek to the middle
  // of that interval (frame-exact whatever the rounding of the container's timestamps).
  function seekToStep(media, fps, i) {
    if (Math.abs(media.currentTime - (i + 0.5) / fps) >= 0.5 / fps) media.currentTime = (i + 0.5) / fps;
  }
  function webmUrl(b64) {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return URL.createObjectURL(new Blob([bytes], {type: "video/webm"}));
  }
  for (const key of ["frames", "overlays"]) if (DATA[key]) stills[key].src = webmUrl(DATA[key].b64);

  // The run's video: one video frame per recorded step, so step = floor(time x fps).
  // While it plays, each frame it shows moves the scrubber (and every panel) there.
  if (V) {
    video.src = webmUrl(V.b64);
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
  const pickEpisode = (j) => { stop(); setFrame(EPISODES[j].start); };
  slider.addEventListener("input", () => { stop(); setStep(Number(slider.value)); });
  episodeSelect.addEventListener("change", () => pickEpisode(Number(episodeSelect.value)));
  tableRows.forEach((row) => row.addEventListener("click", () => pickEpisode(Number(row.dataset.episode))));
  playBtn.addEventListener("click", () => setPlaying(!state.playing));
  speed.addEventListener("change", () => { if (state.playing) setPlaying(true); });
  overlayToggle.addEventListener("change", () => setFrame(state.frame));
  document.getElementById("backbone-mode").addEventListener("change", (e) => setBackboneMode(e.target.value));
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "SELECT") return;
    if (e.key === "ArrowRight") { stop(); setStep(state.frame - span().start + 1); }
    else if (e.key === "ArrowLeft") { stop(); setStep(state.frame - span().start - 1); }
    else if (e.key === " " && e.target.tagName !== "BUTTON") { e.preventDefault(); setPlaying(!state.playing); }
  });

  // Draw the panels one at a time, those on the first screen first; the page is
  // interactive once they are drawn, the rest follow without blocking scrubbing.
  // A heatmap's z sent as int16 steps of meta.z_step (DATA.heatmap_nan: NaN): floats again, row by row.
  function floatHeatmap(t) {
    if (!t.meta || typeof t.meta.z_step !== "number" || !t.z || t.z.dtype !== "i2") return;
    const bin = atob(t.z.bdata), ints = new Int16Array(bin.length / 2), view = new DataView(new ArrayBuffer(bin.length));
    for (let i = 0; i < bin.length; i++) view.setUint8(i, bin.charCodeAt(i));
    for (let i = 0; i < ints.length; i++) ints[i] = view.getInt16(2 * i, true);
    const [rows, cols] = String(t.z.shape).split(",").map(Number), z = [];
    for (let r = 0; r < rows; r++) {
      const row = new Float32Array(cols || ints.length);
      for (let c = 0; c < row.length; c++) {
        const v = ints[r * row.length + c];
        row[c] = v === DATA.heatmap_nan ? NaN : v * t.meta.z_step;
      }
      z.push(row);
    }
    t.z = cols ? z : z[0];
  }
  function draw(name) {
    const fig = DATA.figures[name];
    fig.data.forEach(floatHeatmap);
    for (const t of fig.data) t.visible = shownNow(t);   // the selected episode (and backbone mode)
    return Plotly.newPlot("fig-" + name, fig.data, fig.layout, config).then((div) => {
      drawn.add(name);
      if (DATA.time_figures.includes(name)) {
        div.on("plotly_afterplot", () => placeCursor(name));
        div.on("plotly_click", (ev) => {
          if (ev.points && ev.points.length) { stop(); setStep(Number(ev.points[0].x)); }
        });
      } else if (name === "returns") {
        div.on("plotly_click", (ev) => {
          if (ev.points && ev.points.length) pickEpisode(Number(ev.points[0].customdata[1]));
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
                      showEpisode: pickEpisode, video: V ? video : null,
                      stills: stills};
  if (EPISODES.length) showEpisode(0);
  first.reduce((p, name) => p.then(() => draw(name)), Promise.resolve()).then(() => {
    if (N > 0) render();
    window.__dashboardReadyAt = performance.now();
    window.__dashboardReady = true;
    const next = () => {
      const name = rest.shift();
      if (name === undefined) {
        if (N > 0) render();
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
