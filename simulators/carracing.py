"""CarRacing-v3: the env factory, an action-repeat wrapper and the episode runner.

Every command that scores an actor on CarRacing (``expert eval``, ``drive``,
``quickstart``) goes through :func:`run_episodes`, so they all count returns, laps
and latency the same way.

Seed ranges: a track is a pure function of the reset seed, so the project keeps the
seeds of each stage in disjoint ranges and a held-out track can never leak into
training or collection.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from nac_drive.policy.actor import Actor
from nac_drive.fields import in_unit_interval
from nac_drive.simulators.episode_stats import SUCCESS_RETURN, format_return_stats, return_stats
from nac_drive.simulators.road_drawing import draw_faster
from nac_drive.policy.tasks import DISCRETE_GAS
from nac_drive.io.video import WebmWriter
from nac_drive.torch_threads import torch_threads

ENV_ID = "CarRacing-v3"
MAX_EPISODE_FRAMES = 1000  # CarRacing-v3's own time limit (env frames at 50 FPS)
FPS = 50
VIDEO_SCALE = 2   # video frames: the 96x96 observations upscaled (nearest); the encoder costs ~4x the CPU at 4x

# Discrete action ids of CarRacing-v3.
NOOP, RIGHT, LEFT, GAS, BRAKE = 0, 1, 2, 3, 4
ACTION_NAMES = ("noop", "right", "left", "gas", "brake")

# Seed ranges (disjoint): expert training and its checkpoint selection use
# [0, 100_000); demonstrations [100_000, 800_000); validation (tune, choosing a checkpoint)
# [800_000, 900_000); held-out evaluation >= 900_000.
EXPERT_TRAIN_SEED_BASE = 0
COLLECT_SEED_BASE = 100_000
VALIDATION_SEED_BASE = 800_000
EVAL_SEED_BASE = 900_000
NUM_EVAL_TRACKS = 20  # by default the held-out tracks are EVAL_SEED_BASE .. EVAL_SEED_BASE + 19
# Headline figures: `--episodes 100`, the held-out tracks EVAL_SEED_BASE .. EVAL_SEED_BASE + 99.


# Returns on the held-out tracks 900000..900019, per track, measured with
# `nac-drive expert eval --expert NAME --episodes 20 --json` (a row `NAME-gas0.3`: with
# `--gas 0.3`): the random policy and the privileged teacher of each action type. Their
# means are the reference scores (0 and 1) of Minari's `get_normalized_score` for the
# datasets nac-drive writes in that env.
REFERENCE_RETURNS: dict[str, tuple[float, ...]] = {
    "random-discrete": (-56.95, -61.29, -58.48, -62.38, -54.25, -56.99, -64.63, -56.81, -64.05, -60.73,
                        -55.39, -57.24, -61.64, -57.93, -45.85, -53.02, -60.53, -54.95, -52.86, -50.0),
    "teacher-discrete": (911.3, 904.8, 906.9, 846.71, 905.7, 909.9, 867.85, 907.6, 908.0, 833.53,
                         927.8, 906.0, 727.4, 907.1, 915.7, 916.5, 903.1, 848.95, 912.6, 912.0),
    "random": (-37.09, -35.48, -30.8, -40.44, -37.91, -31.9, -38.91, -33.55, -37.91, -39.58,
               -25.65, -34.21, -45.21, -35.28, -27.8, -32.89, -37.5, -42.94, -32.66, -32.14),
    "teacher": (907.0, 901.6, 911.0, 834.17, 906.1, 905.8, 809.97, 904.9, 907.2, 812.39,
                931.0, 907.8, 724.66, 909.4, 903.1, 917.5, 901.4, 737.84, 907.0, 903.6),
}


def _reference_name(actor: str, continuous: bool, gas: float) -> str:
    """The :data:`REFERENCE_RETURNS` row of ``actor`` ("random" or "teacher") in that env."""
    return actor if continuous else f"{actor}-discrete" + ("" if gas == DISCRETE_GAS else f"-gas{gas!r}")


def reference_scores(continuous: bool, gas: float = DISCRETE_GAS) -> tuple[float, float, int] | None:
    """(random policy's mean return, teacher's mean return, tracks) on the held-out tracks in
    that env; None for a gas whose references were not measured."""
    low, high = (REFERENCE_RETURNS.get(_reference_name(actor, continuous, gas)) for actor in ("random", "teacher"))
    if low is None or high is None:
        return None
    return float(np.mean(low)), float(np.mean(high)), len(low)


def eval_seeds(n: int = NUM_EVAL_TRACKS, base: int = EVAL_SEED_BASE) -> list[int]:
    """The seeds of the first ``n`` held-out evaluation tracks."""
    if n < 1:
        raise ValueError(f"eval_seeds: n must be >= 1, got {n}")
    return list(range(base, base + n))


def make_carracing(
    seed: int | None = None,
    continuous: bool = False,
    render_mode: str | None = None,
    max_episode_steps: int = MAX_EPISODE_FRAMES,
    domain_randomize: bool = False,
    lap_complete_percent: float = 0.95,
    gas: float = DISCRETE_GAS,
    perturb: str | None = None,
) -> gym.Env:
    """Create CarRacing-v3.

    With ``seed`` the env is reset once with it (and the action space seeded), so the
    env's track generator is in a reproducible state; later ``reset()`` calls without a
    seed then give the same sequence of tracks for the same ``seed``. Observations are
    raw RGB frames, ``uint8 [96, 96, 3]``, the stock env's pixels drawn ~3x faster
    (:func:`~nac_drive.simulators.road_drawing.draw_faster`). ``gas`` other than ``DISCRETE_GAS``: the 5
    discrete actions with that GAS (:class:`DiscreteActions` on the continuous env).
    ``perturb``: ``NAME[=LEVEL]``, the env under that perturbation
    (:mod:`~nac_drive.simulators.perturbations`).
    """
    from nac_drive.simulators.perturbations import apply_perturbation, randomizes_domain

    if render_mode == "human":
        # CarRacing blits pygame surfaces: an OpenGL-backed window buys nothing, and Mesa's
        # driver would put its libLLVM in the global namespace, where a later `import triton`
        # (torch._dynamo, e.g. loading an expert zip) segfaults.
        os.environ.setdefault("SDL_FRAMEBUFFER_ACCELERATION", "0")
    other_gas = gas != DISCRETE_GAS
    if continuous and other_gas:
        raise ValueError(f"gas {gas!r}: only discrete actions have a fixed gas (the continuous env's is the action's)")
    env = gym.make(
        ENV_ID,
        continuous=continuous or other_gas,
        render_mode=render_mode,
        max_episode_steps=max_episode_steps,
        domain_randomize=domain_randomize or randomizes_domain(perturb),
        lap_complete_percent=lap_complete_percent,
        disable_env_checker=True,  # a stock env; the checker also rejects skipped frames
    )
    draw_faster(env)
    if other_gas:
        env = DiscreteActions(env, gas)
    env = apply_perturbation(env, perturb)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def action_wrappers(spec: gym.envs.registration.EnvSpec) -> tuple:
    """The wrapper specs of ``spec`` that set what its actions do (:class:`DiscreteActions`)."""
    return tuple(w for w in spec.additional_wrappers if w.name == DiscreteActions.__name__)


def spec_action_args(spec: gym.envs.registration.EnvSpec) -> tuple[bool, float]:
    """``(continuous, gas)`` of the CarRacing env ``spec`` rebuilds: the arguments of
    :func:`make_carracing` that choose its actions. ``ValueError`` if the spec's
    :class:`DiscreteActions` has no valid gas (a spec read from a file)."""
    wrappers = action_wrappers(spec)
    if not wrappers:
        return bool(spec.kwargs.get("continuous", True)), DISCRETE_GAS
    kwargs = wrappers[0].kwargs
    gas = kwargs.get("gas") if isinstance(kwargs, dict) else None
    if not in_unit_interval(gas):
        raise ValueError(f"env spec: wrapper {DiscreteActions.__name__} has gas {str(gas)[:50]}, expected a "
                         "number in (0, 1]")
    return False, float(gas)


def actor_gas(actor: Actor) -> float:
    """What GAS presses in the env ``actor`` drives: its ``gas`` (a PPO expert's zip, a
    policy's config.json), else gymnasium's."""
    return getattr(actor, "gas", DISCRETE_GAS)


class DiscreteActions(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """CarRacing's 5 discrete actions on the continuous env, with GAS pressing ``gas``.

    Each action is the (steer, gas, brake) the discrete env applies (steer 0.6 right or
    left, brake 0.8), except that GAS presses ``gas`` instead of ``DISCRETE_GAS``. The
    discrete env's weak gas is what keeps its laps slow: the privileged teacher, unchanged,
    finishes more laps in time with a stronger one (BENCHMARKS.md). With ``gas=DISCRETE_GAS``
    it drives exactly as the discrete env (tested).
    """

    def __init__(self, env: gym.Env, gas: float = DISCRETE_GAS):
        gym.utils.RecordConstructorArgs.__init__(self, gas=gas)
        gym.ActionWrapper.__init__(self, env)
        if not in_unit_interval(gas):
            raise ValueError(f"DiscreteActions: gas must be a number in (0, 1], got {gas!r}")
        if getattr(env.unwrapped, "continuous", None) is not True:
            raise ValueError("DiscreteActions: wrap the continuous env (CarRacing-v3 with continuous=True)")
        self.gas = float(gas)
        self.action_space = gym.spaces.Discrete(5)
        # float64: the continuous env steps in float64, so these equal the discrete env's values
        self._controls = np.array([[0.0, 0.0, 0.0], [0.6, 0.0, 0.0], [-0.6, 0.0, 0.0],
                                   [0.0, self.gas, 0.0], [0.0, 0.0, 0.8]])

    def action(self, action) -> np.ndarray:
        if not self.action_space.contains(action):
            raise ValueError(f"DiscreteActions: action {action!r} is not one of 0..4")
        return self._controls[int(action)]


class ActionRepeat(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Repeat each action ``repeat`` env frames, summing the rewards.

    ``skip_render=True`` skips drawing the observation of the frames in between (the
    agent never sees them); the returned observation is drawn normally, so it is
    identical to the stock env's (tested). Drawing costs most of a step, so this
    made training ~2-3x faster (measured with the stock road drawing, before
    :mod:`~nac_drive.simulators.road_drawing`). With a render mode every frame is drawn (the
    renderer shows them all), so there it has no effect.
    """

    def __init__(self, env: gym.Env, repeat: int = 4, skip_render: bool = False):
        gym.utils.RecordConstructorArgs.__init__(self, repeat=repeat, skip_render=skip_render)
        gym.Wrapper.__init__(self, env)
        if repeat < 1:
            raise ValueError(f"ActionRepeat: repeat must be >= 1, got {repeat}")
        self.repeat = repeat
        self.skip_render = skip_render and env.render_mode is None

    def step(self, action):
        """Returns the last frame's ``info`` with ``info["frames"]``: env frames stepped."""
        base = self.env.unwrapped
        drawing = base.__dict__.get("_render")   # the env's own drawing (road_drawing's), if it has one
        total = 0.0
        for i in range(self.repeat):
            last = i == self.repeat - 1
            if self.skip_render and not last:
                base._render = _no_render  # instance attribute shadows the method
            try:
                obs, reward, terminated, truncated, info = self.env.step(action)
            finally:
                if drawing is not None:
                    base._render = drawing
                elif self.skip_render:
                    base.__dict__.pop("_render", None)
            total += float(reward)
            if terminated or truncated:
                break
        if obs is None:  # the episode ended on a frame that was not drawn
            obs = base._render("state_pixels")
            base.state = obs
        return obs, total, terminated, truncated, {**info, "frames": i + 1}


def _no_render(mode: str) -> None:
    return None


class ConsecutiveTrackSeeds(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """A reset given no seed takes the next one: after ``reset(seed=s)`` the following
    episodes run on tracks ``s + stride``, ``s + 2 * stride``, ...

    An SB3 VecEnv seeds its envs only at their first reset (env i with ``s + i``) and then
    resets them without a seed, so its later episodes would run on tracks drawn from the
    generator's stream. With this wrapper and ``stride`` = the number of envs, an evaluation
    seeded with ``s`` drives the tracks ``s, s + 1, ...`` that :func:`run_episodes` drives
    for ``eval_seeds(n, base=s)``.
    """

    def __init__(self, env: gym.Env, stride: int = 1):
        gym.utils.RecordConstructorArgs.__init__(self, stride=stride)
        gym.Wrapper.__init__(self, env)
        if stride < 1:
            raise ValueError(f"ConsecutiveTrackSeeds: stride must be >= 1, got {stride}")
        self.stride = stride
        self._next_seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed = self._next_seed
        if seed is not None:
            self._next_seed = int(seed) + self.stride
        return self.env.reset(seed=seed, options=options)


class ActionBursts(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Random-action bursts for DAgger (after DART, Laskey et al. 2017, which disturbs the
    demonstrator instead): in each undisturbed frame a burst starts with probability
    ``rate``, and one random action then replaces the agent's for ``burst_frames`` frames,
    so a share ``F p / (F p + 1 - p)`` of the frames is disturbed (9% at p 0.01, F 10).

    The agent still sees every frame; only what the car does changes. A student that
    drives well rarely leaves the road by itself, so without disturbances its teacher
    would label few recoveries. The burst's action is uniform over the action space: one of
    the 5 discrete actions, or uniform (steer, gas, brake) for the continuous env.
    ``info["disturbed"]`` says whether the frame's action was replaced. The bursts of an
    episode depend only on ``seed`` and the episode's ``reset`` seed.
    """

    def __init__(self, env: gym.Env, rate: float, burst_frames: int = 10, seed: int = 0):
        gym.utils.RecordConstructorArgs.__init__(self, rate=rate, burst_frames=burst_frames, seed=seed)
        gym.Wrapper.__init__(self, env)
        if not 0.0 <= rate <= 1.0 or burst_frames < 1:
            raise ValueError(f"ActionBursts: rate must be in [0, 1] and burst_frames >= 1, "
                             f"got {rate} and {burst_frames}")
        self.rate, self.burst_frames, self.base_seed = rate, burst_frames, seed
        self._burst_space = copy.deepcopy(env.action_space)  # never draws from the env's own space
        self._burst_left, self._burst_action = 0, None
        self._reseed(None)

    def _reseed(self, episode_seed: int | None) -> None:
        # a stream of its own: SeedSequence([seed, episode_seed]) differs from the env's SeedSequence(episode_seed)
        entropy = [self.base_seed] if episode_seed is None else [self.base_seed, episode_seed]
        self.rng = np.random.default_rng(entropy)
        self._burst_space.seed(int(self.rng.integers(2**31)))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._reseed(seed)
        self._burst_left = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if self._burst_left == 0 and self.rng.random() < self.rate:
            self._burst_left, self._burst_action = self.burst_frames, self._burst_space.sample()
        disturbed = self._burst_left > 0
        if disturbed:
            action, self._burst_left = self._burst_action, self._burst_left - 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "disturbed": disturbed}


@dataclass
class EpisodeResults:
    """Per-episode outcomes of :func:`run_episodes` and per-frame actor latency."""

    seeds: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # env frames
    laps: list[bool] = field(default_factory=list)  # lap finished (terminated by the env)
    latencies_ms: list[float] = field(default_factory=list)  # one per act() call

    def extend(self, other: "EpisodeResults") -> None:
        """Append ``other``'s episodes and latencies (one run driven in parts)."""
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))

    def summary(self, success_at: float = SUCCESS_RETURN) -> dict[str, Any]:
        """Aggregate figures; the JSON line of every evaluating command. The returns' figures
        (mean, its 95% interval, worst, success rate at ``success_at`` with its interval) are
        :func:`~nac_drive.simulators.episode_stats.return_stats`."""
        lat = np.asarray(self.latencies_ms, dtype=np.float64)
        return {
            **return_stats(self.returns, success_at),
            "laps_finished": int(sum(self.laps)),
            "laps": [bool(lap) for lap in self.laps],
            "seeds": [int(s) for s in self.seeds],
            "returns": [round(float(r), 2) for r in self.returns],
            "lengths": [int(n) for n in self.lengths],
            "latency_ms_p50": float(np.percentile(lat, 50)) if lat.size else float("nan"),
            "latency_ms_p95": float(np.percentile(lat, 95)) if lat.size else float("nan"),
        }

    def format(self, success_at: float = SUCCESS_RETURN) -> str:
        """One human-readable line."""
        s = self.summary(success_at)
        latency = f", actor latency p50 {s['latency_ms_p50']:.3f} ms" if self.latencies_ms else ""
        return (f"{s['episodes']} episodes: {format_return_stats(s)}, laps finished {s['laps_finished']}/"
                f"{s['episodes']}{latency}")


StepCallback = Callable[[int, int, np.ndarray, Any, float, dict], None]


@torch_threads(1)   # a forward on one frame is fastest on one thread
def run_episodes(
    actor: Actor,
    seeds: Sequence[int],
    continuous: bool = False,
    max_steps: int | None = None,
    render_mode: str | None = None,
    on_step: StepCallback | None = None,
    video_path: str | Path | None = None,
    env: gym.Env | None = None,
    progress: bool | str = False,
    gas: float | None = None,
    perturb: str | None = None,
) -> EpisodeResults:
    """Drive ``actor`` for one episode per seed and collect the results.

    ``max_steps`` caps each episode (env frames; default: the env's 1000).
    ``on_step(episode, frame, obs, action, reward, info)`` is called after each frame,
    with the ``obs`` the actor saw. ``video_path`` writes all episodes to one WebM (VP8,
    one video frame per env frame, upscaled ``VIDEO_SCALE`` times). ``env`` reuses an
    existing env (its ``continuous`` must match). ``progress``: show a progress bar (a
    string: labelled with it). ``gas``: see :func:`make_carracing` (default: the actor's own,
    :func:`actor_gas`). ``perturb``: the perturbation every actor drives under (see
    :func:`make_carracing`; the video shows the frames as perturbed). It runs on one torch thread,
    the count of before restored after.
    """
    own_env = env is None
    if not own_env and perturb is not None:
        raise ValueError("run_episodes: give the perturbation to the env you pass (make_carracing(perturb=...))")
    if own_env:
        env = make_carracing(continuous=continuous, render_mode=render_mode,
                             gas=actor_gas(actor) if gas is None else gas, perturb=perturb)
    writer = WebmWriter(video_path, FPS, scale=VIDEO_SCALE) if video_path else None
    results = EpisodeResults()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(seeds), desc=progress if isinstance(progress, str) else "episodes", unit="ep")
    try:
        for ep, seed in enumerate(seeds):
            obs, info = env.reset(seed=int(seed))
            actor.reset()
            if hasattr(actor, "reset_env"):
                actor.reset_env(env)
            total, frames, lap = 0.0, 0, False
            while True:
                t0 = time.perf_counter()
                action = actor.act(obs)
                results.latencies_ms.append((time.perf_counter() - t0) * 1e3)
                if writer:
                    writer.write(obs)
                next_obs, reward, terminated, truncated, info = env.step(action)
                total += float(reward)
                frames += 1
                if on_step:
                    on_step(ep, frames - 1, obs, action, float(reward), info)
                obs = next_obs
                if terminated:
                    # CarRacing sets info["lap_finished"] on termination: True when the
                    # lap is complete, False when the car left the playfield.
                    lap = bool(info.get("lap_finished", False))
                if terminated or truncated or (max_steps is not None and frames >= max_steps):
                    break
            results.seeds.append(int(seed))
            results.returns.append(total)
            results.lengths.append(frames)
            results.laps.append(lap)
            if bar:
                bar.update(1)
                bar.set_postfix(ret=f"{total:.0f}")
    finally:
        if bar:
            bar.close()
        if writer:
            writer.close()
        if own_env:
            env.close()
    return results
