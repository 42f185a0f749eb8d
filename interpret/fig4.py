"""The paper's Fig. 4 claim (§3.4, NAC-Steady on CarRacing), tested on a recorded run.

The claim: tau "couples its values between 0.8 and 1.6, depending on the input scene":
below 1.1 when the car turns left or left-straight, above 1.3 for right or right-straight,
intermediate when it drives straight; the attention logits below 0.6 for left and
left-straight, above 0.65 for right and right-straight.

Scenes come from the actions the policy chose (:func:`scene_classes`: a discrete
policy's LEFT and RIGHT actions, or the sign of a continuous or regression policy's
steering outside a deadband, :data:`STEER_DEADBANDS`), per-step values
from the trace (:func:`head_values`: the attention-weighted mean over the step's selected
keys, per head), and :func:`fig4_claim` states each part of the claim as reproduced or not,
with the measured figure. Everything here reads a loaded
:class:`~nac_drive.interpret.trace.RunTrace`; no policy is needed.
"""

from __future__ import annotations

import numpy as np

# The paper's five scenes, in the order of its figure's legend (left to right).
SCENES = ("left", "left-straight", "straight", "right-straight", "right")
LEFT_SIDE, RIGHT_SIDE = ("left", "left-straight"), ("right", "right-straight")
# Per-key quantities of the trace the claim is about: tau, the logits the layer used, and
# phi / tau, the steady-state logit (eq. 18: NAC-Steady's logit, which the paper's model used).
QUANTITIES = ("tau", "logits", "steady_logits")
# Continuous steering: |steering| below the deadband of its column is straight. In the units
# of each task's steering: CarRacing's "steer" (+-1 = full lock) and Udacity's "steering"
# (+-1 = +-25 degrees; 0.05 = 1.25 degrees, with the emulator's 2.7 m wheelbase a bend of
# radius ~124 m: the held-out tracks' loops of radius 75-110 m count as turns, long bends
# and straights as straight).
STEER_DEADBANDS = {"steer": 0.1, "steering": 0.05}
DEFAULT_RECENT = 16    # frames a straight step looks back for the last turn (the shipped policy's window)
MIN_STEPS = 5          # fewer steps than this in a scene group: the statement is untestable

# (id, quantity, scenes, test, threshold, text): each part of the claim, per head.
STATEMENTS = (
    ("tau_range", "tau", None, "within", (0.8, 1.6), "tau stays within [0.8, 1.6] (p5 and p95 of all steps)"),
    ("tau_left", "tau", LEFT_SIDE, "below", 1.1, "tau < 1.1 for left and left-straight (median)"),
    ("tau_right", "tau", RIGHT_SIDE, "above", 1.3, "tau > 1.3 for right and right-straight (median)"),
    ("logits_left", "logits", LEFT_SIDE, "below", 0.6, "logits < 0.6 for left and left-straight (median)"),
    ("logits_right", "logits", RIGHT_SIDE, "above", 0.65, "logits > 0.65 for right and right-straight (median)"),
    ("steady_logits_left", "steady_logits", LEFT_SIDE, "below", 0.6,
     "phi/tau < 0.6 for left and left-straight (median; the steady-state logit)"),
    ("steady_logits_right", "steady_logits", RIGHT_SIDE, "above", 0.65,
     "phi/tau > 0.65 for right and right-straight (median; the steady-state logit)"),
)
# A claim holds when all its statements hold in one and the same head.
CLAIMS = {"tau": ("tau_range", "tau_left", "tau_right"), "logits": ("logits_left", "logits_right"),
          "steady_logits": ("steady_logits_left", "steady_logits_right")}


def sides_of(steering: np.ndarray, deadband: float) -> np.ndarray:
    """``[N]`` int8 of continuous ``steering`` ``[N]`` (negative left, positive right): -1
    below ``-deadband``, +1 above ``deadband``, 0 (straight) within it."""
    if not deadband >= 0:
        raise ValueError(f"deadband: must be a number >= 0, got {deadband!r}")
    steering = np.asarray(steering)
    return (steering > deadband).astype(np.int8) - (steering < -deadband).astype(np.int8)


def steer_deadband(run, deadband: float | None = None) -> float | None:
    """The deadband :func:`steering_sides` uses on ``run``: ``deadband`` if given, else the
    default of its steering column (:data:`STEER_DEADBANDS`); None for discrete actions."""
    names = list(run.metadata.get("action_names") or [])
    if names[:1] and names[0] in STEER_DEADBANDS:
        return STEER_DEADBANDS[names[0]] if deadband is None else deadband
    return None


def steering_sides(run, deadband: float | None = None) -> np.ndarray:
    """``[N]`` int8: -1 where the policy chose to steer left, +1 right, 0 anything else.

    Discrete policies (``action_names`` with "left" and "right", one column holding the
    action's index: CarRacing's noop, right, left, gas, brake): the LEFT and RIGHT actions;
    noop, gas and brake are straight. Continuous policies, whose first column is the
    steering (negative left): CarRacing's "steer" or Udacity's "steering" (the regression
    policy's one output): the steering beyond ``deadband`` (default: its column's, from
    :data:`STEER_DEADBANDS`), :func:`sides_of`.
    """
    names = list(run.metadata.get("action_names") or [])
    action = run.policy_action
    if "left" in names and "right" in names and action.shape[1] == 1:
        left, right = action[:, 0] == names.index("left"), action[:, 0] == names.index("right")
        return right.astype(np.int8) - left.astype(np.int8)
    band = steer_deadband(run, deadband)
    if band is None:
        raise ValueError(f"run: expected discrete actions named 'left' and 'right' or a continuous "
                         f"{' or '.join(repr(n) for n in STEER_DEADBANDS)} column first, got action names "
                         f"{names or None}")
    return sides_of(action[:, 0], band)


def scene_classes(run, recent: int | None = None, deadband: float | None = None) -> np.ndarray:
    """``[N]`` index into :data:`SCENES` of each step's scene, read from the chosen actions.

    The actions say left, right or straight (:func:`steering_sides`: CarRacing's discrete
    actions, or continuous steering beyond ``deadband``), so the paper's in-between scenes
    are taken from what came just before: a straight step whose
    last turn within the ``recent`` steps before it (same episode) went left is
    "left-straight" (leaving or easing a left bend), right likewise, none "straight".
    ``recent`` defaults to the layer's window (what the policy itself sees), else 16.
    """
    if recent is None:
        recent = ((run.metadata.get("nac") or {}).get("window")) or DEFAULT_RECENT
    sides = steering_sides(run, deadband)
    scenes = np.full(len(sides), SCENES.index("straight"), dtype=np.int8)
    scenes[sides < 0], scenes[sides > 0] = SCENES.index("left"), SCENES.index("right")
    last_turn, last_step, episode = 0, -recent - 1, None
    for i, side in enumerate(sides):
        if run.episode[i] != episode:
            last_turn, last_step, episode = 0, -recent - 1, run.episode[i]
        if side:
            last_turn, last_step = side, i
        elif last_turn and i - last_step <= recent:
            scenes[i] = SCENES.index("left-straight" if last_turn < 0 else "right-straight")
    return scenes


def head_values(run, quantity: str) -> np.ndarray:
    """``[N, H]``: a per-key quantity of the trace (:data:`QUANTITIES`; ``steady_logits`` is
    phi / tau) as the attention-weighted mean over each step's selected keys (the weights of
    a step's valid keys sum to 1); NaN where a step has no trace or a head no key."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity: must be one of {QUANTITIES}, got {quantity!r}")
    with np.errstate(invalid="ignore", divide="ignore"):
        x = run.phi / run.tau if quantity == "steady_logits" else getattr(run, quantity)    # [N, H, K]
        valid = (run.key_step >= 0) & np.isfinite(x)
        w = np.where(valid, run.weights, 0.0).astype(np.float64)
        return np.sum(w * np.where(valid, x, 0.0), axis=-1) / np.sum(w, axis=-1)


def quantiles(x: np.ndarray) -> dict[str, float]:
    """The range of the finite values of ``x``: count, min, p5, median, p95, max (NaN if none)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if not x.size:
        return {"count": 0, **dict.fromkeys(("min", "p5", "median", "p95", "max"), float("nan"))}
    p = np.percentile(x, [0, 5, 50, 95, 100])
    return {"count": int(x.size), **{k: float(v) for k, v in zip(("min", "p5", "median", "p95", "max"), p)}}


def auroc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` ``[n]`` for the bool labels ``positive`` ``[n]``:
    the probability that a positive scores above a negative, ties counting one half
    (Mann-Whitney U over average ranks). NaN if either class is empty; 0.5 = no separation.
    scikit-learn's ``roc_auc_score`` gives the same figure (the tests compare them) at about
    8x the cost of a road-scenes bootstrap, which takes tens of thousands (docs/ARCHITECTURE.md)."""
    scores, positive = np.asarray(scores, dtype=np.float64), np.asarray(positive, dtype=bool)
    if scores.shape != positive.shape or scores.ndim != 1:
        raise ValueError(f"auroc: expected scores and labels of one shape [n], got {scores.shape} and "
                         f"{positive.shape}")
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0       # 1-based ranks, ties averaged
    rank_sum = average_rank[inverse][positive].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def left_right_auroc(values: np.ndarray, sides: np.ndarray) -> float:
    """AUROC of ``values`` ``[N]`` separating the right steps (positive) from the left steps of
    ``sides`` ``[N]`` (:func:`steering_sides`); steps with a non-finite value are left out."""
    keep = (sides != 0) & np.isfinite(values)
    return auroc(values[keep], sides[keep] > 0)


def _fmt(x: float) -> str:
    return f"{x:.3f}" if np.isfinite(x) else "-"


def fig4_claim(run, recent: int | None = None, min_steps: int = MIN_STEPS, deadband: float | None = None) -> dict:
    """Test the Fig. 4 claim on a recorded run (``deadband``: of continuous steering,
    :func:`steering_sides`).

    Returns ``deadband`` (the one used; None for discrete actions), ``scenes`` (steps per scene of :func:`scene_classes`), ``heads`` (per head and
    :data:`QUANTITIES`: the range of its values per scene and over all steps
    (:func:`quantiles`), and the AUROC with which it separates the right actions from the
    left ones, 1 meaning right always higher, as claimed), ``statements`` (each part of the
    claim, :data:`STATEMENTS`: its verdict, the heads where it holds and the measured figure)
    and ``claims`` (tau, logits, steady_logits: reproduced when all their statements hold in
    one and the same head).

    A statement is "reproduced" if it holds in at least one head (the paper's figure shows
    one curve; ``heads_holding`` says how many of the heads), "not reproduced" if in none,
    and "untestable" where a scene group it needs has fewer than ``min_steps`` traced steps.
    """
    if not run.has_nac.any():
        raise ValueError(f"{run.path}: the run has no NAC trace (drive a NAC policy with --trace)")
    tested = claim_on_scenes(run, scene_classes(run, recent, deadband), steering_sides(run, deadband), min_steps)
    return {"mode": (run.metadata.get("nac") or {}).get("mode"), "deadband": steer_deadband(run, deadband),
            **tested}


def claim_on_scenes(run, scenes: np.ndarray, sides: np.ndarray, min_steps: int = MIN_STEPS) -> dict:
    """The Fig. 4 statements tested with given classes: ``scenes`` ``[N]`` index into
    :data:`SCENES` (-1: a step in none), ``sides`` ``[N]`` -1 left, +1 right, 0 neither (the
    AUROC's classes). Returns ``scenes``, ``heads``, ``statements`` and ``claims`` as
    :func:`fig4_claim` describes them; the action classes of :func:`fig4_claim` and the
    road's of :mod:`nac_drive.interpret.road_scenes` both go through here."""
    traced = run.has_nac
    values = {q: head_values(run, q) for q in QUANTITIES}                                 # each [N, H]
    heads = []
    for h in range(values["tau"].shape[1]):
        row = {"head": h}
        for q in QUANTITIES:
            x = values[q][:, h]
            row[q] = {"all": quantiles(x[traced]),
                      "by_scene": {s: quantiles(x[traced & (scenes == i)]) for i, s in enumerate(SCENES)},
                      "auroc_right_vs_left": left_right_auroc(np.where(traced, x, np.nan), sides)}
        heads.append(row)

    statements = []
    for sid, quantity, group, test, threshold, text in STATEMENTS:
        if group is None:
            in_group = traced
        else:
            in_group = traced & np.isin(scenes, [SCENES.index(s) for s in group])
        holding, figures = [], []
        testable = int(in_group.sum()) >= min_steps
        for h in range(len(heads)):
            stats = quantiles(values[quantity][in_group, h])
            if test == "within":
                holds = threshold[0] <= stats["p5"] and stats["p95"] <= threshold[1]
                figures.append(f"head {h}: p5 {_fmt(stats['p5'])}, p95 {_fmt(stats['p95'])}")
            else:
                holds = stats["median"] < threshold if test == "below" else stats["median"] > threshold
                figures.append(f"head {h}: median {_fmt(stats['median'])}")
            if testable and holds:
                holding.append(h)
        verdict = "untestable" if not testable else "reproduced" if holding else "not reproduced"
        statements.append({"id": sid, "statement": text, "verdict": verdict, "heads_holding": holding,
                           "steps": int(in_group.sum()), "figure": "; ".join(figures)})

    by_id = {s["id"]: s for s in statements}
    claims = {}
    for name, parts in CLAIMS.items():
        if any(by_id[p]["verdict"] == "untestable" for p in parts):
            claims[name] = {"verdict": "untestable", "heads": []}
            continue
        both = sorted(set.intersection(*(set(by_id[p]["heads_holding"]) for p in parts)))
        claims[name] = {"verdict": "reproduced" if both else "not reproduced", "heads": both}
    return {"scenes": {s: int((traced & (scenes == i)).sum()) for i, s in enumerate(SCENES)},
            "heads": heads, "statements": statements, "claims": claims}
