"""``RUN_DIR/explain.json`` (written by ``nac-drive explain``) read back and drawn as
dashboard panels: the sections skipped and why, the paper's Fig. 4 claim, the neuron atlas,
saliency faithfulness (each method against the random baselines on the same frames, and its
share on the road ahead), the mirrored frames and which units swap under the mirror, the
linear probes beside their shuffled control and the push along the curvature probe, the sparse
dictionary of the core's output, the window's Integrated Gradients completeness and the
closed-loop silencing check, and the push along the curvature probe while the policy drives
(:data:`EXPLAIN_PANELS`).

:func:`load_explain` refuses (as a note, not an error: the dashboard still builds) a report
that does not parse, is too large, or was computed from another trace (its
``trace_sha256``). Every string taken from the file reaches a figure escaped for plotly's
own tags (the caller's ``escape``), so a crafted report cannot inject markup.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Callable

from nac_drive.interpret.dictionary import SPARSITY
from nac_drive.interpret.mirror import KINDS
from nac_drive.interpret.representations import REPRESENTATIONS
from nac_drive.interpret.road_scenes import VARIABLES
from nac_drive.io import bounded_json
from nac_drive.io.capped_read import read_capped

EXPLAIN_FILE = "explain.json"
MAX_REPORT_BYTES = 20_000_000
PAPER_TAU = (0.8, 1.1, 1.3, 1.6)      # Fig. 4: range, below on left turns, above on right turns
PAPER_LOGITS = (0.6, 0.65)            # Fig. 4: below on left, above on right
SCENE_COLOURS = {"left": "#1f77b4", "left-straight": "#9ecae1", "straight": "#999999",
                 "right-straight": "#fdae6b", "right": "#d62728"}
# the closed-loop section's "metric" (absent: "return") -> (its rows' change key, the intact
# figure's key, the axis title, the format): CarRacing's return, Udacity's mean |cte| in metres
CLOSED_LOOP_METRICS = {"return": ("return_change", "mean_return", "mean return change", ".1f"),
                       "mean_abs_cte": ("cte_change", "mean_abs_cte", "mean |cte| change (m)", ".3f")}
BASELINE_COLOURS = {"random": "#999999", "random_cam_grid": "#4c78a8", "random_patches": "#f58518"}
GROUP_COLOURS = {"q": "#1f77b4", "k": "#17becf", "v": "#9467bd", "inter": "#2ca02c", "command": "#ff7f0e",
                 "motor": "#d62728"}


def load_explain(folder: Path, trace_sha256: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the report, None), (None, why it is not shown), or (None, None) if there is none."""
    path = Path(folder) / EXPLAIN_FILE
    if not path.exists():
        return None, None
    try:
        report = bounded_json.loads(read_capped(path, MAX_REPORT_BYTES))
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
        recorded = report.get("trace_sha256")
        if recorded != trace_sha256:
            raise ValueError("names no trace it was computed from (rerun nac-drive explain)" if recorded is None
                             else "computed from another trace (rerun nac-drive explain)")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return None, f"{EXPLAIN_FILE} is not shown: {e}"
    return report, None


class PastTheTrace(ValueError):
    """A report section claims more than the trace it was computed from holds."""


def explain_figures(report: dict[str, Any], escape: Callable[[Any], str],
                    trace_heads: int) -> tuple[dict[str, Any], list[str]]:
    """Plotly figures of the report's sections (a section missing or malformed is skipped and
    named in the returned notes). ``trace_heads``: the NAC heads the run's trace holds; a
    section drawn per head draws no more (its work grows faster than its heads: 150 took minutes)."""
    figures, notes = {}, []
    for name, section, draw in (("skipped", "skipped", _skipped_figure),
                                ("fig4", "fig4", partial(_fig4_figure, trace_heads=trace_heads)),
                                ("atlas", "atlas", _atlas_figure),
                                ("faithfulness", "saliency", _faithfulness_figure),
                                ("paired", "saliency", _paired_figure),
                                ("road_share", "saliency", _road_share_figure),
                                ("mirror", "mirror", _mirror_figure),
                                ("mirror_units", "mirror", _mirror_units_figure),
                                ("probes", "probes", _probes_figure),
                                ("dictionary", "dictionary", _dictionary_figure),
                                ("completeness", "window", _completeness_figure),
                                ("closed_loop", "closed_loop", _closed_loop_figure),
                                ("push", "push", _push_figure)):
        if not report.get(section):
            continue
        try:
            figure = draw(report[section], escape)
        except PastTheTrace as e:
            notes.append(f"{EXPLAIN_FILE}: its '{section}' section {e}; not shown")
            continue
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            notes.append(f"{EXPLAIN_FILE}: its '{section}' section is malformed ({type(e).__name__}); not shown")
            continue
        if figure is not None:
            figures[f"explain_{name}"] = figure
    return figures, notes


# the dashboard's panels of explain.json, in reading order (figure names of explain_figures)
EXPLAIN_PANELS = ("explain_skipped", "explain_fig4", "explain_atlas", "explain_faithfulness", "explain_paired",
                  "explain_road_share", "explain_mirror", "explain_mirror_units", "explain_probes",
                  "explain_dictionary", "explain_completeness", "explain_closed_loop", "explain_push")
REPRESENTATION_COLOURS = dict(zip(REPRESENTATIONS, ("#1f77b4", "#17becf", "#9467bd", "#ff7f0e", "#d62728")))
KIND_COLOURS = dict(zip(KINDS, ("#54a24b", "#f58518", "#e45756", "#bab0ac", "#eeeeee")))
MAX_ATOM_ROWS = 10


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _interval_bars(means: list, intervals: list) -> dict:
    """Plotly ``error_y`` of bars at ``means`` with 95% ``intervals`` (``[low, high]`` or None each)."""
    lows = [_number((c or [None, None])[0]) for c in intervals]
    highs = [_number((c or [None, None])[1]) for c in intervals]
    return dict(type="data", symmetric=False,
                array=[(hi if hi is not None else y or 0) - (y or 0) for hi, y in zip(highs, means)],
                arrayminus=[(y or 0) - (lo if lo is not None else y or 0) for lo, y in zip(lows, means)])


def _skipped_figure(skipped: dict, escape):
    """The sections explain left out (section -> why), as a table."""
    import plotly.graph_objects as go

    sections = list(skipped)
    fig = go.Figure(go.Table(header=dict(values=["section skipped", "why"], align="left"),
                             cells=dict(values=[[escape(s) for s in sections],
                                                [escape(skipped[s]) for s in sections]], align="left"),
                             columnwidth=[1, 5]))
    fig.update_layout(height=120 + 30 * len(sections), margin=dict(l=20, r=20, t=40, b=10),
                      title=dict(text="Sections of explain.json not computed for this policy", font=dict(size=13)))
    return fig


def _paired_figure(saliency: dict, escape):
    """Each method minus each random baseline on the same frames: the mean per-frame deletion and
    insertion AUC difference, with its block-bootstrap 95% interval."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    paired = saliency["paired"]
    methods = list(paired)
    baselines = list(dict.fromkeys(b for against in paired.values() for b in against))
    if not methods or not baselines:
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=["deletion AUC, method - random (faithful: < 0)",
                                                        "insertion AUC, method - random (faithful: > 0)"])
    for col, key in ((1, "deletion_auc"), (2, "insertion_auc")):
        for baseline in baselines:
            changes = [paired[m].get(baseline, {}).get(key) or {} for m in methods]
            means = [_number(c.get("mean")) for c in changes]
            fig.add_trace(go.Bar(x=[escape(m) for m in methods], y=means, name=escape(baseline),
                                 legendgroup=escape(baseline), showlegend=col == 1,
                                 marker_color=BASELINE_COLOURS.get(baseline, "#54a24b"),
                                 error_y=_interval_bars(means, [c.get("ci95") for c in changes])), row=1, col=col)
        fig.add_hline(y=0, line_color="#555", line_width=1, row=1, col=col)
    blocks = saliency.get("blocks") or {}
    fig.update_layout(height=380, margin=dict(l=60, r=20, t=70, b=60), barmode="group",
                      title=dict(text=f"Paired on the same frames against each random baseline (95% block bootstrap "
                                      f"over {escape(blocks.get('count'))} blocks by {escape(blocks.get('by'))})",
                                 font=dict(size=13)))
    return fig


def _road_share_figure(saliency: dict, escape):
    """Each method's share of saliency on the road ahead (95% intervals) beside the road's
    share of the pixels (a uniform map's)."""
    import plotly.graph_objects as go

    shares = saliency.get("road_share")
    if not shares:
        return None
    methods = list(shares)
    means = [_number(shares[m]["mean"]) for m in methods]
    fig = go.Figure(go.Bar(x=[escape(m) for m in methods], y=means, marker_color="#54a24b", showlegend=False,
                           error_y=_interval_bars(means, [shares[m].get("ci95") for m in methods])))
    chance = _number((saliency.get("road_pixel_share") or {}).get("mean"))
    if chance is not None:
        fig.add_hline(y=chance, line_dash="dash", line_color="#555", line_width=1,
                      annotation_text="road pixels (uniform map)", annotation_position="top right")
    fig.update_layout(height=360, margin=dict(l=60, r=20, t=70, b=60),
                      yaxis=dict(title="share of saliency on the road ahead", range=[0, 1]),
                      title=dict(text="Saliency on the road ahead of the car (the paper's Fig. 6 claim, measured)"
                                      f"<br><sup>{escape(saliency.get('road_mask'))}</sup>", font=dict(size=13)))
    return fig


def _mirror_figure(mirror: dict, escape):
    """The mirrored frames: where the intact policy turned, the share turning the other way and
    the same way; over all frames, the share whose decision is the intact one's mirror."""
    import plotly.graph_objects as go

    labels = {"flips": "turns the other way", "stays": "turns the same way",
              "mirror_agreement": "mirror of the intact decision (all frames)"}
    values = [_number(mirror.get(key)) for key in labels]
    fig = go.Figure(go.Bar(x=list(labels.values()), y=values, marker_color=["#54a24b", "#e45756", "#4c78a8"],
                           showlegend=False, hovertemplate="%{x}: %{y:.1%}<extra></extra>"))
    symmetry = _number(mirror.get("steering_symmetry_error"))
    extra = "" if symmetry is None else f"; mean |mirrored + intact steering| {symmetry:.4f}"
    fig.update_layout(height=360, margin=dict(l=60, r=20, t=70, b=60), yaxis=dict(range=[0, 1], tickformat=".0%"),
                      title=dict(text=f"Mirrored frames: {escape(mirror.get('frames'))} flipped left-right, "
                                      f"{escape(mirror.get('turn_frames'))} where the policy turned{extra}",
                                 font=dict(size=13)))
    return fig


def _mirror_units_figure(mirror: dict, escape):
    """Which units swap under the mirror: per representation (the core's output, the NAC
    heads' outputs), how many units are symmetric, antisymmetric, in a swap pair, neither or
    constant; the swap pairs in the title."""
    import plotly.graph_objects as go

    units = mirror.get("units")
    if not units:
        return None
    names = [name for name in ("core", "heads") if name in units]
    fig = go.Figure([go.Bar(x=names, y=[_number(units[n]["counts"].get(kind)) for n in names], name=kind,
                            marker_color=KIND_COLOURS[kind]) for kind in KINDS])
    pairs = ", ".join(f"{escape(a)}&lt;-&gt;{escape(b)}" for n in names for a, b, *_ in units[n]["pairs"][:6])
    match = _number(units[names[0]].get("match")) if names else None
    fig.update_layout(height=360, margin=dict(l=60, r=20, t=70, b=60), barmode="stack", yaxis=dict(title="units"),
                      title=dict(text=f"Units under the mirror (best partner by |correlation| over the frames, "
                                      f"at least {'-' if match is None else format(match, 'g')})<br><sup>swap pairs: "
                                      f"{pairs or 'none'}</sup>", font=dict(size=13)))
    return fig


def _probes_figure(probes: dict, escape):
    """Held-out R^2 of each probe and of its shuffled control (95% intervals), per scene
    variable and representation; and the steering's change as the core's output is pushed along
    the curvature probe (and along a random direction)."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    rows = [r for r in probes["scores"]   # the known names only: a crafted report cannot ask for many traces
            if r.get("representation") in REPRESENTATIONS and r.get("variable") in VARIABLES]
    if not rows:
        return None
    variables = [v for v in VARIABLES if any(r["variable"] == v for r in rows)]
    push = probes.get("intervention") or {}
    fig = make_subplots(rows=1, cols=3, column_widths=[0.4, 0.4, 0.2],
                        subplot_titles=["R^2 on held-out episodes", "the same probe, targets block-permuted",
                                        f"steering change ({escape(push.get('steering', '-'))})"])
    for rep in REPRESENTATIONS:
        members = {r["variable"]: r for r in rows if r["representation"] == rep}
        if not members:
            continue
        for col, key in ((1, "r2"), (2, "control_r2")):
            ys = [_number(members.get(v, {}).get(key)) for v in variables]
            intervals = [members.get(v, {}).get(f"{key}_ci95") for v in variables]
            fig.add_trace(go.Bar(x=variables, y=ys, name=rep, legendgroup=rep, showlegend=col == 1,
                                 marker_color=REPRESENTATION_COLOURS[rep], error_y=_interval_bars(ys, intervals)),
                          row=1, col=col)
    if push.get("pushes"):
        changes = [row["change"] for row in push["pushes"]]
        ys = [_number(c.get("mean")) for c in changes]
        fig.add_trace(go.Bar(x=[escape(row["push"]) for row in push["pushes"]], y=ys, showlegend=False,
                             marker_color=["#1f77b4", "#d62728", "#999999", "#999999"][:len(ys)],
                             error_y=_interval_bars(ys, [c.get("ci95") for c in changes])), row=1, col=3)
    for col in (1, 2, 3):
        fig.add_hline(y=0, line_color="#555", line_width=1, row=1, col=col)
    random = push.get("random_directions") or {}
    outdone = _number(random.get("outdone"))
    beside = "" if outdone is None else f" (beyond {outdone:.0%} of {escape(random.get('count'))} random directions)"
    verdict = f"<br>push along the curvature probe: {escape(push.get('verdict'))}{beside}" if push else ""
    fig.update_layout(height=420, margin=dict(l=60, r=20, t=110, b=60), barmode="group",
                      title=dict(text=f"Linear probes, held out by {escape(probes.get('held_out'))} (95% block "
                                      f"bootstrap over {escape(probes.get('blocks'))} blocks){verdict}<br><sup>"
                                      f"{escape(probes.get('verdict'))}</sup>", font=dict(size=13)))
    return fig


def _dictionary_figure(dictionary: dict, escape):
    """The sparse dictionary of the core's output: variance explained on held-out steps per
    atoms a step (beside PCA with as many components, and the target), and its most used atoms
    with the scene variable each follows."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    by_k = dictionary["by_sparsity"][:len(SPARSITY)]
    ks = [str(row["k"]) for row in by_k]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], specs=[[{"type": "xy"}, {"type": "table"}]],
                        subplot_titles=["variance explained on held-out steps", "most used atoms"])
    for key, name, colour in (("variance_explained", "dictionary", "#4c78a8"),
                              ("pca_variance_explained", "PCA, as many components", "#bab0ac")):
        fig.add_trace(go.Bar(x=ks, y=[_number(row.get(key)) for row in by_k], name=name, marker_color=colour),
                      row=1, col=1)
    target = _number(dictionary.get("target"))
    if target is not None:
        fig.add_hline(y=target, line_dash="dash", line_color="#555", line_width=1, row=1, col=1)
    atoms = dictionary["features"][:MAX_ATOM_ROWS]
    fig.add_trace(go.Table(header=dict(values=["atom", "used on", "follows", "AUROC", "r"], align="left"),
                           cells=dict(values=[[escape(f.get("atom")) for f in atoms],
                                              [_number(f.get("usage")) for f in atoms],
                                              [escape(f.get("label") or "-") for f in atoms],
                                              [_number(f.get("auroc")) for f in atoms],
                                              [_number(f.get("correlation")) for f in atoms]],
                                      align="left", format=["", ".1%", "", ".2f", "+.2f"])), row=1, col=2)
    reached = "reached" if dictionary.get("reached") else "not reached"
    goal = "-" if target is None else format(target, ".0%")
    fig.update_layout(height=380, margin=dict(l=60, r=20, t=80, b=50), barmode="group",
                      xaxis=dict(title="atoms a step (k)"), yaxis=dict(range=[0, 1], tickformat=".0%"),
                      title=dict(text=f"Sparse dictionary of the core's output: {escape(dictionary.get('atoms'))} "
                                      f"atoms; target {goal} {reached} at k = "
                                      f"{escape(dictionary.get('sparsity'))}<br><sup>held out: "
                                      f"{escape(dictionary.get('held_out'))}</sup>", font=dict(size=13)))
    return fig


def _completeness_figure(window: dict, escape):
    """How complete the window's Integrated Gradients are: steps, error, output change and
    their ratio (median, max) against the tolerance."""
    import plotly.graph_objects as go

    complete = window.get("completeness")
    if not complete:
        return None
    rows = ("steps", "error", "difference", "ratio")
    fig = go.Figure(go.Table(
        header=dict(values=["", "median", "max"], align="left"),
        cells=dict(values=[list(rows), [_number(complete[r]["median"]) for r in rows],
                           [_number(complete[r]["max"]) for r in rows]], align="left", format=["", ".4g", ".4g"])))
    fig.update_layout(height=300, margin=dict(l=20, r=20, t=90, b=10),
                      title=dict(text=f"Integrated Gradients over the window: {escape(complete.get('incomplete'))} of "
                                      f"{escape(complete.get('decisions'))} decisions above the tolerance "
                                      f"{escape(complete.get('tolerance'))} at the cap<br><sup>"
                                      f"{escape(complete.get('rule'))}</sup>", font=dict(size=13)))
    return fig


def _fig4_figure(fig4: dict, escape, trace_heads: int):
    """Per head: tau and the logits by scene (median, p5-p95 bars) beside the paper's thresholds."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    heads = fig4["heads"]
    if len(heads) > trace_heads:
        raise PastTheTrace(f"claims {len(heads)} heads, the trace holds {trace_heads}")
    verdicts = "; ".join(f"{escape(k)}: {escape(v['verdict'])}" for k, v in fig4["claims"].items())
    fig = make_subplots(rows=2, cols=len(heads), shared_yaxes="rows", vertical_spacing=0.22,
                        subplot_titles=[f"head {escape(h['head'])}: tau" for h in heads]
                        + [f"head {escape(h['head'])}: logit" for h in heads])
    for col, head in enumerate(heads, 1):
        for row, quantity in ((1, "tau"), (2, "logits")):
            for scene, colour in SCENE_COLOURS.items():
                stats = head[quantity]["by_scene"].get(scene) or {}
                median = _number(stats.get("median"))
                if median is None:
                    continue
                low, high = _number(stats.get("p5")), _number(stats.get("p95"))
                fig.add_trace(go.Bar(x=[scene], y=[median], marker_color=colour, showlegend=False,
                                     error_y=dict(type="data", symmetric=False,
                                                  array=[(high or median) - median],
                                                  arrayminus=[median - (low or median)]),
                                     hovertemplate=f"{scene}: median %{{y:.3f}} ({escape(stats.get('count'))} steps)"
                                                   "<extra></extra>"), row=row, col=col)
        for y, dash in zip(PAPER_TAU, ("dot", "dash", "dash", "dot")):
            fig.add_hline(y=y, line_dash=dash, line_color="#555", line_width=1, row=1, col=col)
        for y in PAPER_LOGITS:
            fig.add_hline(y=y, line_dash="dash", line_color="#555", line_width=1, row=2, col=col)
    fig.update_layout(height=580, margin=dict(l=50, r=20, t=70, b=40), bargap=0.2,
                      title=dict(text=f"The paper's Fig. 4 claim (this policy's mode: {escape(fig4.get('mode'))}): "
                                      f"{verdicts}<br><sup>median per scene, bars p5-p95; dashed: the paper's "
                                      f"tau 1.1 / 1.3 and logits 0.6 / 0.65, dotted: tau 0.8-1.6</sup>",
                                 font=dict(size=13)))
    return fig


def _atlas_figure(atlas: dict, escape):
    """Every neuron: how well it separates right from left (AUROC) against what silencing it costs."""
    import plotly.graph_objects as go

    fig = go.Figure()
    rows = atlas["neurons"] + [dict(row, group="head") for row in atlas["heads"]]
    for group in [*GROUP_COLOURS, "head"]:
        members = [r for r in rows if r.get("group") == group]
        if not members:
            continue
        fig.add_trace(go.Scatter(
            x=[_number(r.get("auroc")) for r in members], y=[_number(r.get("silencing_cost")) for r in members],
            mode="markers", name=group, text=[escape(r.get("name")) for r in members],
            marker=dict(color=GROUP_COLOURS.get(group, "#000"), size=12 if group == "head" else 7,
                        symbol="diamond" if group == "head" else "circle"),
            hovertemplate="%{text}<br>AUROC right>left %{x:.3f}<br>silencing cost %{y:.3f}<extra></extra>"))
    uniform = _number(atlas.get("uniform_weights", {}).get("agreement"))
    fig.update_layout(height=420, margin=dict(l=60, r=20, t=60, b=50),
                      xaxis=dict(title="AUROC, right vs left steps (0.5: carries no side)", range=[-0.02, 1.02]),
                      yaxis=dict(title="silencing cost (1 - agreement)"),
                      title=dict(text=f"Neuron atlas: {_number(atlas.get('frames')) or 0:.0f} frames replayed; "
                                      f"attention weights made uniform keep "
                                      f"{'-' if uniform is None else f'{100 * uniform:.1f}%'} of the choices",
                                 font=dict(size=13)))
    return fig


def _faithfulness_figure(saliency: dict, escape):
    """Deletion and insertion AUC per method (95% intervals) and the sanity check's correlations."""
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    methods = list(saliency["methods"])
    stages = list(saliency.get("cascade", []))
    fig = make_subplots(rows=1, cols=3, subplot_titles=["deletion AUC (lower: more faithful)",
                                                        "insertion AUC (higher: more faithful)",
                                                        "maps vs randomised policy (Spearman)"])
    for col, key in ((1, "deletion_auc"), (2, "insertion_auc")):
        means = [_number(saliency["methods"][m][key]["mean"]) for m in methods]
        cis = [saliency["methods"][m][key]["ci95"] or [None, None] for m in methods]
        fig.add_trace(go.Bar(x=[escape(m) for m in methods], y=means, showlegend=False, marker_color="#4c78a8",
                             error_y=dict(type="data", symmetric=False,
                                          array=[(_number(c[1]) or y or 0) - (y or 0) for c, y in zip(cis, means)],
                                          arrayminus=[(y or 0) - (_number(c[0]) or y or 0) for c, y in zip(cis, means)])),
                      row=1, col=col)
    for stage, colour in zip(stages, ("#9ecae1", "#4292c6", "#08519c")):
        fig.add_trace(go.Bar(x=[escape(m) for m in methods], name=f"randomised: {escape(stage)}", marker_color=colour,
                             y=[_number(saliency["methods"][m]["sanity_spearman"][stage]["mean"]) for m in methods]),
                      row=1, col=3)
    fig.update_layout(height=380, margin=dict(l=50, r=20, t=70, b=60), barmode="group",
                      title=dict(text=f"Saliency faithfulness on {escape(saliency.get('frames'))} frames "
                                      f"(RISE, {escape(saliency.get('steps'))} steps)", font=dict(size=13)))
    return fig


def _closed_loop_figure(closed: dict, escape):
    """Each chosen neuron clamped, and each part of the attention replaced, while the policy
    drives: the change of the mean return (CarRacing) or of the mean |cross-track error|
    (Udacity), :data:`CLOSED_LOOP_METRICS`, with the paired 95% interval where there is one."""
    import plotly.graph_objects as go

    rows, parts = closed["neurons"], closed.get("attention") or []
    if not rows and not parts:
        return None
    change, figure, title, spec = CLOSED_LOOP_METRICS[closed.get("metric", "return")]
    intact = _number(closed["intact"][figure])
    fig = go.Figure()
    for members, colours, label in ((rows, ["#d62728" if r.get("chosen") == "top" else "#999999" for r in rows],
                                     "neurons"), (parts, "#1f77b4", "attention parts")):
        if not members:
            continue
        ys = [_number(r[change]) for r in members]
        intervals = [(r.get("paired") or {}).get("ci95") or [y, y] for r, y in zip(members, ys)]
        fig.add_trace(go.Bar(x=[escape(r["name"]) for r in members], y=ys, marker_color=colours, name=label,
                             error_y=dict(type="data", symmetric=False,
                                          array=[(_number(hi) or 0) - (y or 0) for (lo, hi), y in zip(intervals, ys)],
                                          arrayminus=[(y or 0) - (_number(lo) or 0) for (lo, hi), y in
                                                      zip(intervals, ys)]),
                             hovertemplate=f"%{{x}}: %{{y:+{spec}}}<extra></extra>"))
    fig.update_layout(height=360, margin=dict(l=60, r=20, t=60, b=110), showlegend=False,
                      yaxis=dict(title=title),
                      title=dict(text=f"Clamped while driving {escape(closed.get('tracks'))} held-out tracks "
                                      f"(intact: {'-' if intact is None else format(intact, spec)}; red: the "
                                      f"costliest neurons in the atlas, grey: random ones, blue: attention parts "
                                      f"replaced; bars: paired 95% intervals)", font=dict(size=13)))
    return fig


def _push_figure(push: dict, escape):
    """The push along the curvature probe while the policy drives, as a table: per push how far
    the probe's reading moves, the change of the tracks' mean steering and of the closed loop's
    metric (:data:`CLOSED_LOOP_METRICS`), each with its paired 95% interval."""
    import plotly.graph_objects as go

    rows = push["pushes"]
    if not rows:
        return None
    change, _, title, spec = CLOSED_LOOP_METRICS[push.get("metric", "return")]

    def interval(ci, fmt: str) -> str:
        low, high = (_number(x) for x in (ci or [None, None]))
        return "-" if low is None or high is None else f"[{low:{fmt}}, {high:{fmt}}]"

    columns = [[escape(r["push"]) for r in rows], [_number(r.get("probe_change")) for r in rows],
               [_number(r["change"].get("mean")) for r in rows],
               [interval(r["change"].get("ci95"), "+.4f") for r in rows], [_number(r.get(change)) for r in rows],
               [interval((r.get("paired") or {}).get("ci95"), f"+{spec}") for r in rows],
               [_number((r.get("offset_change") or {}).get("mean")) for r in rows],
               [interval((r.get("offset_change") or {}).get("ci95"), "+.3f") for r in rows]]
    fig = go.Figure(go.Table(header=dict(values=["push", "probe reads", "steering change", "95% CI", title, "95% CI",
                                                 "offset change (+ right)", "95% CI"], align="left"),
                             cells=dict(values=columns, align="left",
                                        format=["", "+.4f", "+.4f", "", f"+{spec}", "", "+.3f", ""])))
    random = push.get("random_directions") or {}
    outdone = _number(random.get("outdone"))
    beside = "" if outdone is None else f" (both pushes beyond {outdone:.0%} of {escape(random.get('count'))} random)"
    fig.update_layout(height=120 + 30 * len(rows), margin=dict(l=20, r=20, t=60, b=10),
                      title=dict(text=f"Pushed along the curvature probe while driving {escape(push.get('tracks'))} "
                                      f"held-out tracks: {escape(push.get('verdict'))}{beside}; the offset: "
                                      f"{escape((push.get('offset') or {}).get('verdict'))}<br><sup>steering = "
                                      f"{escape(push.get('steering'))}; changes paired per track with the intact "
                                      f"drive</sup>", font=dict(size=13)))
    return fig
