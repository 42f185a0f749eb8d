"""Mirrored frames (nac_drive.interpret.mirror): a hand-built policy that steers towards the
brighter half of the frame turns the other way on every mirrored turn; a policy that ignores
the image keeps its turn; in a hand-built representation of the two halves, the mirror's unit
report finds the planted swap pair, the symmetric and the antisymmetric unit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from nac_drive.interpret.mirror import action_mirror, mirror_check, mirrored_frame, unit_partners
from nac_drive.interpret.trace import RunRecorder, load_trace
from support.pass_through import PassThrough
from nac_drive.simulators.carracing import ACTION_NAMES

torch.set_num_threads(1)
LEFT, RIGHT = ACTION_NAMES.index("left"), ACTION_NAMES.index("right")


class Halves(nn.Module):
    """An encoder whose features are the mean of the frame's left half (0), of its right half
    (1), their difference (2) and their sum (3); the others are 0. A mirror swaps 0 and 1,
    negates 2 and keeps 3."""

    frame_shape = (3, 96, 96)

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        half = frames.shape[-1] // 2
        grey = frames.float().mean(1)
        left, right = grey[..., :half].mean((1, 2)), grey[..., -half:].mean((1, 2))
        features = torch.zeros(len(frames), self.dim)
        features[:, :4] = torch.stack([left, right, left - right, left + right], dim=1)
        return features


def _policy(reads_the_image: bool):
    """A discrete CarRacing policy: LEFT where the left half is brighter and RIGHT where the
    right half is (reads_the_image), or LEFT always."""
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(window=4, d_model=16, num_heads=2, topk=2)))
    dim = policy.config.feature_dim
    policy.encoder, policy.core = Halves(dim), PassThrough(dim)
    policy.head = nn.Linear(dim, len(ACTION_NAMES))
    with torch.no_grad():
        policy.head.weight.zero_()
        policy.head.bias.fill_(-10.0)
        if reads_the_image:
            policy.head.weight[LEFT, 2], policy.head.weight[RIGHT, 2] = 100.0, -100.0
        else:
            policy.head.bias[LEFT] = 1.0
    return policy.eval()


def _run(run_dir, episodes=(12, 9), seed=0):
    """Frames whose left or right half is brighter, at random, in episodes of these lengths."""
    rng = np.random.default_rng(seed)
    recorder = RunRecorder(run_dir, action_names=list(ACTION_NAMES))
    for length in episodes:
        recorder.new_episode()
        for step in range(length):
            frame = rng.integers(0, 100, (96, 96, 3), dtype=np.uint8)
            frame[:, :48] += np.uint8(rng.integers(0, 2) * 100)           # the left half brighter, or not
            frame[:, 48:] += np.uint8(rng.integers(0, 2) * 100)
            recorder.add(frame, policy_action=np.array([0]), timestamp=0.02 * step)
    recorder.save()
    return load_trace(run_dir)


def test_the_action_table_mirrors_left_and_right_only():
    mirror = action_mirror(ACTION_NAMES)
    assert mirror[LEFT] == RIGHT and mirror[RIGHT] == LEFT
    assert all(mirror[i] == i for i in range(len(ACTION_NAMES)) if i not in (LEFT, RIGHT))
    frame = np.arange(2 * 3 * 3).reshape(2, 3, 3)
    np.testing.assert_array_equal(mirrored_frame(frame)[:, 0], frame[:, -1])
    np.testing.assert_array_equal(mirrored_frame(mirrored_frame(frame)), frame)


def test_a_symmetric_policy_turns_the_other_way_on_mirrored_frames(tmp_path):
    result = mirror_check(_policy(reads_the_image=True), _run(tmp_path))
    assert result["frames"] == 21 and result["decision"] == "action"
    assert 5 <= result["turn_frames"] <= 21                 # it turns where one half is brighter
    assert result["flips"] == 1.0 and result["stays"] == 0.0
    assert result["mirror_agreement"] == 1.0                # straight stays straight too


def test_a_policy_that_ignores_the_image_keeps_its_turn(tmp_path):
    result = mirror_check(_policy(reads_the_image=False), _run(tmp_path), max_frames=10)
    assert result["frames"] == 10 and result["turn_frames"] == 10      # LEFT always
    assert result["flips"] == 0.0 and result["stays"] == 1.0 and result["mirror_agreement"] == 0.0


def test_the_mirror_check_needs_left_and_right(tmp_path):
    recorder = RunRecorder(tmp_path, action_names=["a", "b"])
    recorder.new_episode()
    recorder.add(np.zeros((96, 96, 3), np.uint8), policy_action=np.array([0]), timestamp=0.0)
    recorder.save()
    with pytest.raises(ValueError, match="left"):
        mirror_check(_policy(True), tmp_path)


def test_the_unit_report_finds_the_planted_swap_pair_and_the_symmetric_units(tmp_path):
    from nac_drive.policy.cores import CoreConfig
    from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru", d_model=8, window=4)))
    policy.encoder, policy.core = Halves(policy.config.feature_dim), PassThrough(policy.config.feature_dim)
    policy.head = nn.Linear(policy.config.feature_dim, len(ACTION_NAMES))
    result = mirror_check(policy.eval(), _run(tmp_path, episodes=(30, 30)))
    core = result["units"]["core"]
    kinds = {row["unit"]: row["kind"] for row in core["units"]}
    assert kinds["y[0]"] == kinds["y[1]"] == "swap" and kinds["y[2]"] == "antisymmetric"
    assert kinds["y[3]"] == "symmetric" and core["counts"]["constant"] == policy.config.feature_dim - 4
    assert [pair[:2] for pair in core["pairs"]] == [["y[0]", "y[1]"]] and min(core["pairs"][0][2:]) > 0.95
    assert {row["unit"]: row["partner"] for row in core["units"]}["y[1]"] == "y[0]"
    assert "heads" not in result["units"] and "core is gru" in result["units_skipped"]["heads"]


def test_a_partner_that_does_not_return_the_match_is_no_swap():
    rng = np.random.default_rng(0)
    intact = rng.normal(size=(500, 3))
    mirrored = np.stack([intact[:, 0], intact[:, 0] + 0.1 * rng.normal(size=500), -intact[:, 2]], axis=1)
    report = unit_partners(intact, mirrored, ["a", "b", "c"])   # b becomes a, but a stays itself
    assert [row["kind"] for row in report["units"]] == ["symmetric", "neither", "antisymmetric"]
    assert report["pairs"] == [] and report["units"][1]["correlation"] > 0.95
    with pytest.raises(ValueError, match="the same"):
        unit_partners(intact, mirrored[:, :2], ["a", "b", "c"])
