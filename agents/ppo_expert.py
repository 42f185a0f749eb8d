"""The PPO expert as an actor on the raw env: one action per env frame, from an SB3 zip.

Recording and DAgger step the raw CarRacing env (one row per env frame), while the
expert's policy acts every ``action_repeat`` frames on grey frame stacks. :class:`PPOExpert`
bridges the two: it feeds each frame it decides on through the same gymnasium observation
wrappers an SB3 user stacks on the env (:func:`~nac_drive.agents.ppo_lab.env.observe_as_expert`),
and repeats its action in between, as :class:`~nac_drive.simulators.carracing.ActionRepeat`
does. Everything it needs comes from the zip (its ``preprocessing`` record).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from nac_drive.agents.ppo_lab.env import observe_as_expert
from nac_drive.agents.ppo_lab.expert_zip import load_expert_zip


def shipped_expert_path() -> Path:
    """Path of the expert zip shipped inside the package."""
    from importlib.resources import files

    return Path(str(files("nac_drive") / "assets" / "ppo_carracing_discrete.zip"))


class _HandedFrames(gym.Env):
    """The frames an actor is handed, as an env: ``reset`` and ``step`` return the frame
    last set in :attr:`frame` (RGB ``uint8 [96, 96, 3]``), so observation wrappers can
    process frames that some other code steps the real env for."""

    observation_space = gym.spaces.Box(0, 255, (96, 96, 3), np.uint8)
    action_space = gym.spaces.Discrete(1)

    def __init__(self):
        self.frame: np.ndarray | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self.frame, {}

    def step(self, action):
        return self.frame, 0.0, False, False, {}


class PPOExpert:
    """Drives the raw env with a PPO expert zip (:func:`~nac_drive.agents.ppo_lab.training.train_expert`).

    ``continuous``: whether it drives the continuous env; ``gas``: what its GAS presses (the env
    it drives is ``make_carracing(continuous=..., gas=...)``). ``act(obs)`` takes the raw RGB frame
    ``uint8 [96, 96, 3]`` every env frame. Every ``action_repeat`` frames (the zip's
    ``preprocessing``) the frame goes through the expert's observation wrappers (grey,
    resized, stacked; zeros before the first after ``reset()``) and the policy's most likely
    action is taken; in between the last one is repeated, exactly as in the training env.

    Loading reads only the zip's JSON ``data`` and its ``policy.pth`` weights (with
    ``torch.load(weights_only=True)``): nothing pickled in the zip is executed, and no
    env is needed. ``device``: where its network runs (:func:`~nac_drive.devices.resolve_device`);
    its actions come back to the CPU.
    """

    def __init__(self, path: str | Path | None = None, device: str = "cpu"):
        import torch

        from nac_drive.devices import resolve_device

        self.device = resolve_device(device)   # before the zip is read
        self.path = Path(path) if path is not None else shipped_expert_path()
        self.policy, self.continuous, self.preprocessing = load_expert_zip(self.path)
        self.policy.to(self.device)
        self.action_repeat = self.preprocessing.action_repeat
        self.gas = self.preprocessing.gas
        self.name = f"ppo:{self.path.stem}"
        self._torch = torch
        self._frames = _HandedFrames()
        self._view = observe_as_expert(self._frames, self.preprocessing)
        self.reset()

    def reset(self) -> None:
        """Start of an episode: empty frame stack, decide at the next frame."""
        self._frame = 0
        self.observation: np.ndarray | None = None  # the last stack decided on

    def observe(self, obs: np.ndarray) -> np.ndarray:
        """Push one raw frame onto the stack; returns the stack
        ``uint8 [frame_stack, frame_size, frame_size]``."""
        self._frames.frame = obs
        if self.observation is None:   # the episode's first frame
            self.observation = self._view.reset()[0]
        else:
            self.observation = self._view.step(0)[0]
        return self.observation

    def act(self, obs: np.ndarray):
        """Action for this env frame (an int, or ``float32 [3]`` if continuous)."""
        if self._frame % self.action_repeat == 0:
            self._action = self.decide(self.observe(obs))
        self._frame += 1
        return self._action

    def decide(self, stack: np.ndarray) -> Any:
        """The policy's most likely action for a frame stack ``uint8 [frame_stack, size, size]``."""
        torch = self._torch
        with torch.no_grad():
            x = torch.as_tensor(stack[None], device=self.device)  # [1, stack, size, size]; SB3 scales by 1/255
            action = self.policy.get_distribution(x).get_actions(deterministic=True)[0].cpu().numpy()
        if self.continuous:
            space = self.policy.action_space
            return np.clip(action, space.low, space.high).astype(np.float32)
        return int(action)
