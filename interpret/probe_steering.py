"""Pushing the core's output along the curvature probe: does the steering follow what the
probe reads?

The probe of the curve ahead (:func:`~nac_drive.interpret.probes.fit_probe` on the core's
output of every replayed step; curvature left positive) reads it along its weight vector ``w``.
Each step's core output is moved by :data:`PUSH_SDS` standard deviations of the outputs along
``w``: towards a left curve (``left``: the probe reads more curvature), towards a right one
(``right``), and as a control by as long a shift along each of :data:`RANDOM_DIRECTIONS` random
directions (seeded; the first one's pushes both ways are rows ``random +`` and ``random -``): a
push of the same size whatever the outputs' spread along it, since the probe's direction may
have far less spread than a random one and standard deviations would then make the control
many times larger; the head reads the moved output
(:meth:`~nac_drive.policy.DrivingPolicy.core_shifted`). Open loop: on the frames the policy
saw while driving, its core's outputs as it computed them; the push reaches the head alone (no
state of the core changes), so each step is paired with itself intact.

Steering, positive right: a discrete policy's expected steering ``P(right) - P(left)`` (the
softmax of its head's output), a steering policy's output 0. A policy whose steering reads the
probe's direction steers left when pushed towards a left curve: ``change`` below 0 for
``left`` and above 0 for ``right``, and further than along most random directions (a push
that changes the steering less than a random one says the steering does not read the
probe's direction in particular). Each change is the mean over the steps with a 95%
block-bootstrap interval over stretches of the task's ``block_steps`` steps
(:attr:`~nac_drive.interpret.road_scenes.RoadScale.block_steps`;
:func:`~nac_drive.simulators.episode_stats.paired_block_change`).

Closed loop (explain's ``push`` section, :func:`~nac_drive.pipeline.explain.push_section`): the
policy drives held-out tracks intact, then with every step's core output moved by the same
``left`` and ``right`` shifts and, as the control, along the first few of the random directions
(:data:`~nac_drive.pipeline.explain.PUSH_RANDOM`), as long as the probe's. What it then
steers changes what it sees next. Each change is the mean over the tracks of each track's change
of its mean steering, paired with the same track driven intact, with a 95% BCa interval
(:func:`~nac_drive.simulators.episode_stats.paired_change`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from nac_drive.interpret.road_scenes import BLOCK_STEPS

PUSH_SDS = 2.0   # how far each push moves the core's output: standard deviations along its direction
RANDOM_DIRECTIONS = 20
BEYOND_RANDOM = 0.95   # the share of random directions a push must outdo for the verdict "follows"


def steering_values(action_names: list[str] | None, outputs: np.ndarray) -> np.ndarray:
    """:func:`steering`'s values alone, ``[n]``; ``action_names`` first, so that
    ``partial(steering_values, names)`` reads the head's outputs (and pickles: a Ray task takes it)."""
    return steering(outputs, action_names)[0]


def steering(outputs: np.ndarray, action_names: list[str] | None) -> tuple[np.ndarray, str]:
    """(``[n]`` the steering of the head's outputs ``[n, A]``, positive right, what it is): a
    discrete policy's (its ``action_names``, which must hold ``left`` and ``right``) expected
    steering P(right) - P(left); a steering policy's (``action_names`` None) output 0."""
    if action_names is not None:
        names = list(action_names)
        if "left" not in names or "right" not in names:
            raise ValueError(f"action_names: a discrete policy's steering needs actions named 'left' and 'right', "
                             f"got {names}")
        from scipy.special import softmax

        p = softmax(outputs, axis=1)
        return p[:, names.index("right")] - p[:, names.index("left")], steering_kind(names)
    return outputs[:, 0], steering_kind(None)


def steering_kind(action_names: list[str] | None) -> str:
    """What :func:`steering` reads with these ``action_names``."""
    return "steering output (positive right)" if action_names is None else "P(right) - P(left)"


def curvature_pushes(core: np.ndarray, curvature: np.ndarray, episode: np.ndarray, seed: int = 0,
                     sds: float = PUSH_SDS, block_steps: int = BLOCK_STEPS) -> dict:
    """The probe of ``curvature`` ``[n]`` (NaN where unknown; left positive) fitted on ``core``
    ``[n, units]`` (the core's outputs at the run's steps, of episodes ``episode`` ``[n]``), and the
    shifts of the core's output it gives (the module docstring): ``sds`` standard deviations of
    ``core`` along the probe's direction, each random one as long.

    Returns ``probe`` (its ``steps`` and ``in_sample_r2``), ``reads`` (``[units]`` its weights
    ``w``: it reads ``core @ w`` plus a constant), ``blocks`` (``[n]`` the steps' stretches of
    ``block_steps``), ``sds`` and ``shifts`` (name -> ``[units]``:
    ``left``, ``right``, then ``random 1`` ... ``random`` :data:`RANDOM_DIRECTIONS`, seeded)."""
    from nac_drive.interpret.probes import fit_probe, probe_direction
    from nac_drive.simulators.episode_stats import episode_time_blocks

    core, curvature = np.asarray(core, dtype=np.float64), np.asarray(curvature, dtype=np.float64)
    if core.ndim != 2 or len(core) != len(curvature) or len(core) != len(episode):
        raise ValueError(f"core [n, units], curvature [n] and episode [n]: got {list(core.shape)}, "
                         f"{list(curvature.shape)} and {len(episode)}")
    if not sds > 0:
        raise ValueError(f"sds: must be > 0, got {sds}")
    blocks = episode_time_blocks(episode, block_steps)
    known = np.isfinite(curvature) & np.isfinite(core).all(axis=1)
    probe = fit_probe(core[known], curvature[known], blocks[known])
    w, _ = probe_direction(probe)
    if not np.linalg.norm(w) > 0:
        raise ValueError("curvature: the probe found no direction (its weights are 0)")
    towards_left = w / np.linalg.norm(w)
    controls = np.random.default_rng(seed).normal(size=(RANDOM_DIRECTIONS, len(w)))
    controls /= np.linalg.norm(controls, axis=1, keepdims=True)
    length = sds * np.std(core @ towards_left)
    shifts = {"left": length * towards_left, "right": -length * towards_left,
              **{f"random {i + 1}": length * direction for i, direction in enumerate(controls)}}
    return {"probe": {"steps": int(known.sum()), "in_sample_r2": float(probe.score(core[known], curvature[known]))},
            "reads": w, "blocks": blocks, "sds": sds, "shifts": shifts}


def compare_pushes(shifts: dict[str, np.ndarray], steered: dict[str, np.ndarray], intact: np.ndarray,
                   reads: np.ndarray, change: Callable[[np.ndarray, np.ndarray], dict], rows: list[str],
                   controls: list[str]) -> dict:
    """The steering under each push beside ``intact`` ``[m]`` (per step, or per track): ``shifts``
    (name -> ``[units]``) and ``steered`` (name -> ``[m]``, the steering under it); ``reads``: the
    probe's weights; ``change(intact, steered)``: the paired change (``mean``, ``ci95``, ...).

    Returns ``intact_steering`` (the mean), ``pushes`` (per name of ``rows``: its ``norm``
    (|shift|), ``probe_change`` (how far the probe's reading moves, 1/length unit),
    ``mean_steering`` and ``change``), ``random_directions`` over the pushes named in ``controls``
    (``count``, the ``median_abs_change`` and ``max_abs_change`` of the mean steering change along
    them, and ``outdone``: the share of them whose |change| is below both the ``left`` and the
    ``right`` push's) and a
    ``verdict`` (:func:`push_verdict`)."""
    pushes = [{"push": name, "norm": float(np.linalg.norm(shifts[name])), "probe_change": float(reads @ shifts[name]),
               "mean_steering": float(np.mean(steered[name])), "change": change(intact, steered[name])}
              for name in rows]
    random_changes = np.abs([np.mean(steered[name] - intact) for name in controls])
    weaker = min(abs(float(np.mean(steered[name] - intact))) for name in ("left", "right"))
    random = {"count": len(controls), "median_abs_change": float(np.median(random_changes)),
              "max_abs_change": float(random_changes.max()), "outdone": float(np.mean(random_changes < weaker))}
    return {"intact_steering": float(np.mean(intact)), "pushes": pushes, "random_directions": random,
            "verdict": push_verdict(pushes, random["outdone"])}


def push_steering(policy, core: np.ndarray, pushed: dict, action_names: list[str] | None) -> dict:
    """The open-loop pushes of the module docstring, on ``core`` ``[n, units]`` (the core's
    outputs at the run's steps) along ``pushed``, :func:`curvature_pushes` of the curvature
    probe fitted on them; ``action_names``: a discrete policy's (None: a steering policy,
    :func:`steering`).

    Returns ``mode``, ``sds``, ``steering`` (what it is), ``probe`` (its ``steps`` and
    ``in_sample_r2``) and :func:`compare_pushes`'s figures: each push's ``change`` per step
    (``mean``, ``ci95``, ``blocks``, ``items``: a block bootstrap), pushes ``left``, ``right``,
    ``random +`` and ``random -`` (the first random direction both ways), and all
    :data:`RANDOM_DIRECTIONS` random directions as the control."""
    from nac_drive.simulators.episode_stats import paired_block_change

    shifts = pushed["shifts"]
    shifts = {**shifts, "random +": shifts["random 1"], "random -": -shifts["random 1"]}
    policy.eval()
    y = torch.from_numpy(np.asarray(core, dtype=np.float64)).float()

    def steered(shift: np.ndarray | None) -> tuple[np.ndarray, str]:   # ([n] steering, what it is)
        with torch.no_grad(), policy.core_shifted(shift):
            return steering(policy.head(y).numpy(), action_names)

    intact, what = steered(None)
    rows = ["left", "right", "random +", "random -"]
    controls = [f"random {i + 1}" for i in range(RANDOM_DIRECTIONS)]
    compared = compare_pushes(shifts, {name: steered(shifts[name])[0] for name in rows + controls}, intact,
                              pushed["reads"], partial(paired_block_change, blocks=pushed["blocks"]), rows, controls)
    return {"mode": "open loop: the recorded frames' core outputs pushed, the head read again", "sds": pushed["sds"],
            "steering": what, "probe": pushed["probe"], **compared}


def push_verdict(pushes: list[dict], outdone: float) -> str:
    """Whether the steering follows the probe: "follows" (pushed towards a left curve it steers
    left, towards a right one right, both intervals excluding 0 that way, and each push moves it
    more than ``outdone`` >= :data:`BEYOND_RANDOM` of the random directions do),
    "opposite" (both intervals the other way, as far beyond the random directions), each with
    "no more than a random direction" where the signs hold but the size does not, else "no
    clear effect"."""
    ci = {row["push"]: row["change"]["ci95"] for row in pushes}
    left, right = ci.get("left"), ci.get("right")
    if left is None or right is None:
        return "no clear effect"
    for verdict, holds in (("follows", left[1] < 0 < right[0]), ("opposite", right[1] < 0 < left[0])):
        if holds:
            return verdict if outdone >= BEYOND_RANDOM else f"{verdict} no more than a random direction"
    return "no clear effect"
