"""Grad-CAM for a recorded closed-loop run of a :class:`DrivingPolicy`.

The run's frames are replayed through the policy in order; for each step the policy's
:meth:`~nac_drive.policy.DrivingPolicy.frame_model` (the image model of that frame with
the window before it held fixed) goes to :func:`compute_run_saliency`. :class:`Replay` does
that replay for any other per-frame analysis (:mod:`nac_drive.interpret.faithfulness`).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np
import torch

from nac_drive.interpret.saliency import compute_run_saliency, overlay_region, saliency_maps
from nac_drive.interpret.trace import load_trace


def saliency_target(policy) -> str:
    """What a policy's saliency explains: the action it chose (discrete), or the steering
    direction it chose (continuous: column 0 is the steering)."""
    return "predicted" if policy.config.action == "discrete" else "steer"


def model_input(policy, frame: np.ndarray) -> torch.Tensor:
    """A recorded RGB frame -> the policy's image input ``[C, H, W]`` float in [0, 1]."""
    image, _ = policy.observation_to_frame(frame)
    return image.float() / 255.0 if image.dtype == torch.uint8 else image


def policy_saliency(policy, run_dir: str | os.PathLike, method: str = "gradcam", progress: bool = True) -> Path:
    """Write ``RUN_DIR/saliency.npz`` for ``policy`` on the run recorded in ``run_dir``
    (target: :func:`saliency_target`)."""
    run = load_trace(run_dir)
    replay = Replay(policy, run)
    region = policy.task.visible_rows   # Udacity: the model sees rows 60:-25 of the frame
    return compute_run_saliency(run_dir, replay.frame_model_for_step, preprocess=partial(model_input, policy),
                                target=saliency_target(policy), method=method, target_layer=policy.encoder.last_conv,
                                progress=progress, input_region=region)


def live_saliency(policy, frame: np.ndarray, method: str = "gradcam", alpha: float = 0.45,
                  timestamp: float | None = None) -> np.ndarray:
    """The saliency overlay (uint8 RGB, the frame's size) of the decision the policy is about
    to make on ``frame`` (seen at ``timestamp``, if the observation carries one): call it
    before the policy steps on the frame (the window so far is held fixed, as in
    :func:`policy_saliency`)."""
    model = policy.frame_model(timestamp)
    saliency = saliency_maps(model, model_input(policy, frame)[None], saliency_target(policy), method,
                             policy.encoder.last_conv)[0]
    return overlay_region(frame, saliency, alpha, policy.task.visible_rows)


class Replay:
    """Feeds the recorded frames to the policy, each with its recorded time (what the policy
    saw, also where frames were dropped), so that step i sees the frames before it.

    ``frame_model_for_step(i)`` (steps in increasing order are cheapest: going back or
    into a new episode restarts that episode) -> the image model of frame i;
    ``model_input(frame)`` -> the model input ``[C, H, W]`` of a recorded RGB frame.
    """

    def __init__(self, policy, run):
        self.policy, self.run = policy, run
        self.next_step = 0     # the first recorded step not yet fed to the policy

    def frame_model_for_step(self, i: int):
        if i < self.next_step or (i > 0 and self.run.episode[i] != self.run.episode[i - 1]):
            self._restart(i)
        while self.next_step < i:
            self.policy.step_output(self._observation(self.next_step))
            self.next_step += 1
        model = self.policy.frame_model(float(self.run.timestamp[i]))
        # the next call asks for step i + 1, whose context includes frame i
        self.policy.step_output(self._observation(i))
        self.next_step = i + 1
        return model

    def _observation(self, i: int) -> dict:
        return {"image": self.run.frame(i), "timestamp": float(self.run.timestamp[i])}

    def _restart(self, i: int) -> None:
        episode = self.run.episode[i]
        first = int(np.flatnonzero(self.run.episode == episode)[0])
        self.policy.reset()
        self.next_step = first

    def model_input(self, frame: np.ndarray) -> torch.Tensor:
        """The model input ``[C, H, W]`` of a recorded RGB frame (:func:`model_input`)."""
        return model_input(self.policy, frame)
