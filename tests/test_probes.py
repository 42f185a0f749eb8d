"""Linear probes and the push along a probe (nac_drive.interpret.probes, probe_steering): a
hand-built policy whose core output carries the curve ahead in one unit, and whose steering
reads that unit, is found by the curvature probe on held-out episodes (far above the shuffled
control, which stays near 0), and its steering follows a push along the probe with the sign
and size the head's weight gives; a variable the frames do not show is not found."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from nac_drive.interpret.probe_steering import push_verdict, steering
from nac_drive.interpret.probes import block_permutation, fit_probe, held_out_groups, linear_probes
from nac_drive.interpret.trace import RunRecorder, load_trace
from support.pass_through import PassThrough

torch.set_num_threads(1)
GAIN = 20.0            # the steering output is -GAIN x the curve unit: a left curve (positive) steers left
CURVES = (-0.03, -0.01, 0.0, 0.01, 0.03)


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
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

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


def curve_run(run_dir, episodes=3, steps=240, stretch=30, seed=0):
    """Episodes whose curve ahead changes every ``stretch`` steps; each frame's centre shows the
    curve as its brightness, its corner random brightness; speed is random, unseen in the frames."""
    rng = np.random.default_rng(seed)
    recorder = RunRecorder(run_dir, action_names=["steer", "gas", "brake"])
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


def test_the_probe_finds_the_unit_the_steering_reads_and_the_steering_follows_a_push(tmp_path):
    from nac_drive.pipeline.explain import probes_section

    run = curve_run(tmp_path)
    section = probes_section(run, steering_policy(), seed=0)
    assert section["held_out"] == "episodes" and section["groups"] == 3
    assert set(section["skipped"]) == {"q", "k", "v", "heads"} and "core is gru" in section["skipped"]["heads"]
    assert set(section["variables_skipped"]) == {"cross_track_error", "heading_error"}
    scores = {row["variable"]: row for row in section["scores"]}
    assert [row["representation"] for row in section["scores"]] == ["core", "core"]
    curve, speed = scores["curvature"], scores["speed"]
    assert curve["r2"] > 0.95 and curve["r2_ci95"][0] > 0.9
    assert abs(curve["control_r2"]) < 0.3 and curve["above_control_ci95"][0] > 0.6
    assert speed["r2"] < 0.2 and speed["r2_ci95"][0] < 0                # the frames do not show it
    assert "curvature by core" in section["verdict"] and "speed by none" in section["verdict"]

    push = section["intervention"]
    assert push["verdict"] == "follows" and push["steering"] == "steering output (positive right)"
    changes = {row["push"]: row["change"]["mean"] for row in push["pushes"]}
    expected = GAIN * push["sds"] * np.std(3000 / 255 * run.curvature)   # the spread of core unit 0, pushed
    assert changes["left"] < 0 < changes["right"] and changes["left"] == pytest.approx(-changes["right"])
    assert abs(changes["left"]) == pytest.approx(expected, rel=0.3)
    assert abs(changes["random +"]) < abs(changes["left"]) and push["random_directions"]["outdone"] == 1.0
    left = next(row for row in push["pushes"] if row["push"] == "left")
    assert left["probe_change"] > 0 and left["change"]["ci95"][1] < 0     # the probe reads a left curve


def test_a_variable_the_frames_do_not_show_stays_at_the_controls_level():
    rng = np.random.default_rng(1)
    episode = np.repeat(np.arange(4), 200)
    x = rng.normal(size=(800, 6))
    unrelated = np.repeat(rng.normal(size=40), 20)                       # slow, autocorrelated, unseen
    result = linear_probes({"core": x}, {"curvature": unrelated, "speed": x[:, 2] + 0.1 * rng.normal(size=800)},
                           episode, resamples=200)
    rows = {row["variable"]: row for row in result["scores"]}
    assert rows["speed"]["r2"] > 0.95 and rows["speed"]["above_control_ci95"][0] > 0.8
    assert rows["curvature"]["r2"] < 0.05 and rows["curvature"]["above_control_ci95"][0] < 0
    assert result["verdict"].endswith("curvature by none; speed by core (R^2 0.99)")


def test_a_block_permutation_moves_whole_blocks_and_short_runs_are_cut_in_stretches():
    blocks = np.repeat([0, 1, 2, 3], [5, 3, 4, 2])
    order = block_permutation(blocks, seed=3)
    assert sorted(order) == list(range(14))
    moved = blocks[order]
    assert [len(list(g)) for g in np.split(moved, np.flatnonzero(np.diff(moved)) + 1)] == \
        [int((blocks == b).sum()) for b in dict.fromkeys(moved)]           # each block arrives whole, in order
    groups, kind = held_out_groups(np.zeros(30, int))
    assert kind == "stretches of 6 steps" and np.unique(groups).size == 5
    with pytest.raises(ValueError, match="4 training steps or more"):
        fit_probe(np.zeros((3, 2)), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match=r"representations\['core'\]: expected \[10, units\]"):
        linear_probes({"core": np.zeros((9, 2))}, {}, np.zeros(10))


def test_a_discrete_policys_steering_is_its_expected_turn():
    names = ["noop", "left", "right", "gas", "brake"]
    outputs = np.log(np.array([[0.1, 0.6, 0.1, 0.1, 0.1], [0.2, 0.0 + 1e-12, 0.8, 0.0 + 1e-12, 0.0 + 1e-12]]))
    steer, what = steering(outputs, names)
    assert what == "P(right) - P(left)" and steer == pytest.approx([-0.5, 0.8])
    assert steering(outputs, None)[0].tolist() == outputs[:, 0].tolist()      # a steering policy: output 0
    with pytest.raises(ValueError, match="actions named 'left' and 'right'"):
        steering(outputs, ["a", "b", "c", "d", "e"])


def test_a_push_that_a_random_direction_outdoes_is_not_called_followed():
    def pushes(left, right):
        return [{"push": "left", "change": {"ci95": left}}, {"push": "right", "change": {"ci95": right}}]

    assert push_verdict(pushes([-0.3, -0.1], [0.1, 0.3]), outdone=1.0) == "follows"
    assert push_verdict(pushes([-0.3, -0.1], [0.1, 0.3]), outdone=0.5) == "follows no more than a random direction"
    assert push_verdict(pushes([0.1, 0.3], [-0.3, -0.1]), outdone=1.0) == "opposite"
    assert push_verdict(pushes([-0.3, 0.1], [0.1, 0.3]), outdone=1.0) == "no clear effect"
    assert push_verdict(pushes(None, [0.1, 0.3]), outdone=1.0) == "no clear effect"
