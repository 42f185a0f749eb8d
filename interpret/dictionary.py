"""A sparse dictionary of the core's output: each step's output written as a sum of a few
learnt directions (atoms), each atom named by the scene variable it follows best.

scikit-learn's ``MiniBatchDictionaryLearning`` (:data:`ATOMS_PER_UNIT` atoms per unit of the
output, an L1 penalty :data:`ALPHA` on the codes, seeded) learns the atoms from the training
steps' outputs, centred by their mean and scaled to a mean squared norm of 1. The held-out
steps (the last third of the episodes, at least one; from a single episode, of its stretches of
the task's ``block_steps`` steps, :attr:`~nac_drive.interpret.road_scenes.RoadScale.block_steps`)
are then coded by orthogonal matching pursuit with at most ``k`` atoms each, for ``k`` in
:data:`SPARSITY`, and ``variance_explained`` = 1 - sum |x - reconstruction|^2 / sum |x - their
mean|^2 over them (:func:`~nac_drive.interpret.probes.r2`).
The sparsest ``k`` reaching :data:`TARGET` is the one reported (if none does, the largest
tried, and ``reached`` is false); beside each ``k``, PCA with ``k`` components fitted on the
same training steps: what ``k`` directions shared by every step explain.

Each atom used at that ``k``, as two features that are never negative, the atom and its
negative (a coefficient's two signs stand for opposite directions of the output): each one's
``usage`` (the share of all steps whose code uses it) and the scene variable that tells the
steps using it from the others best (``label``): the largest |AUROC - 0.5| of the variable's
values on those steps against the rest (``auroc``: above 0.5, the variable is higher where the
feature is used), over all steps, for a feature used on at least
:data:`~nac_drive.interpret.fig4.MIN_STEPS` steps and not on at least as many. A feature used
one at a time acts as a prototype that the step is near: its coefficient (its Pearson
``correlation`` with each variable, also reported) is 0 on most steps, and whether it is used
says what it stands for.
"""

from __future__ import annotations

import warnings

import numpy as np

from nac_drive.interpret.fig4 import MIN_STEPS, auroc
from nac_drive.interpret.probes import held_out_groups, r2
from nac_drive.interpret.road_scenes import BLOCK_STEPS

ATOMS_PER_UNIT = 2
ALPHA = 0.1               # L1 penalty on the codes while learning the atoms (outputs scaled to norm ~1)
SPARSITY = (1, 2, 4, 8, 16)
TARGET = 0.9
EPOCHS = 30               # passes over the training steps at most (it stops earlier once settled)
BATCH = 256


def held_out_steps(episode: np.ndarray, block_steps: int = BLOCK_STEPS) -> tuple[np.ndarray, str]:
    """(``[n]`` bool: the steps held out, what they are): the last third of the episodes (at
    least one), or from a single episode the last third of its stretches
    (:func:`~nac_drive.interpret.probes.held_out_groups`)."""
    groups, kind = held_out_groups(episode, block_steps)
    order = list(dict.fromkeys(groups.tolist()))   # in the run's order
    if len(order) < 2:
        raise ValueError(f"episode: the dictionary needs 2 {kind} or more (one to learn from, one to score), "
                         f"got {len(order)}")
    held = order[-max(1, len(order) // 3):]
    return np.isin(groups, held), f"the last {len(held)} of {len(order)} {kind}"


def correlations(codes: np.ndarray, variables: dict[str, np.ndarray]) -> np.ndarray:
    """``[atoms, variables]`` Pearson correlation of each code column ``[n]`` with each variable
    ``[n]`` over the steps where that variable is known (NaN for a constant one)."""
    out = np.full((codes.shape[1], len(variables)), np.nan)
    for j, values in enumerate(variables.values()):
        y = np.asarray(values, dtype=np.float64)
        known = np.isfinite(y)
        c, y = codes[known] - codes[known].mean(axis=0), y[known] - y[known].mean()
        scale = np.sqrt((c ** 2).sum(axis=0) * (y ** 2).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, j] = np.where(scale > 0, (c.T @ y) / scale, np.nan)
    return out


def used_aurocs(codes: np.ndarray, variables: dict[str, np.ndarray]) -> np.ndarray:
    """``[atoms, variables]`` AUROC of each variable ``[n]`` (over the steps where it is known)
    separating the steps whose code ``codes`` ``[n, atoms]`` uses the atom (is not 0) from the
    other steps;
    NaN where either group has fewer than :data:`~nac_drive.interpret.fig4.MIN_STEPS` steps."""
    out = np.full((codes.shape[1], len(variables)), np.nan)
    for j, values in enumerate(variables.values()):
        y = np.asarray(values, dtype=np.float64)
        known = np.isfinite(y)
        used = codes[known] != 0
        for a in np.flatnonzero(np.minimum(used.sum(axis=0), (~used).sum(axis=0)) >= MIN_STEPS):
            out[a, j] = auroc(y[known], used[:, a])
    return out


def sparse_dictionary(x: np.ndarray, episode: np.ndarray, variables: dict[str, np.ndarray], seed: int = 0,
                      block_steps: int = BLOCK_STEPS) -> dict:
    """The dictionary of the module docstring, of ``x`` ``[n, units]`` (the core's outputs at
    steps of episodes ``episode`` ``[n]``), its atoms named after ``variables`` (name -> ``[n]``,
    NaN where unknown).

    Returns ``atoms``, ``units``, ``alpha``, ``seed``, ``held_out`` (which steps), ``train_steps``,
    ``held_out_steps``, ``target``, ``by_sparsity`` (per ``k``: ``variance_explained`` and
    ``pca_variance_explained``, None past the units), ``sparsity`` (the ``k`` reported),
    ``variance_explained``, ``reached`` and ``features`` (per atom and ``sign`` of its
    coefficient used, most used first: ``atom``, ``sign``, ``usage``, ``label``, its ``auroc``
    and ``correlation`` (of the coefficient's size), and ``aurocs`` and ``correlations`` with
    every variable)."""
    from sklearn.decomposition import PCA, MiniBatchDictionaryLearning
    from sklearn.exceptions import ConvergenceWarning

    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(episode) or not np.isfinite(x).all():
        raise ValueError(f"x: expected finite [n={len(episode)}, units], got {list(x.shape)}")
    held, which = held_out_steps(np.asarray(episode), block_steps)
    train, test = x[~held], x[held]
    mean = train.mean(axis=0)
    scale = np.sqrt(np.mean(np.sum((train - mean) ** 2, axis=1))) or 1.0
    atoms = ATOMS_PER_UNIT * x.shape[1]
    learner = MiniBatchDictionaryLearning(n_components=atoms, alpha=ALPHA, batch_size=BATCH, max_iter=EPOCHS,
                                          transform_algorithm="omp", random_state=seed)
    with warnings.catch_warnings():   # an L1 fit of one batch that stops short only delays the atoms
        warnings.simplefilter("ignore", ConvergenceWarning)
        learner.fit((train - mean) / scale)

    def coded(rows: np.ndarray, k: int) -> np.ndarray:   # [rows, atoms], at most k atoms a row
        learner.set_params(transform_n_nonzero_coefs=min(k, atoms))
        with warnings.catch_warnings():   # a row rebuilt exactly with fewer than k atoms
            warnings.filterwarnings("ignore", "Orthogonal matching pursuit ended prematurely")
            return learner.transform((rows - mean) / scale)

    by_sparsity = []
    for k in SPARSITY:
        rebuilt = mean + scale * coded(test, k) @ learner.components_
        pca = None
        if k <= min(x.shape[1], len(train)):
            fitted = PCA(k, random_state=seed).fit(train)
            pca = r2(test, fitted.inverse_transform(fitted.transform(test)))
        by_sparsity.append({"k": k, "variance_explained": r2(test, rebuilt),
                            "pca_variance_explained": pca})
    reaching = [row for row in by_sparsity if row["variance_explained"] >= TARGET]
    chosen = reaching[0] if reaching else by_sparsity[-1]
    codes = coded(x, chosen["k"])                                                        # [n, atoms]
    # each atom and its negative, as two features that are >= 0: a signed coefficient's two
    # signs stand for opposite directions of the output
    parts = np.concatenate([codes.clip(min=0), (-codes).clip(min=0)], axis=1)           # [n, 2 atoms]
    usage = (parts != 0).mean(axis=0)
    names = list(variables)
    corr, separation = correlations(parts, variables), used_aurocs(parts, variables)   # [2 atoms, variables]
    features = []
    for c in np.argsort(-usage, kind="stable"):
        if usage[c] == 0:
            break
        finite = np.isfinite(separation[c])
        best = int(np.argmax(np.where(finite, np.abs(separation[c] - 0.5), -1.0))) if finite.any() else None
        features.append({"atom": int(c % atoms), "sign": "+" if c < atoms else "-", "usage": float(usage[c]),
                         "label": None if best is None else names[best],
                         "auroc": None if best is None else float(separation[c, best]),
                         "correlation": None if best is None else float(corr[c, best]),
                         "aurocs": {name: float(separation[c, j]) for j, name in enumerate(names)},
                         "correlations": {name: float(corr[c, j]) for j, name in enumerate(names)}})
    return {"atoms": atoms, "units": x.shape[1], "alpha": ALPHA, "seed": seed, "held_out": which,
            "train_steps": int((~held).sum()), "held_out_steps": int(held.sum()), "target": TARGET,
            "by_sparsity": by_sparsity, "sparsity": chosen["k"], "variance_explained": chosen["variance_explained"],
            "reached": bool(reaching), "features": features}
