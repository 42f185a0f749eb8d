"""Known-answer policies for the neuron atlas: hand-built NAC policies in which one neuron
alone decides the steering (a discrete CarRacing one, a Udacity steering regression), and
recorded runs of a policy on synthetic road frames.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from nac_drive.agents.driver import PolicyDriver
from nac_drive.policy.cores import CoreConfig
from nac_drive.interpret.trace import RunRecorder, load_trace
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
from nac_drive.simulators.carracing import ACTION_NAMES, LEFT, RIGHT
from support.synthetic_runs import road_frame


def road_episodes(episodes: int = 2, steps: int = 40, seed: int = 0,
                  size: tuple[int, int] = (96, 96)) -> list[list[np.ndarray]]:
    """``episodes`` lists of ``steps`` synthetic road frames (``size``: CarRacing's 96x96,
    or the Udacity camera's 160x320) whose bend swings left and right."""
    rng = np.random.default_rng(seed)
    return [[road_frame(rng, offset=0.3 * np.sin(0.2 * i + e), curve=np.sin(0.15 * i + 2 * e), size=size)
             for i in range(steps)] for e in range(episodes)]


def one_neuron_policy(frames: list[np.ndarray], unit: int = 1) -> DrivingPolicy:
    """A discrete CarRacing NAC policy that steers LEFT where the value unit ``v[unit]`` is
    positive and RIGHT where it is negative, never anything else.

    Its window is one frame, so each step attends to itself alone (weight 1) and the layer's
    output at ``unit`` is ``t_ii * v[unit]`` with ``t_ii`` in (0, 1): every other neuron only
    scales it. ``v[unit]`` reads one encoder feature, centred on its median over ``frames``
    (so about half of them steer each way); the output projection passes only ``unit`` on, and
    the head's LEFT and RIGHT logits are +-10 times it, the others -10.
    """
    config = PolicyConfig(feature_dim=8, core=CoreConfig(window=1, d_model=8, num_heads=2, topk=2, backbone_units=6))
    policy = _value_unit_passed_on(DrivingPolicy(config).eval(), frames, unit)
    with torch.no_grad():
        head = policy.head[-1]
        head.weight.zero_()
        head.weight[LEFT, unit], head.weight[RIGHT, unit] = 10.0, -10.0
        head.bias.fill_(-10.0)
        head.bias[LEFT] = head.bias[RIGHT] = 0.0
    return policy


def one_neuron_steering_policy(frames: list[np.ndarray], unit: int = 1, gain: float = 0.1) -> DrivingPolicy:
    """A Udacity (PilotNet+NAC, one steering output) policy whose steering is exactly
    ``gain * v[unit]`` (plus nothing): positive ``v[unit]`` steers right.

    Its window is one frame and its values are not scaled by the time vector
    (``time_weighted_values`` off), so the layer's output at ``unit`` is ``v[unit]`` itself and
    no other neuron moves the steering. ``v[unit]`` reads one PilotNet feature, standardised
    over ``frames`` (uint8 RGB [160, 320, 3]) around its median.
    """
    config = PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1, feature_dim=8,
                          frame_dt=1 / 15, core=CoreConfig(window=1, d_model=8, num_heads=2, topk=2, backbone_units=6))
    policy = DrivingPolicy(config).eval()
    policy.core.nac.time_weighted_values = False
    policy = _value_unit_passed_on(policy, frames, unit)
    with torch.no_grad():
        head = policy.head[-1]
        head.weight.zero_()
        head.bias.zero_()
        head.weight[0, unit] = gain
    return policy


def _value_unit_passed_on(policy: DrivingPolicy, frames: list[np.ndarray], unit: int) -> DrivingPolicy:
    """``policy`` with ``v[unit]`` reading one encoder feature (the wired one that varies most
    over ``frames``), standardised around its median, and the output projection passing only
    ``unit`` on (to the same unit)."""
    nac = policy.core.nac
    with torch.no_grad():
        x = torch.stack([policy.observation_to_frame(f)[0] for f in frames])
        features = policy.encoder(x)                                                  # [n, 8]
        wired = torch.nonzero(nac.v_gate.mask[unit]).flatten()
        f = int(wired[features[:, wired].std(0).argmax()])
        nac.v_gate.weight[unit] = 0.0
        nac.v_gate.weight[unit, f] = 1.0 / float(features[:, f].std())
        nac.v_gate.bias[unit] = -float(features[:, f].median()) / float(features[:, f].std())
        nac.out_proj.weight.zero_()
        nac.out_proj.bias.zero_()
        nac.out_proj.weight[unit, unit] = 1.0
    return policy


def record_udacity_run(policy: DrivingPolicy, episodes: list[list[np.ndarray]], run_dir: str | os.PathLike,
                       cte: float | None = 0.0):
    """Drive a Udacity ``policy`` over the frames of each episode as the bridge feeds it
    (observations ``{"image", "timestamp", "speed", "cte"}``, 15 Hz, no scene; ``cte`` None:
    as from the Unity simulator, which sends none) and return the loaded run."""
    recorder = RunRecorder(run_dir, nac=policy.core.nac, action_names=["steering"])
    driver = PolicyDriver(policy, recorder=recorder)
    for frames in episodes:
        driver.reset()
        for i, frame in enumerate(frames):
            driver.act({"image": frame, "timestamp": i / 15, "speed": 9.0, "cte": cte})
    recorder.save()
    return load_trace(run_dir)


def record_policy_run(policy: DrivingPolicy, episodes: list[list[np.ndarray]], run_dir: str | os.PathLike):
    """Drive ``policy`` over the frames of each episode as the closed loop does
    (:class:`PolicyDriver` with a trace recorder) and return the loaded run."""
    recorder = RunRecorder(run_dir, nac=policy.core.nac, action_names=list(ACTION_NAMES))
    driver = PolicyDriver(policy, recorder=recorder)
    for e, frames in enumerate(episodes):
        driver.reset()
        for i, frame in enumerate(frames):
            action = driver.act(frame)
            driver.on_step(e, i, frame, action, 0.0, {})
    recorder.save()
    return load_trace(run_dir)
