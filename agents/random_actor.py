"""The random policy of offline-RL reference scores (Minari's ``ref_min_score``): uniform
actions from the env's action space, reproducible per track."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np

from nac_drive.policy.tasks import DISCRETE_GAS


class RandomActor:
    """Samples every action uniformly from the env's action space (one of the 5 discrete
    actions, or uniform (steer, gas, brake)), as Minari's own random policy does.

    Actor interface ``reset()``, ``reset_env(env)``, ``act(obs)``. Each episode draws from
    a stream seeded by ``seed`` and the track's seed (the seed of the env's last reset),
    so a track's episode is the same whatever ran before it, in any process. ``gas``: what
    GAS presses in the discrete env it drives (read by
    :func:`~nac_drive.simulators.carracing.actor_gas`).
    """

    def __init__(self, continuous: bool, seed: int = 0, gas: float = DISCRETE_GAS):
        self.continuous, self.seed, self.gas = continuous, seed, gas
        self.name = "random" if continuous else "random-discrete"
        self._space: gym.Space | None = None

    def reset(self) -> None:
        pass

    def reset_env(self, env: gym.Env) -> None:
        self._space = copy.deepcopy(env.action_space)   # never draws from the env's own space
        entropy = [self.seed, int(env.unwrapped.np_random_seed)]
        self._space.seed(int(np.random.SeedSequence(entropy).generate_state(1)[0]))

    def act(self, obs: np.ndarray | None = None):
        if self._space is None:
            raise RuntimeError("RandomActor.act: call reset_env(env) first")
        return self._space.sample()
