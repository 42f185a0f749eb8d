"""Linear probes: which scene variables a representation holds linearly, scored on episodes
the probe never saw.

For each representation (:mod:`~nac_drive.interpret.representations`: the sensory gates q,
k, v, the NAC heads' outputs, the core's output) and each scene variable recorded per step
(:data:`~nac_drive.interpret.road_scenes.VARIABLES`: curvature ahead, cross-track error,
heading error, speed), a ridge regression (scikit-learn; features standardised, its penalty
chosen among :data:`ALPHAS` by an inner cross-validation over stretches of the training steps)
is cross-fitted over folds of whole episodes: every step is predicted by a probe that never
saw its episode (with one episode only, stretches of ``block_steps`` steps stand for the
episodes), and ``r2`` is the R^2 of those held-out predictions. The variables are fitted together
(one ridge, a penalty each) on the steps where all of them are known.

Control: the same probe on the targets block-permuted (:func:`block_permutation`: stretches of
``block_steps`` steps moved whole to other places of the run, so the targets keep their
autocorrelation but lose their link with the representation); ``control_r2`` is near 0 or
below. Intervals: 95% block bootstrap over those stretches
(:func:`~nac_drive.simulators.episode_stats.block_bootstrap_interval`) of ``r2``,
``control_r2`` and ``above_control`` (their difference), the fitted probes held fixed.
``block_steps``: the task's (:attr:`~nac_drive.interpret.road_scenes.RoadScale.block_steps`;
default CarRacing's :data:`~nac_drive.interpret.road_scenes.BLOCK_STEPS`).
"""

from __future__ import annotations

import numpy as np

from nac_drive.interpret.road_scenes import BLOCK_STEPS

ALPHAS = np.logspace(-2, 5, 15)   # ridge penalties tried, on standardised features
FOLDS = 5                         # at most, of whole episodes (or stretches)
INNER_FOLDS = 4                   # at most, over stretches of the training steps (the penalty)
RESAMPLES = 999
MIN_GROUPS = 2                    # episodes (or stretches) a probe needs: one to train on, one to score


def held_out_groups(episode: np.ndarray, block_steps: int = BLOCK_STEPS) -> tuple[np.ndarray, str]:
    """(``[n]`` the group each step is held out with, what the groups are): its episode, or
    with a single episode its stretch of ``block_steps`` steps (shorter stretches, at least
    :data:`FOLDS` of them, in a short one)."""
    from nac_drive.simulators.episode_stats import episode_time_blocks

    episode = np.asarray(episode)
    if np.unique(episode).size >= 2:
        return episode, "episodes"
    steps = max(1, min(block_steps, -(-len(episode) // FOLDS)))
    return episode_time_blocks(episode, steps), f"stretches of {steps} steps"


def fit_probe(x: np.ndarray, y: np.ndarray, blocks: np.ndarray):
    """A ridge probe of ``y`` ``[n]`` (or of several targets at once, ``[n, targets]``) from
    ``x`` ``[n, units]``: a fitted scikit-learn pipeline (standardise, ridge), each target's
    penalty the one of :data:`ALPHAS` with the least squared error in a cross-validation over
    ``blocks`` ``[n]`` (with fewer than 2 blocks, over the steps' quarters in order)."""
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import GroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len(y) < INNER_FOLDS:
        raise ValueError(f"a probe needs {INNER_FOLDS} training steps or more, got {len(y)}")
    if np.unique(blocks).size < 2:
        blocks = np.arange(len(y)) * INNER_FOLDS // len(y)
    targets = y.reshape(len(y), -1)
    errors = np.zeros((len(ALPHAS), targets.shape[1]))
    for train, test in GroupKFold(min(INNER_FOLDS, np.unique(blocks).size)).split(x, targets, blocks):
        scaler = StandardScaler().fit(x[train])
        seen, unseen = scaler.transform(x[train]), scaler.transform(x[test])
        for a, alpha in enumerate(ALPHAS):
            # svd: units that move together make the ridge system ill-conditioned at small penalties
            predicted = Ridge(alpha=alpha, solver="svd").fit(seen, targets[train]).predict(unseen)
            errors[a] += ((predicted.reshape(len(test), -1) - targets[test]) ** 2).sum(axis=0)
    best = ALPHAS[errors.argmin(axis=0)]
    ridge = Ridge(alpha=best if y.ndim > 1 else float(best[0]), solver="svd")
    return make_pipeline(StandardScaler(), ridge).fit(x, y)


def probe_direction(probe) -> tuple[np.ndarray, float]:
    """(``[units]`` the weight vector of a fitted single-target :func:`fit_probe` on the raw
    features, its intercept): the probe reads ``x @ w + b``."""
    scaler, ridge = probe[0], probe[-1]
    w = ridge.coef_ / scaler.scale_
    return w, float(ridge.intercept_ - scaler.mean_ @ w)


def held_out_predictions(x: np.ndarray, y: np.ndarray, groups: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """Each step's prediction of ``y`` ``[n]`` or ``[n, targets]`` (the same shape) by a probe
    (:func:`fit_probe`) fitted on the other groups' steps (folds of whole groups, at most
    :data:`FOLDS`)."""
    from sklearn.model_selection import GroupKFold

    predictions = np.full(y.shape, np.nan)
    for train, test in GroupKFold(min(FOLDS, np.unique(groups).size)).split(x, y, groups):
        predictions[test] = fit_probe(x[train], y[train], blocks[train]).predict(x[test])
    return predictions


def block_permutation(blocks: np.ndarray, seed: int = 0) -> np.ndarray:
    """``[n]`` indices that move whole blocks (``blocks`` ``[n]``, one label per step) to
    other places: the steps of the blocks taken in a random order (seeded), one after another."""
    _, block_of = np.unique(blocks, return_inverse=True)
    members = [np.flatnonzero(block_of == b) for b in range(block_of.max() + 1)]
    order = np.random.default_rng(seed).permutation(len(members))
    return np.concatenate([members[b] for b in order])


def r2(y: np.ndarray, prediction: np.ndarray) -> float:
    """R^2 of ``prediction`` against ``y``, both ``[n]`` or ``[n, units]``: 1 - SSE / SST, the
    squares summed over every entry, SST around each column's mean (for ``[n, units]``, the share
    of the rows' variance explained); NaN without spread."""
    sst = np.sum((y - y.mean(axis=0)) ** 2)
    return float(1.0 - np.sum((y - prediction) ** 2) / sst) if len(y) and sst > 0 else float("nan")


def linear_probes(representations: dict[str, np.ndarray], variables: dict[str, np.ndarray], episode: np.ndarray,
                  seed: int = 0, resamples: int = RESAMPLES, block_steps: int = BLOCK_STEPS) -> dict:
    """Probes of every variable (name -> ``[n]``, NaN where unknown) from every representation
    (name -> ``[n, units]``) on the same ``n`` steps of episodes ``episode`` ``[n]`` (module
    docstring), on the steps where every variable probed is known.

    Returns ``held_out`` (what a fold holds out: "episodes" or stretches), ``groups``,
    ``block_steps``, ``blocks``, ``resamples``, ``seed``, ``units`` (per representation),
    ``variables`` (per variable probed: its ``steps`` and ``std``), ``variables_skipped``
    (variable -> why), ``scores`` (per representation and variable: ``r2``, ``control_r2``,
    ``above_control``, each with its ``*_ci95``, and the ``steps``) and a ``verdict`` line."""
    from nac_drive.simulators.episode_stats import block_bootstrap_interval, episode_time_blocks

    episode = np.asarray(episode)
    n = len(episode)
    for name, x in representations.items():
        if x.ndim != 2 or len(x) != n:
            raise ValueError(f"representations[{name!r}]: expected [{n}, units], got {list(x.shape)}")
    groups, held_out = held_out_groups(episode, block_steps)
    blocks = episode_time_blocks(episode, block_steps)
    probed, skipped = {}, {}
    for name, values in variables.items():
        y = np.asarray(values, dtype=np.float64)
        if len(y) != n:
            raise ValueError(f"variables[{name!r}]: expected {n} steps, got {len(y)}")
        known = np.isfinite(y)
        if not known.any():
            skipped[name] = "not recorded in this trace"
        elif np.unique(groups[known]).size < MIN_GROUPS:
            skipped[name] = f"known on fewer than {MIN_GROUPS} {held_out}"
        elif np.ptp(y[known]) == 0:
            skipped[name] = "constant on these steps"
        else:
            probed[name] = y
    rows, fits = [], []   # fits: per representation, (targets, control targets, their predictions) [n, 2V], NaN unknown
    if probed:
        y = np.stack(list(probed.values()), axis=1)                                      # [n, V]
        for rep, x in representations.items():
            keep = np.isfinite(y).all(axis=1) & np.isfinite(x).all(axis=1)
            both = np.full((n, 2 * y.shape[1]), np.nan)
            both[keep] = np.concatenate([y[keep], y[keep][block_permutation(blocks[keep], seed)]], axis=1)
            predicted = np.full_like(both, np.nan)
            predicted[keep] = held_out_predictions(x[keep], both[keep], groups[keep], blocks[keep])
            fits.append((both, predicted))
            rows += [{"representation": rep, "variable": name, "steps": int(keep.sum())} for name in probed]
    count = len(probed)

    def statistic(indices: np.ndarray) -> np.ndarray:   # [rows * 3]: r2, control_r2, above_control per row
        out = []
        for both, predicted in fits:
            both, predicted = both[indices], predicted[indices]
            keep = np.isfinite(both[:, 0])
            for v in range(count):
                real = r2(both[keep, v], predicted[keep, v])
                control = r2(both[keep, count + v], predicted[keep, count + v])
                out += [real, control, real - control]
        return np.array(out)

    if rows:
        point = statistic(np.arange(n)).reshape(-1, 3)
        intervals = block_bootstrap_interval(statistic, blocks, resamples, seed).reshape(-1, 3, 2)
        for row, figures, cis in zip(rows, point, intervals):
            for key, value, ci in zip(("r2", "control_r2", "above_control"), figures, cis):
                row[key] = float(value)
                row[f"{key}_ci95"] = [float(ci[0]), float(ci[1])] if np.isfinite(ci).all() else None
    return {"held_out": held_out, "groups": int(np.unique(groups).size), "block_steps": block_steps,
            "blocks": int(np.unique(blocks).size), "resamples": resamples, "seed": seed,
            "units": {rep: int(x.shape[1]) for rep, x in representations.items()},
            "variables": {name: {"steps": int(np.isfinite(y).sum()), "std": float(np.nanstd(y))}
                          for name, y in probed.items()},
            "variables_skipped": skipped, "scores": rows, "verdict": verdict(rows, list(probed))}


def verdict(rows: list[dict], variables: list[str]) -> str:
    """One line: per variable, the representations that hold it on held-out episodes (the 95%
    intervals of ``r2`` and of ``above_control`` both above 0), best first."""
    parts = []
    for name in variables:
        held = sorted((r for r in rows if r["variable"] == name and r["r2_ci95"] and r["r2_ci95"][0] > 0
                       and r["above_control_ci95"] and r["above_control_ci95"][0] > 0), key=lambda r: -r["r2"])
        parts.append(f"{name} by " + (", ".join(f"{r['representation']} (R^2 {r['r2']:.2f})" for r in held)
                                      if held else "none"))
    return ("held on held-out episodes (95% intervals of R^2 and of R^2 - shuffled control above 0): "
            + "; ".join(parts))
