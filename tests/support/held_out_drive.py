"""A policy drives held-out CarRacing tracks and every frame it saw is kept, with its head's
output: what an exported policy is compared against (tests/test_onnx_export.py,
benchmarks/onnx_policy.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class HeldOutDrive:
    """frames ``[N, 96, 96, 3]`` uint8 and outputs ``[N, num_outputs]`` of every episode in turn,
    ``starts`` the index of each episode's first frame, ``returns`` one per episode."""

    frames: np.ndarray
    outputs: np.ndarray
    starts: list[int]
    returns: list[float]


def drive_recording(policy, seeds: list[int], max_steps: int | None = None) -> HeldOutDrive:
    """``policy`` (a DrivingPolicy or an OnnxPolicy) drives one episode per seed."""
    from nac_drive.simulators.carracing import run_episodes

    class Recording:
        gas = policy.config.gas

        def __init__(self):
            self.frames, self.outputs, self.starts = [], [], []

        def reset(self):
            policy.reset()
            self.starts.append(len(self.frames))

        def reset_env(self, env):
            policy.check_env(env)

        def act(self, obs):
            self.frames.append(obs.copy())
            self.outputs.append(policy.step_output(obs).numpy().copy())
            return policy.output_to_action(policy.last_output)

    actor = Recording()
    results = run_episodes(actor, seeds, max_steps=max_steps)
    return HeldOutDrive(np.stack(actor.frames), np.stack(actor.outputs), actor.starts, list(results.returns))


def replay(policy, drive: HeldOutDrive, frames: int | None = None) -> np.ndarray:
    """The outputs ``[n, num_outputs]`` of ``policy`` on the first ``frames`` (default all) of
    ``drive``'s frames, reset where each episode began."""
    n = len(drive.frames) if frames is None else min(frames, len(drive.frames))
    out = []
    for i in range(n):
        if i in drive.starts:
            policy.reset()
        out.append(policy.step_output(drive.frames[i]).numpy().copy())
    return np.stack(out)
