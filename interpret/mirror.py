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
"""

from __future__ import annotations

import os

import numpy as np
import torch

from nac_drive.interpret.fig4 import sides_of, steer_deadband
from nac_drive.interpret.trace import RunTrace, load_trace

MIRRORED_ACTIONS = {"left": "right", "right": "left"}


def mirrored_frame(frame: np.ndarray) -> np.ndarray:
    """A frame ``[H, W, C]`` flipped left-right (a new array)."""
    return np.ascontiguousarray(np.asarray(frame)[:, ::-1])


def action_mirror(action_names) -> np.ndarray:
    """``[A]`` int64: the index of each action's mirror image (``left`` <-> ``right``, the
    others themselves)."""
    names = list(action_names)
    return np.array([names.index(MIRRORED_ACTIONS.get(name, name)) if MIRRORED_ACTIONS.get(name, name) in names
                     else i for i, name in enumerate(names)], dtype=np.int64)


def streamed_outputs(policy, run: RunTrace, n: int, mirror: bool = False) -> np.ndarray:
    """``[n, num_outputs]``: the policy's raw output at each of the run's first ``n`` steps,
    its frames streamed episode by episode (each flipped left-right if ``mirror``)."""
    outputs = []
    with torch.no_grad():
        for i in range(n):
            if i == 0 or run.episode[i] != run.episode[i - 1]:
                policy.reset()
            frame = run.frame(i)
            outputs.append(policy.step_output(mirrored_frame(frame) if mirror else frame).float().numpy())
    return np.array(outputs)


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
    (the mean |mirrored steering + intact steering|, 0 for a policy that mirrors exactly).
    """
    run = run if isinstance(run, RunTrace) else load_trace(run)
    n = run.num_steps if max_frames is None else min(max_frames, run.num_steps)
    if n == 0:
        raise ValueError(f"run: {run.path} has no steps")
    policy.eval()
    intact = streamed_outputs(policy, run, n)
    mirrored = streamed_outputs(policy, run, n, mirror=True)
    policy.reset()
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
            "mirror_agreement": float(flipped.mean()), **extra}
