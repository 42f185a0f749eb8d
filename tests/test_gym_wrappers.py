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
from nac_drive.agents.ppo_lab.env import GrayObservation, NegativeRewardTruncation, Preprocessing, make_expert_env
from nac_drive.agents.ppo_lab.kickstarted_ppo import TeacherLabels
from nac_drive.data_collection.episode_recorder import RecordEpisodes
from nac_drive.simulators.carracing import (
    DISCRETE_GAS,
    GAS,
    ActionBursts,
    ActionRepeat,
    ConsecutiveTrackSeeds,
    DiscreteActions,
    make_carracing,
)
from nac_drive.simulators.perturbations import ColourShift, Occlusion, PixelNoise, SideBars
from nac_drive.simulators.udacity_env import SpeedControl

# Each project wrapper around the env it serves, with arguments that make it act.
WRAPPED = {
    ActionRepeat: lambda: ActionRepeat(make_carracing(), 3, skip_render=True),
    ConsecutiveTrackSeeds: lambda: ConsecutiveTrackSeeds(make_carracing(), stride=2),
    ActionBursts: lambda: ActionBursts(make_carracing(), rate=0.2, burst_frames=3, seed=5),
    DiscreteActions: lambda: DiscreteActions(make_carracing(continuous=True), gas=0.5),
    GrayObservation: lambda: GrayObservation(make_carracing(), 40),
    NegativeRewardTruncation: lambda: NegativeRewardTruncation(make_carracing(continuous=True), patience=2),
    RecordEpisodes: lambda: RecordEpisodes(make_carracing(), fps=50),
    TeacherLabels: lambda: TeacherLabels(make_carracing()),
    ColourShift: lambda: ColourShift(make_carracing(), shift=40),
    SideBars: lambda: SideBars(make_carracing(), width=5),
    PixelNoise: lambda: PixelNoise(make_carracing(), std=10),
    Occlusion: lambda: Occlusion(make_carracing(), size=8),
    SpeedControl: lambda: SpeedControl(gym.make("nac_drive/UdacityEmulator-v0", track="gentle"), speed_mph=12.0),
}
STACKS = {**{cls.__name__: make for cls, make in WRAPPED.items()},
          # the PPO expert's whole stack, training's extras included
          "expert env": lambda: make_expert_env(Preprocessing(frame_stack=3, action_repeat=2), track_stride=2,
                                                patience=5, skip_render=True, teacher_labels=True),
          "expert env, stronger gas": lambda: make_expert_env(Preprocessing(action_repeat=2, gas=0.5))}


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


def test_discrete_actions_drive_as_the_discrete_env_until_gas_is_stronger():
    """At ``DISCRETE_GAS`` the wrapper is gymnasium's discrete env, frame for frame; a
    stronger gas only changes how hard GAS accelerates."""
    actions = np.random.default_rng(0).integers(0, 5, 200)
    actions[:60] = GAS

    def drive(env):
        env.reset(seed=70_000)
        steps = [env.step(int(a))[:2] for a in actions]
        return steps, np.array(env.unwrapped.car.hull.position)

    stock, same = drive(make_carracing()), drive(DiscreteActions(make_carracing(continuous=True), DISCRETE_GAS))
    for (obs, reward), (obs2, reward2) in zip(stock[0], same[0], strict=True):
        assert reward == reward2 and np.array_equal(obs, obs2)
    np.testing.assert_array_equal(stock[1], same[1])

    def speed_after_gas(env):
        env.reset(seed=70_000)
        for _ in range(60):
            env.step(GAS)
        return env.unwrapped.car.hull.linearVelocity.length

    stronger = make_carracing(gas=0.5)
    assert isinstance(stronger, DiscreteActions) and type(make_carracing()) is not DiscreteActions
    assert speed_after_gas(stronger) > 1.5 * speed_after_gas(make_carracing())
    with pytest.raises(ValueError, match="action 5 is not one of 0..4"):
        stronger.step(5)
    with pytest.raises(ValueError, match="only discrete actions have a fixed gas"):
        make_carracing(continuous=True, gas=0.5)
    with pytest.raises(ValueError, match="wrap the continuous env"):
        DiscreteActions(make_carracing(), 0.5)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="gas must be a number in"):
            DiscreteActions(make_carracing(continuous=True), bad)
