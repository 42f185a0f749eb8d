"""Policies the Udacity protocol tests load into the bridge process (--policy module:callable)."""

from __future__ import annotations

import numpy as np


class ResetProbe:
    """Steers +0.5 for the first 3 frames after each reset, then -0.25; checks its inputs.

    A wrong observation (shape, dtype, keys, non-increasing timestamps) makes it raise, which
    the bridge answers with the safe command (steer 0) and counts as a policy error."""

    def __init__(self):
        self.calls = 0
        self.last_t = None

    def reset(self):
        self.calls = 0
        self.last_t = None

    def act(self, obs):
        img = obs["image"]
        assert isinstance(img, np.ndarray) and img.shape == (160, 320, 3) and img.dtype == np.uint8
        assert isinstance(obs["speed"], float) and isinstance(obs["timestamp"], float)
        assert self.last_t is None or obs["timestamp"] > self.last_t
        self.last_t = obs["timestamp"]
        self.calls += 1
        return 0.5 if self.calls <= 3 else -0.25


class Constant03:
    def reset(self):
        pass

    def act(self, obs):
        return 0.3


def untrained_udacity_policy():
    """A PilotNet+NAC steering policy with fresh weights: the same computation as a
    trained one, for latency benchmarks of the bridge (``--policy
    udacity_test_policies:untrained_udacity_policy``)."""
    import torch

    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    torch.set_num_threads(1)
    return DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1,
                                      head_dropout=0.5, frame_dt=1 / 15)).eval()
