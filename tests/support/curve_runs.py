"""Hand-built policies whose core's output carries the curve ahead in one unit, and runs of
synthetic frames that show it: what the probes and the push along the curvature probe find
(tests/test_probes.py, the push's Ray path in tests/test_ray.py)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from nac_drive.interpret.trace import RunRecorder, load_trace
from nac_drive.policy.cores import CoreConfig
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
from nac_drive.simulators.carracing import ACTION_NAMES
from support.pass_through import PassThrough

GAIN = 20.0            # the steering output is -GAIN x the curve unit: a left curve (positive) steers left
CURVES = (-0.03, -0.01, 0.0, 0.01, 0.03)
TURN_GAIN = 4.0        # turning_policy's left logit: TURN_GAIN x (the unit it reads - 0.5); its right one minus that
GAS_LOGIT = 1.0        # above both where that unit is near 0.5, as on CarRacing's road and grass: it drives on


class CurveAndNoise(nn.Module):
    """An encoder whose feature 0 is the frame's centre brightness (which the run's frames set
    from the curve ahead) and feature 1 its corner's brightness (noise); the others are 0."""

    frame_shape = (3, 96, 96)

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        grey = frames.float().mean(1) / 255.0
        features = torch.zeros(len(frames), self.dim)
        features[:, 0] = grey[:, 32:64, 32:64].mean((1, 2))
        features[:, 1] = grey[:, :16, :16].mean((1, 2))
        return features


def steering_policy():
    """A continuous CarRacing policy (a GRU by its config: only its core output is probed)
    whose steering output is -GAIN x core unit 0."""
    policy = DrivingPolicy(PolicyConfig(action="continuous", num_outputs=3,
                                        core=CoreConfig(core="gru", d_model=8, window=4)))
    dim = policy.config.feature_dim
    policy.encoder, policy.core = CurveAndNoise(dim), PassThrough(dim)
    policy.head = nn.Sequential(nn.Dropout(0.0), nn.Linear(dim, 3))
    with torch.no_grad():
        policy.head[-1].weight.zero_()
        policy.head[-1].bias.zero_()
        policy.head[-1].weight[0, 0] = -GAIN
    return policy.eval()


def turning_policy(unit: int = 0) -> DrivingPolicy:
    """A discrete CarRacing policy (a GRU by its config) on :class:`CurveAndNoise` that presses
    gas, and turns left where core unit ``unit`` is well above 0.5 and right where it is well below
    (its left and right logits +-TURN_GAIN x (the unit - 0.5), its gas logit GAS_LOGIT). Unit 0
    carries the curve ahead on :func:`curve_run`'s frames, unit 1 their corner's noise."""
    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru", d_model=8, window=4)))
    dim = policy.config.feature_dim
    policy.encoder, policy.core = CurveAndNoise(dim), PassThrough(dim)
    policy.head = nn.Sequential(nn.Dropout(0.0), nn.Linear(dim, len(ACTION_NAMES)))
    head = policy.head[-1]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        for action, sign in (("left", 1.0), ("right", -1.0)):
            head.weight[ACTION_NAMES.index(action), unit] = sign * TURN_GAIN
            head.bias[ACTION_NAMES.index(action)] = -sign * TURN_GAIN * 0.5
        head.bias[ACTION_NAMES.index("gas")] = GAS_LOGIT
    return policy.eval()


def curve_run(run_dir, episodes=3, steps=240, stretch=30, seed=0, action_names=("steer", "gas", "brake")):
    """Episodes whose curve ahead changes every ``stretch`` steps; each frame's centre shows the
    curve as its brightness, its corner random brightness; speed is random, unseen in the frames."""
    rng = np.random.default_rng(seed)
    recorder = RunRecorder(run_dir, action_names=list(action_names))
    for _ in range(episodes):
        recorder.new_episode()
        curves = np.repeat(rng.choice(CURVES, size=steps // stretch), stretch) + rng.normal(0, 0.002, steps)
        speeds = np.repeat(rng.uniform(20, 80, size=steps // stretch), stretch)
        for step, (curve, speed) in enumerate(zip(curves, speeds)):
            frame = np.full((96, 96, 3), 128, np.uint8)
            frame[32:64, 32:64] = np.uint8(np.clip(128 + 3000 * curve, 0, 255))
            frame[:16, :16] = np.uint8(rng.integers(0, 256))
            recorder.add(frame, policy_action=np.zeros(3), timestamp=0.02 * step,
                         scene={"curvature": curve, "speed": speed, "heading_error": np.nan})
    recorder.save()
    return load_trace(run_dir)
