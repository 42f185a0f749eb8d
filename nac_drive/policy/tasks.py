"""What differs between the driving tasks, as a policy sees them: the raw observation it
takes, how that becomes the encoder's frame, and how the head's output becomes an action.

A :class:`~nac_drive.policy.DrivingPolicy` holds the :class:`Task` of its config
(``TASKS[config.task]``) and asks it, instead of branching on the task's name.

* CarRacing: the env's RGB ``[96, 96, 3]`` frame is the network's frame as it is; the
  head gives the 5 discrete actions' logits or (steer, gas, brake).
* Udacity: the simulator's RGB ``[160, 320, 3]`` camera frame is cropped to the road
  (rows 60:-25), resized to 66x200 and turned into YUV (:func:`udacity_frame`, which the
  training data goes through too); the head gives the steering angle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

CARRACING_CAMERA = (96, 96, 3)
CARRACING_LOW, CARRACING_HIGH = (-1.0, 0.0, 0.0), (1.0, 1.0, 1.0)   # steer, gas, brake
DISCRETE_GAS = 0.2  # what the discrete env's GAS presses (the continuous env's gas goes to 1)

UDACITY_CAMERA = (160, 320, 3)
CROP_TOP, CROP_BOTTOM = 60, 25            # sky and the car's hood
INPUT_HEIGHT, INPUT_WIDTH = 66, 200       # PilotNet's input


def udacity_frame(image_rgb: np.ndarray) -> np.ndarray:
    """uint8 RGB [160, 320, 3] -> uint8 YUV [66, 200, 3] (crop rows 60:-25, resize, RGB->YUV).

    The one function that turns a simulator frame into network input, for the training
    data and for live driving alike, so the two can never drift apart."""
    import cv2

    img = np.asarray(image_rgb)
    if img.ndim != 3 or img.shape[2] != 3 or img.shape[0] <= CROP_TOP + CROP_BOTTOM:
        raise ValueError(f"preprocess expects an RGB image [H>{CROP_TOP + CROP_BOTTOM}, W, 3], got shape {img.shape}")
    img = img[CROP_TOP:img.shape[0] - CROP_BOTTOM]
    img = cv2.resize(img, (INPUT_WIDTH, INPUT_HEIGHT), interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(np.ascontiguousarray(img, dtype=np.uint8), cv2.COLOR_RGB2YUV)


@dataclass(frozen=True)
class Task:
    """A driving task's input and output, for a policy with ``num_outputs`` outputs that
    are ``"discrete"`` (class logits) or ``"continuous"`` (the action itself)."""

    name: str
    camera_shape: tuple[int, int, int]
    """the raw RGB observation, ``[H, W, 3]`` uint8"""
    to_frame: Callable[[np.ndarray], np.ndarray] | None = None
    """raw observation -> the encoder's frame (None: the observation as it is)"""
    visible_rows: tuple[int, int] | None = None
    """rows cut from the top and the bottom of the camera frame before the network sees it"""
    continuous_bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    """(low, high) of a continuous action with that many outputs (otherwise each in [-1, 1])"""
    steering_only: bool = False
    """the action is one steering angle, which actors pass on as a float"""
    env_flag: str | None = None
    """the env's constructor flag that chooses discrete or continuous actions"""

    def frame(self, image: np.ndarray) -> np.ndarray:
        """A raw RGB observation -> the encoder's frame, uint8 ``[H, W, 3]``."""
        return image if self.to_frame is None else self.to_frame(image)

    def action_space(self, kind: str, num_outputs: int):
        """The gymnasium space of one action of ``kind`` ("discrete" or "continuous", ``PolicyConfig.action``)."""
        from gymnasium import spaces

        if kind == "discrete":
            return spaces.Discrete(num_outputs)
        low, high = self._bounds(num_outputs)
        return spaces.Box(np.float32(low), np.float32(high), dtype=np.float32)

    def action(self, output: np.ndarray, kind: str):
        """The head's output ``[num_outputs]`` -> an action of :meth:`action_space` of ``kind``."""
        if kind == "discrete":
            return int(output.argmax())
        low, high = self._bounds(len(output))
        return np.clip(output, low, high).astype(np.float32)

    def actor_action(self, action):
        """What :meth:`DrivingPolicy.select_action` returns: the action, or the steering
        angle as a float (what the Udacity bridge sends)."""
        return float(action[0]) if self.steering_only else action

    def env_hint(self, kind: str) -> str:
        """How to make an env whose action space fits a policy of this task and action ``kind``."""
        return f" (make the env with {self.env_flag}={kind == 'continuous'})" if self.env_flag else ""

    def _bounds(self, num_outputs: int):
        if self.continuous_bounds and num_outputs == len(self.continuous_bounds[0]):
            return self.continuous_bounds
        return (-1.0,) * num_outputs, (1.0,) * num_outputs


TASKS = {
    "carracing": Task("carracing", CARRACING_CAMERA, continuous_bounds=(CARRACING_LOW, CARRACING_HIGH),
                      env_flag="continuous"),
    "udacity": Task("udacity", UDACITY_CAMERA, to_frame=udacity_frame, visible_rows=(CROP_TOP, CROP_BOTTOM),
                    steering_only=True),
}
