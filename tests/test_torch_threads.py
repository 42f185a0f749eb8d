"""How many torch threads a job runs on: the control loops drive on one and put the count back;
loading a policy leaves it alone (a notebook that loads one keeps its threads for training)."""

import torch

from nac_drive.pipeline.drive import udacity_emulator_env, udacity_emulator_episodes
from nac_drive.policy.loading import load_driving_policy
from nac_drive.simulators.carracing import EVAL_SEED_BASE, run_episodes
from nac_drive.torch_threads import torch_threads


class ThreadsSeen:
    """An actor that notes torch's thread count at each step (it steers straight ahead)."""

    def __init__(self, action):
        self.action, self.seen = action, []

    def reset(self):
        pass

    def reset_env(self, env):
        pass

    def act(self, obs):
        self.seen.append(torch.get_num_threads())
        return self.action


def test_loading_a_policy_leaves_the_threads_alone():
    with torch_threads(2):
        load_driving_policy()
        assert torch.get_num_threads() == 2


def test_both_control_loops_drive_on_one_thread_and_restore_the_count():
    with torch_threads(2):
        car = ThreadsSeen(0)   # CarRacing's discrete "nothing"
        run_episodes(car, [EVAL_SEED_BASE], max_steps=3)
        assert car.seen == [1, 1, 1] and torch.get_num_threads() == 2
        udacity = ThreadsSeen(0.0)
        udacity_emulator_episodes(udacity, [udacity_emulator_env("random-900000")], frames=3)
        assert udacity.seen == [1, 1, 1] and torch.get_num_threads() == 2
