"""Mirrored frames, a counterfactual: does the policy steer the other way on a road mirrored
left-right?

Each recorded frame is flipped left-right and the policy streams the mirrored episodes
exactly as it streams the recorded ones (:meth:`~nac_drive.policy.DrivingPolicy.step_output`,
a fresh window at each episode's start). Its decision on a mirrored frame is compared
with the mirror of its decision on the frame itself: a discrete policy's actions named
``left`` and ``right`` swap (:data:`MIRRORED_ACTIONS`, CarRacing's ``ACTION_NAMES``; the
others stay), a steering policy's side changes sign (left, straight within the deadband,
right: :func:`~nac_drive.interpret.fig4.sides_of`).

A policy that reads the road turns the other way on most mirrored turns; one that ignores
the image keeps its turn. The mirror is not a perfect counterfactual: CarRacing's HUD bar
at the bottom of the frame (speed, ABS, steering and gyroscope indicators) is not
symmetric, so it moves, and traffic conventions (none on these tracks) would flip too.

Which units swap (:func:`unit_partners`): per unit of the core's output (and of the NAC heads'
outputs), whether on the mirrored frames it does what it did on the real ones (symmetric),
the opposite (antisymmetric: it codes the side), what another unit did (a swap, e.g. a
left-curve unit and a right-curve unit) or none of these.
"""

from __future__ import annotations

import os

import numpy as np

from nac_drive.interpret.fig4 import sides_of, steer_deadband
from nac_drive.interpret.representations import Streamed, streamed
from nac_drive.interpret.trace import RunTrace, load_trace

MIRRORED_ACTIONS = {"left": "right", "right": "left"}
MATCH = 0.5     # the |correlation| a unit's best partner needs to count as its match
KINDS = ("symmetric", "antisymmetric", "swap", "neither", "constant")


def mirrored_frame(frame: np.ndarray) -> np.ndarray:
    """A frame ``[H, W, C]`` flipped left-right (a new array)."""
    return np.ascontiguousarray(np.asarray(frame)[:, ::-1])


def action_mirror(action_names) -> np.ndarray:
    """``[A]`` int64: the index of each action's mirror image (``left`` <-> ``right``, the
    others themselves)."""
    names = list(action_names)
    return np.array([names.index(MIRRORED_ACTIONS.get(name, name)) if MIRRORED_ACTIONS.get(name, name) in names
                     else i for i, name in enumerate(names)], dtype=np.int64)


def unit_partners(intact: np.ndarray, mirrored: np.ndarray, names: list[str], match: float = MATCH) -> dict:
    """Which unit each unit becomes under the mirror, from its activations ``[n, U]`` on the
    intact and on the mirrored frames (the same frames, in order).

    C[u, u'] is the correlation over the frames of unit u on the mirrored frames with unit u'
    on the intact ones; u's best partner is the u' of largest |C[u, u']|. u is ``symmetric``
    when its best partner is itself with C > 0 (it reads a mirrored road as the real one),
    ``antisymmetric`` when itself with C < 0 (its sign flips: it codes the side), ``swap`` when
    another unit u' whose best partner is u (each does on the mirrored road what the other does
    on the real one, e.g. a left-curve and a right-curve unit), ``neither`` otherwise (its best
    |C| below ``match``, or a partner that does not return the match: units that move together
    on the real frames are each other's near partners without swapping), ``constant`` when it
    does not vary. Returns ``match``, ``counts`` (per kind), ``pairs`` (the swaps, ``[u, u',
    C[u, u'], C[u', u]]``, by ``names``) and ``units`` (per unit: ``unit``, ``kind``, ``partner``
    (its swap partner, else None), ``correlation`` (C with its best partner) and
    ``self_correlation`` C[u, u])."""
    intact, mirrored = np.asarray(intact, dtype=np.float64), np.asarray(mirrored, dtype=np.float64)
    if intact.shape != mirrored.shape or intact.ndim != 2 or intact.shape[1] != len(names):
        raise ValueError(f"intact and mirrored: expected the same [n, {len(names)}], got {list(intact.shape)} and "
                         f"{list(mirrored.shape)}")

    def standardised(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        centred, spread = a - a.mean(axis=0), a.std(axis=0)
        varies = spread > 1e-9 * (1.0 + np.abs(a).max(axis=0))
        return np.where(varies, centred / np.where(varies, spread, 1.0), 0.0), varies

    z_mirrored, varies = standardised(mirrored)
    z_intact, _ = standardised(intact)
    corr = z_mirrored.T @ z_intact / max(len(intact), 1)                                 # [U, U]
    partner = np.abs(corr).argmax(axis=1)
    matched = varies & (np.abs(corr[np.arange(len(names)), partner]) >= match)
    units, counts = [], dict.fromkeys(KINDS, 0)
    for u, name in enumerate(names):
        c, v = float(corr[u, partner[u]]), partner[u]
        if not varies[u]:
            kind = "constant"
        elif matched[u] and v == u:
            kind = "symmetric" if c > 0 else "antisymmetric"
        elif matched[u] and matched[v] and partner[v] == u:
            kind = "swap"
        else:
            kind = "neither"
        counts[kind] += 1
        units.append({"unit": name, "kind": kind, "partner": names[v] if kind == "swap" else None,
                      "correlation": c if varies[u] else None,
                      "self_correlation": float(corr[u, u]) if varies[u] else None})
    pairs = [[names[u], names[v], float(corr[u, v]), float(corr[v, u])] for u, v in enumerate(partner)
             if u < v and units[u]["kind"] == "swap" and partner[v] == u]
    return {"match": match, "counts": counts, "pairs": pairs, "units": units}


def unit_names(stream: Streamed, num_heads: int | None = None) -> dict[str, list[str]]:
    """The names of the units of a :class:`~nac_drive.interpret.representations.Streamed` pass
    whose partners the mirror reports: the core's output ``y[i]``, and the NAC heads' outputs
    ``h<head>[<channel>]`` (``num_heads`` heads) where the pass has them."""
    names = {"core": [f"y[{i}]" for i in range(stream.core.shape[1])]}
    if stream.heads is not None:
        depth = stream.heads.shape[1] // num_heads
        names["heads"] = [f"h{u // depth}[{u % depth}]" for u in range(stream.heads.shape[1])]
    return names


def mirror_check(policy, run: RunTrace | str | os.PathLike, max_frames: int | None = None,
                 deadband: float | None = None) -> dict:
    """The mirrored-frames check of ``policy`` on the run's first ``max_frames`` steps
    (default all).

    Returns ``frames``, ``decision`` ("action" or "steering side"), ``turn_frames`` (frames
    where the intact policy turns: chooses ``left`` / ``right``, or steers outside the
    ``deadband``), and over them ``flips`` (the share where the mirrored frame turns the
    other way) and ``stays`` (the share where it turns the same way); ``mirror_agreement``
    over every frame (the mirrored decision is the mirror of the intact one, straight
    staying straight); for steering also ``deadband`` and ``steering_symmetry_error``
    (the mean |mirrored steering + intact steering|, 0 for a policy that mirrors exactly);
    ``units``: :func:`unit_partners` of the core's output (``core``) and, for a NAC policy, of
    its heads' outputs (``heads``; else ``units_skipped`` says why).
    """
    run = run if isinstance(run, RunTrace) else load_trace(run)
    n = run.num_steps if max_frames is None else min(max_frames, run.num_steps)
    if n == 0:
        raise ValueError(f"run: {run.path} has no steps")
    policy.eval()
    intact_pass, mirrored_pass = streamed(policy, run, n), streamed(policy, run, n, transform=mirrored_frame)
    intact, mirrored = intact_pass.outputs, mirrored_pass.outputs
    heads = policy.core.nac.num_heads if intact_pass.heads is not None else None
    units = {name: unit_partners(getattr(intact_pass, name), getattr(mirrored_pass, name), labels)
             for name, labels in unit_names(intact_pass, heads).items()}
    skipped = {} if "heads" in units else {"units_skipped": {
        "heads": f"needs the NAC heads' outputs; this policy's core is {policy.config.core.core}"}}
    if policy.config.action == "continuous":
        band = steer_deadband(run, deadband)
        if band is None:
            raise ValueError(f"run: a continuous policy's run must record its steering first, got action names "
                             f"{run.metadata.get('action_names')}")
        intact_side, mirrored_side = sides_of(intact[:, 0], band), sides_of(mirrored[:, 0], band)
        turning = intact_side != 0
        flipped = mirrored_side == -intact_side
        extra = {"deadband": band,
                 "steering_symmetry_error": float(np.mean(np.abs(mirrored[:, 0] + intact[:, 0])))}
        decision = "steering side"
    else:
        names = list(run.metadata.get("action_names") or [])
        if "left" not in names or "right" not in names:
            raise ValueError(f"run: the mirror check needs discrete actions named 'left' and 'right', got "
                             f"{names or None}")
        mirror_of = action_mirror(names)
        chosen, mirrored_choice = intact.argmax(axis=1), mirrored.argmax(axis=1)
        turning = np.isin(chosen, [names.index("left"), names.index("right")])
        flipped = mirrored_choice == mirror_of[chosen]
        intact_side, mirrored_side = chosen, mirrored_choice
        extra, decision = {}, "action"
    turns = int(turning.sum())
    return {"frames": n, "decision": decision, "turn_frames": turns,
            "flips": float(flipped[turning].mean()) if turns else None,
            "stays": float((mirrored_side == intact_side)[turning].mean()) if turns else None,
            "mirror_agreement": float(flipped.mean()), **extra, "units": units, **skipped}
