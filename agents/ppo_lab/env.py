"""CarRacing as the PPO expert sees it: gymnasium wrappers, and the SB3 VecEnv of training.

The expert acts every ``action_repeat`` env frames on a stack of its last ``frame_stack``
observations, each the frame in grey, area-resized to ``frame_size`` x ``frame_size``
(:class:`Preprocessing`; its zip records it). One gymnasium stack serves everyone:

    CarRacing-v3 [-> DiscreteActions] -> ActionRepeat -> GrayObservation -> FrameStackObservation (zero padding)

observations ``uint8 [frame_stack, frame_size, frame_size]``, what the SB3 policy takes.
A stable-baselines3 user drives an expert zip with :func:`make_expert_env` and
``PPO.load(zip).predict``; training adds its own wrappers around the same stack
(:func:`make_vec_env`); :class:`~nac_drive.agents.ppo_expert.PPOExpert` feeds raw frames
through the same observation wrappers. Every wrapper can be rebuilt from ``env.spec``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np

from nac_drive.agents.ppo_lab.training_args import ACTION_REPEAT, FRAME_SIZE, FRAME_STACK
from nac_drive.fields import in_unit_interval
from nac_drive.simulators.carracing import DISCRETE_GAS, ActionRepeat, ConsecutiveTrackSeeds, make_carracing

GRAYSCALE = "cv2.COLOR_RGB2GRAY"    # the only colour conversion this package applies
INTERPOLATION = "cv2.INTER_AREA"    # the only resize it applies
MIN_FRAME_SIZE, MAX_FRAME_SIZE = 36, 256   # SB3's NatureCNN needs >= 36 pixels
MAX_FRAME_STACK, MAX_ACTION_REPEAT = 64, 100


@dataclass(frozen=True)
class Preprocessing:
    """What the expert's policy sees, and how its actions reach the env: recorded as JSON
    in its zip (``data["preprocessing"]``, a key SB3 ignores), read back by
    ``Preprocessing(**record)``, which checks it. ``gas``: what a discrete expert's GAS
    presses (``DISCRETE_GAS``: gymnasium's discrete env; more: :class:`DiscreteActions`)."""

    frame_size: int = FRAME_SIZE
    frame_stack: int = FRAME_STACK
    action_repeat: int = ACTION_REPEAT
    grayscale: str = GRAYSCALE
    interpolation: str = INTERPOLATION
    gas: float = DISCRETE_GAS

    def __post_init__(self):
        for name, low, high in (("frame_size", MIN_FRAME_SIZE, MAX_FRAME_SIZE),
                                ("frame_stack", 1, MAX_FRAME_STACK), ("action_repeat", 1, MAX_ACTION_REPEAT)):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= high):
                raise ValueError(f"{name} is {value!r}, expected an integer in {low}..{high}")
        for name, only in (("grayscale", GRAYSCALE), ("interpolation", INTERPOLATION)):
            if getattr(self, name) != only:
                raise ValueError(f"{name} is {getattr(self, name)!r}; this package applies only {only!r}")
        if not in_unit_interval(self.gas):
            raise ValueError(f"gas is {self.gas!r}, expected a number in (0, 1]")

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def observation_shape(self) -> tuple[int, int, int]:
        """Shape of the policy's observation: ``(frame_stack, frame_size, frame_size)``."""
        return (self.frame_stack, self.frame_size, self.frame_size)


def preprocess(rgb: np.ndarray, size: int = FRAME_SIZE) -> np.ndarray:
    """RGB ``uint8 [H, W, 3]`` -> grey ``uint8 [size, size]`` (cv2, area resize)."""
    import cv2

    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"preprocess: expected uint8 [H, W, 3] RGB, got {rgb.dtype} {rgb.shape}")
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    return cv2.resize(gray, (size, size), interpolation=cv2.INTER_AREA)


class GrayObservation(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Observation -> :func:`preprocess`: ``uint8 [size, size]``."""

    def __init__(self, env: gym.Env, size: int = FRAME_SIZE):
        gym.utils.RecordConstructorArgs.__init__(self, size=size)
        gym.ObservationWrapper.__init__(self, env)
        self.size = size
        self.observation_space = gym.spaces.Box(0, 255, (size, size), np.uint8)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        return preprocess(obs, self.size)


class NegativeRewardTruncation(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Training only: end the episode after ``patience`` consecutive agent steps with
    reward < 0 (no new road tile: stuck on the grass, or driving back along the road).

    The end is a truncation, which PPO bootstraps with the value of the last state.
    """

    def __init__(self, env: gym.Env, patience: int = 25):
        gym.utils.RecordConstructorArgs.__init__(self, patience=patience)
        gym.Wrapper.__init__(self, env)
        self.patience = patience
        self._streak = 0

    def reset(self, **kwargs):
        self._streak = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._streak = self._streak + 1 if reward < 0 else 0
        if self._streak >= self.patience and not terminated:
            truncated = True
            info["negative_reward_streak"] = True
        return obs, reward, terminated, truncated, info


def observe_as_expert(env: gym.Env, preprocessing: Preprocessing) -> gym.Env:
    """``env``'s RGB frames as the expert's policy takes them: grey frames stacked,
    ``uint8 [frame_stack, frame_size, frame_size]``, zeros before the first (as SB3's
    VecFrameStack)."""
    env = GrayObservation(env, preprocessing.frame_size)
    return gym.wrappers.FrameStackObservation(env, preprocessing.frame_stack, padding_type="zero")


def make_expert_env(preprocessing: Preprocessing = Preprocessing(), continuous: bool = False, *,
                    skip_render: bool = False, render_mode: str | None = None,
                    track_stride: int | None = None, patience: int | None = None,
                    teacher_labels: bool = False) -> gym.Env:
    """CarRacing-v3 as the expert sees it (gymnasium only): its GAS (discrete), action repeat,
    grey, frame stack.

    Training adds ``track_stride`` (evaluation: :class:`ConsecutiveTrackSeeds`),
    ``teacher_labels`` (kickstarted PPO:
    :class:`~nac_drive.agents.ppo_lab.kickstarted_ppo.TeacherLabels`) and ``patience``
    (:class:`NegativeRewardTruncation`) below the observation wrappers, and ``skip_render``
    (frames the agent never sees are not drawn; same observations)."""
    env = make_carracing(continuous=continuous, render_mode=render_mode, gas=preprocessing.gas)
    if track_stride:
        env = ConsecutiveTrackSeeds(env, stride=track_stride)
    env = ActionRepeat(env, preprocessing.action_repeat, skip_render=skip_render)
    if teacher_labels:
        from nac_drive.agents.ppo_lab.kickstarted_ppo import TeacherLabels

        env = TeacherLabels(env)
    if patience:
        env = NegativeRewardTruncation(env, patience)
    return observe_as_expert(env, preprocessing)


def make_vec_env(continuous: bool, n_envs: int = 1, preprocessing: Preprocessing = Preprocessing(),
                 patience: int | None = None, skip_render: bool = True, reward_gamma: float | None = None,
                 teacher_labels: bool = False):
    """:func:`make_expert_env` as an SB3 VecEnv of observations
    ``uint8 [n_envs, frame_stack, frame_size, frame_size]``, each env under SB3's Monitor
    (``info["episode"]``: the episode's return in raw env reward). ``patience``: see
    :class:`NegativeRewardTruncation` (training only; ``None``: no such end);
    ``teacher_labels``: each step's info has the teacher's label (kickstarted PPO).

    ``reward_gamma`` normalises rewards with that discount (training); ``None`` leaves them
    as the env gives them (evaluation), and an evaluation env seeded with ``s`` drives the
    tracks ``s, s + 1, ...`` (:class:`ConsecutiveTrackSeeds`; worker i the tracks
    ``s + i, s + i + n_envs, ...``), those of ``expert eval --seed-base s``. Both kinds
    have the same VecEnv wrappers, so PPO's evaluation callback accepts them as one env type.
    """
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

    def worker() -> gym.Env:
        return Monitor(make_expert_env(preprocessing, continuous, skip_render=skip_render, patience=patience,
                                       track_stride=n_envs if reward_gamma is None else None,
                                       teacher_labels=teacher_labels))

    venv = SubprocVecEnv([worker] * n_envs) if n_envs > 1 else DummyVecEnv([worker])
    if reward_gamma is None:
        return VecNormalize(venv, training=False, norm_obs=False, norm_reward=False)
    return VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=reward_gamma)
