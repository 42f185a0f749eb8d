"""The Fig. 4 claim on scenes read from the road, not from the policy's actions.

:mod:`nac_drive.interpret.fig4` classes steps by what the policy chose to do; here a trace's
scene members (recorded while driving: :mod:`nac_drive.simulators.carracing_scene`,
:mod:`nac_drive.simulators.udacity_scene`) class them by the road: the centre line's mean
curvature over a distance ahead is a left curve at ``+curve`` (1/length unit) or more, a
right curve at ``-curve`` or less, straight within ``+-straight``; the steps in between
(gentle bends) are in no class. Those figures are the task's :class:`RoadScale`
(:data:`ROAD_SCALES`): CarRacing's in track units, the Udacity emulator's in metres.

Two readings, each with its verdict line:

* ``literal``: the paper's thresholds (tau below 1.1 on the left, above 1.3 on the right, ...)
  on the road's classes: :func:`~nac_drive.interpret.fig4.claim_on_scenes` with left curves
  as "left", right curves as "right" and straights as "straight".
* ``qualitative``: whether a head's value tells the road's classes apart at all, whichever its
  direction: per head and quantity the AUROC of right curves against left curves (and of each
  curve against straights), ``effect`` = |AUROC - 0.5| (0 = no separation, 0.5 = perfect),
  each with a 95% interval by a block bootstrap over stretches of the task's ``block_steps``
  steps of an episode (:func:`~nac_drive.simulators.episode_stats.block_bootstrap_interval`): a
  bend lasts many frames, so neighbouring steps are one piece of evidence, not many.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nac_drive.interpret.fig4 import MIN_STEPS, QUANTITIES, SCENES, auroc, claim_on_scenes, head_values, quantiles
from nac_drive.simulators import carracing_scene, udacity_scene

# CarRacing's, in track units (its road is ~13 wide)
CURVE = 0.01         # 1/units: radius <= 100 units (~7.5 road widths) is a curve
STRAIGHT = 0.003     # 1/units: radius >= ~333 units (~25 road widths) is straight
BLOCK_STEPS = 100    # steps of an episode resampled together (~ one bend's length at the policy's speed)
RESAMPLES = 999
# (name, positive class, negative class) of each AUROC; right_vs_left > 0.5 is the paper's direction
COMPARISONS = (("right_vs_left", "right", "left"), ("left_vs_straight", "left", "straight"),
               ("right_vs_straight", "right", "straight"))
VARIABLES = ("curvature", "cross_track_error", "heading_error", "speed")


@dataclass(frozen=True)
class RoadScale:
    """What a curve, a straight and a bend's duration are in one task's units."""

    curvature_ahead: float   # length units ahead over which the recorded curvature is averaged
    length_unit: str
    curve: float             # 1/length unit: |curvature| at or above it is a curve
    straight: float          # 1/length unit: |curvature| at or below it is straight
    block_steps: int         # steps of an episode resampled together (~ one bend's length at the policy's speed)


ROAD_SCALES = {
    "carracing": RoadScale(carracing_scene.CURVE_AHEAD, "track units", CURVE, STRAIGHT, BLOCK_STEPS),
    # The emulator's road is 8 m wide: a curve is radius <= 60 m and straight >= 200 m, as many road widths as
    # CarRacing's. Its turns reach 18 m (TrackSpec.min_turn_radius) and its loops (mean radius 75-110 m) bend
    # by ~1/90 m on average the way they are driven: a counter-clockwise loop has few right curves, so explain
    # drives each loop again clockwise (its -cw twin, its left curves right ones). A curve's stretch is ~40 m
    # (median over random-900000..9): ~150 steps at 9 mph and 15 Hz.
    "udacity": RoadScale(udacity_scene.CURVE_AHEAD, "m", 1 / 60, 1 / 200, 150),
}


def road_scale(task: str) -> RoadScale:
    """The :class:`RoadScale` of ``task`` ("carracing" or "udacity")."""
    if task not in ROAD_SCALES:
        raise ValueError(f"task: the road's scale is known for {sorted(ROAD_SCALES)}, not {task!r}")
    return ROAD_SCALES[task]


def road_sides(curvature: np.ndarray, curve: float = CURVE) -> np.ndarray:
    """``[N]`` int8 of ``curvature`` ``[N]`` (left positive): -1 a left curve (>= ``curve``),
    +1 a right curve (<= -``curve``), 0 otherwise (fig4's sides: -1 left, +1 right)."""
    with np.errstate(invalid="ignore"):
        return (curvature <= -curve).astype(np.int8) - (curvature >= curve).astype(np.int8)


def road_classes(curvature: np.ndarray, curve: float = CURVE, straight: float = STRAIGHT) -> np.ndarray:
    """``[N]`` index into fig4's :data:`SCENES` of each step's road: "left", "right" (curves,
    :func:`road_sides`), "straight" (|curvature| <= ``straight``), -1 otherwise (a gentle bend,
    or no scene recorded)."""
    sides = road_sides(curvature, curve)
    classes = np.full(len(curvature), -1, dtype=np.int8)
    with np.errstate(invalid="ignore"):
        classes[np.abs(curvature) <= straight] = SCENES.index("straight")
    classes[sides < 0], classes[sides > 0] = SCENES.index("left"), SCENES.index("right")
    return classes


def _effect_interval(interval: np.ndarray) -> list[float] | None:
    """The interval of |AUROC - 0.5| implied by the AUROC's ``[lo, hi]`` (None if unknown)."""
    lo, hi = interval
    if not np.isfinite(lo):
        return None
    if lo > 0.5 or hi < 0.5:
        return sorted([abs(lo - 0.5), abs(hi - 0.5)])
    return [0.0, max(hi - 0.5, 0.5 - lo)]


def _heads(label: str, heads: list[int]) -> str:
    return f"{label} {', '.join(map(str, heads))}" if heads else ""


def road_scenes(run, min_steps: int = MIN_STEPS, resamples: int = RESAMPLES, seed: int = 0,
                task: str = "carracing") -> dict:
    """The Fig. 4 claim on the road's scenes of a trace with scene members (module docstring),
    driven on ``task`` (its :class:`RoadScale`). Returns ``task``, ``thresholds``
    (``curvature_ahead``, ``length_unit``, ``curve``, ``straight``), ``block_steps``,
    ``blocks``, ``classes`` (traced steps per class), ``variables`` (the range
    of each scene variable, :func:`~nac_drive.interpret.fig4.quantiles`), ``literal``
    (:func:`~nac_drive.interpret.fig4.claim_on_scenes` and its ``verdict`` line), ``effects``
    (per comparison, quantity and head: ``auroc``, ``auroc_ci95``, ``effect``,
    ``effect_ci95``, the ``steps`` of both classes) and ``qualitative`` (per quantity: the heads
    whose right-vs-left interval excludes 0.5, those of them in the paper's direction, and a
    ``verdict`` line)."""
    from nac_drive.simulators.episode_stats import block_bootstrap_interval, episode_time_blocks

    scale = road_scale(task)
    if not run.has_scene:
        raise ValueError(f"{run.path}: the trace has no scene (a CarRacing drive, or a Udacity emulator drive "
                         "in-process, traced by this version records it)")
    if not run.has_nac.any():
        raise ValueError(f"{run.path}: the run has no NAC trace (drive a NAC policy with --trace)")
    classes = road_classes(run.curvature, scale.curve, scale.straight)
    sides = road_sides(run.curvature, scale.curve)
    traced = run.has_nac
    literal = claim_on_scenes(run, classes, sides, min_steps)
    literal["verdict"] = "literal thresholds on the road's scenes: " + "; ".join(
        f"{name} {c['verdict']}" + (f" (heads {', '.join(map(str, c['heads']))})" if c["heads"] else "")
        for name, c in literal["claims"].items())

    values = np.stack([head_values(run, q) for q in QUANTITIES], axis=1)               # [N, Q, H]
    heads = values.shape[2]
    masks = [(traced & (classes == SCENES.index(pos)), traced & (classes == SCENES.index(neg)))
             for _, pos, neg in COMPARISONS]

    def aurocs(indices: np.ndarray) -> np.ndarray:                                      # [C * Q * H]
        out = []
        for positive, negative in masks:
            pos, neg = indices[positive[indices]], indices[negative[indices]]
            labels = np.r_[np.ones(len(pos), bool), np.zeros(len(neg), bool)]
            for q in range(len(QUANTITIES)):
                for h in range(heads):
                    x = np.r_[values[pos, q, h], values[neg, q, h]]
                    finite = np.isfinite(x)
                    out.append(auroc(x[finite], labels[finite]))
        return np.array(out)

    blocks = episode_time_blocks(run.episode, scale.block_steps)
    point = aurocs(np.arange(run.num_steps)).reshape(len(COMPARISONS), len(QUANTITIES), heads)
    intervals = block_bootstrap_interval(aurocs, blocks, resamples, seed).reshape(len(COMPARISONS), len(QUANTITIES),
                                                                                  heads, 2)
    effects, qualitative = [], {}
    for c, (name, pos, neg) in enumerate(COMPARISONS):
        steps = {pos: int(masks[c][0].sum()), neg: int(masks[c][1].sum())}
        testable = min(steps.values()) >= min_steps
        for q, quantity in enumerate(QUANTITIES):
            for h in range(heads):
                a, ci = point[c, q, h], intervals[c, q, h]
                known = testable and np.isfinite(ci).all()
                effects.append({"comparison": name, "quantity": quantity, "head": h, "steps": steps,
                                "auroc": float(a) if testable else None,
                                "auroc_ci95": [float(ci[0]), float(ci[1])] if known else None,
                                "effect": float(abs(a - 0.5)) if testable else None,
                                "effect_ci95": _effect_interval(ci) if known else None})
    for q, quantity in enumerate(QUANTITIES):
        rows = [e for e in effects if e["comparison"] == "right_vs_left" and e["quantity"] == quantity]
        separating = [e["head"] for e in rows if e["effect_ci95"] is not None and e["effect_ci95"][0] > 0]
        paper_way = [e["head"] for e in rows if e["auroc_ci95"] is not None and e["auroc_ci95"][0] > 0.5]
        if all(e["auroc_ci95"] is None for e in rows):
            verdict = "untestable"
        elif separating:
            other = [h for h in separating if h not in paper_way]
            verdict = "separated (" + "; ".join(filter(None, (_heads("the paper's direction, heads", paper_way),
                                                               _heads("the other way, heads", other)))) + ")"
        else:
            verdict = "not separated"
        qualitative[quantity] = {"verdict": verdict, "heads_separating": separating, "heads_paper_direction": paper_way}
    verdict = ("qualitative, left vs right curves (95% block-bootstrap interval of |AUROC - 0.5| above 0): "
               + "; ".join(f"{q} {v['verdict']}" for q, v in qualitative.items()))
    return {"task": task, "thresholds": {"curvature_ahead": scale.curvature_ahead, "length_unit": scale.length_unit,
                                         "curve": scale.curve, "straight": scale.straight},
            "block_steps": scale.block_steps, "blocks": int(np.unique(blocks[traced]).size) if traced.any() else 0,
            "resamples": resamples,
            "classes": {s: int((traced & (classes == SCENES.index(s))).sum()) for s in ("left", "straight", "right")},
            "variables": {name: quantiles(getattr(run, name)) for name in VARIABLES},
            "literal": literal, "effects": effects, "qualitative": qualitative,
            "verdict": {"literal": literal["verdict"], "qualitative": verdict}}
