"""Every gymnasium wrapper of the package passes gymnasium's own ``check_env`` and is
rebuilt by ``gymnasium.make(env.spec)`` (issue 21). The list below is checked against the
wrapper classes found in the installed package, so a new wrapper fails here until it has
a case (and ``gymnasium.utils.RecordConstructorArgs``)."""

from __future__ import annotations

import importlib
import pkgutil
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import nac_drive
from nac_drive.agents.expert_env import GrayObservation, NegativeRewardTruncation, Preprocessing, make_expert_env
from nac_drive.data_collection.episode_recorder import RecordEpisodes
from nac_drive.simulators.carracing import ActionBursts, ActionRepeat, ConsecutiveTrackSeeds, make_carracing
from nac_drive.simulators.udacity_env import SpeedControl

# Each project wrapper around the env it serves, with arguments that make it act.
WRAPPED = {
    ActionRepeat: lambda: ActionRepeat(make_carracing(), 3, skip_render=True),
    ConsecutiveTrackSeeds: lambda: ConsecutiveTrackSeeds(make_carracing(), stride=2),
    ActionBursts: lambda: ActionBursts(make_carracing(), rate=0.2, burst_frames=3, seed=5),
    GrayObservation: lambda: GrayObservation(make_carracing(), 40),
    NegativeRewardTruncation: lambda: NegativeRewardTruncation(make_carracing(continuous=True), patience=2),
    RecordEpisodes: lambda: RecordEpisodes(make_carracing(), fps=50),
    SpeedControl: lambda: SpeedControl(gym.make("nac_drive/UdacityEmulator-v0", track="gentle"), speed_mph=12.0),
}
STACKS = {**{cls.__name__: make for cls, make in WRAPPED.items()},
          # the PPO expert's whole stack, training's extras included
          "expert env": lambda: make_expert_env(Preprocessing(frame_stack=3, action_repeat=2), track_stride=2,
                                                patience=5, skip_render=True)}


def _package_wrappers() -> set[type]:
    """Every gymnasium wrapper class defined in the installed nac_drive package."""
    for module in pkgutil.walk_packages(nac_drive.__path__, "nac_drive."):
        importlib.import_module(module.name)
    found, todo = set(), [gym.Wrapper]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("nac_drive."):
                found.add(sub)
    return found


def test_every_package_wrapper_has_a_case_here():
    found = _package_wrappers()
    assert {ActionRepeat, GrayObservation, RecordEpisodes} <= found   # the walk sees all three folders
    assert found == set(WRAPPED), f"wrappers without a case: {sorted(c.__name__ for c in found - set(WRAPPED))}"
    assert all(issubclass(cls, gym.utils.RecordConstructorArgs) for cls in found)


def _layers(env: gym.Env) -> list[str]:
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def _episode(env: gym.Env, seed: int, steps: int = 12) -> list:
    """Observations, rewards, ends and info keys of ``steps`` seeded random actions."""
    actions = gym.spaces.Discrete(5, seed=seed) if isinstance(env.action_space, gym.spaces.Discrete) else None
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    seen = [obs]
    for _ in range(steps):
        action = actions.sample() if actions is not None else env.action_space.sample()
        obs, reward, terminated, truncated, info = env.step(action)
        seen += [obs, reward, terminated, truncated, sorted(info)]
        if terminated or truncated:
            obs, _ = env.reset()
            seen.append(obs)
    return seen


@pytest.mark.parametrize("name", list(STACKS))
def test_wrapper_passes_check_env_and_is_rebuilt_from_its_spec(name):
    env = STACKS[name]()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # e.g. "wrapped env": these are wrappers by design
            check_env(env)
        rebuilt = gym.make(env.spec)
        try:
            assert rebuilt.spec == env.spec and _layers(rebuilt) == _layers(env)
            for first, second in zip(_episode(env, 7), _episode(rebuilt, 7), strict=True):
                np.testing.assert_equal(first, second)
        finally:
            rebuilt.close()
    finally:
        env.close()
