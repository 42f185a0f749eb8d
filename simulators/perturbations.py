"""Perturbed CarRacing: what the frames look like to an actor tested, without retraining, on
a changed env (after AttentionAgent's CarRacing variants, Tang, Nguyen & Ha 2020); and, on
every drive of a trained policy, frames that never arrive.

``--perturb NAME[=LEVEL]`` of ``drive carracing`` and ``expert eval`` names one (the
default level, the valid levels):

- ``colour`` (-51; -255..255): the background and grass colours, every channel shifted by
  LEVEL in 0-255 units (clipped); the road, the car and the indicator bar keep theirs
  (CarRacingColor-v0's largest shift, 0.2 of full scale, here darker).
- ``side-bars`` (7; 1..47): vertical black bars LEVEL pixels wide at both sides of the
  96-pixel frame (CarRacingBar-v0's 3/40 of the width).
- ``noise`` (25; 1..255): Gaussian noise of std LEVEL in 0-255 units on every pixel and
  channel of every frame (rounded, clipped).
- ``occlusion`` (16; 1..84): a LEVEL x LEVEL patch of CarRacingBlob-v0's red (204, 0, 0),
  placed once per episode above the indicator bar.
- ``domain-randomize`` (no level): gymnasium's own ``domain_randomize=True``, the road,
  background and grass colours drawn anew at every reset.
- ``frame-drop`` (0.25; 0..0.9, a share): irregular time, ``drive carracing`` and ``drive
  udacity`` only (the drives of a trained policy): on that share of the frames, drawn per track,
  the policy receives nothing and its last action is repeated; the frames that arrive carry
  their real timestamps (:mod:`~nac_drive.simulators.frame_drops`). It changes no env: the
  driver drops the frames (:func:`frame_drops` gives it the schedule).

The colour shift changes the env's own colours (``bg_color``, ``grass_color``) before each
reset draws its first frame, so only the grass is recoloured; the bars, the noise and the
patch are observation transforms of the RGB frame ``uint8 [96, 96, 3]``. Noise and the
patch's place come from a stream seeded by the episode's reset seed, so an episode is
reproducible. gymnasium draws domain-randomize's colours from the generator that then draws
the track, so under it a seed gives another track than in the plain env. Every wrapper
records its arguments, so ``gymnasium.make(env.spec)`` rebuilds the perturbed env;
:func:`apply_perturbation` is the one way callers perturb an env.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from nac_drive.simulators.frame_drops import MAX_SHARE, FrameDrops

FRAME = 96                 # CarRacing's frame: 96 x 96 pixels
INDICATOR_ROWS = 12        # its bottom 12 rows: the black indicator bar (5/40 of the frame)
BLOB_RGB = (204, 0, 0)     # CarRacingBlob-v0's blob: (0.8, 0, 0)

# name -> (default level, lowest, highest), integers but frame-drop's share; None: the perturbation takes no level
PERTURBATIONS: dict[str, tuple[int, int, int] | tuple[float, float, float] | None] = {
    "colour": (-51, -255, 255),
    "side-bars": (7, 1, FRAME // 2 - 1),
    "noise": (25, 1, 255),
    "occlusion": (16, 1, FRAME - INDICATOR_ROWS),
    "domain-randomize": None,
    "frame-drop": (0.25, 0.0, MAX_SHARE),
}
ENV_PERTURBATIONS = ("colour", "side-bars", "noise", "occlusion", "domain-randomize")   # CarRacing's env, any actor
HELP = {"colour": "colour (grass shifted by LEVEL, default -51)",
        "side-bars": "side-bars (LEVEL pixels black at both sides, 7)",
        "noise": "noise (Gaussian std LEVEL, 25)",
        "occlusion": "occlusion (LEVEL-pixel red patch, 16)",
        "domain-randomize": "domain-randomize (gymnasium's, no level)",
        "frame-drop": "frame-drop (a share LEVEL of the frames, drawn per track, never reaches the policy, which "
                      "repeats its last action; 0.25, at most 0.9)"}


def perturb_arg(names: tuple[str, ...] = ENV_PERTURBATIONS):
    """The ``--perturb`` field of a verb that takes the perturbations ``names`` (check it with
    :func:`check_perturb_flag`)."""
    from nac_drive.fields import arg

    listed = [HELP[name] for name in names]
    either = f"{', '.join(listed[:-1])} or {listed[-1]}" if len(listed) > 1 else listed[0]
    return arg(None, f"drive under a perturbation: {either}", metavar="NAME[=LEVEL]")


def check_perturb_flag(text: str | None, names: tuple[str, ...] = ENV_PERTURBATIONS) -> None:
    """Refuse a bad ``--perturb``, or one the verb does not take (not in ``names``), in one line
    that names the flag."""
    if text is not None:
        try:
            parse_perturbation(text, names)
        except ValueError as err:
            raise ValueError(f"--perturb: {err}") from None


def parse_perturbation(text: str, names: tuple[str, ...] = tuple(PERTURBATIONS)) -> tuple[str, int | float | None]:
    """``"side-bars=12"`` -> ``("side-bars", 12)``; ``"noise"`` -> ``("noise", 25)`` (the
    default level); ``"domain-randomize"`` -> ``("domain-randomize", None)``;
    ``"frame-drop=0.5"`` -> ``("frame-drop", 0.5)``. A one-line ValueError names the known
    perturbations (of ``names``, those the caller takes) or the valid levels."""
    name, sep, level_text = str(text).partition("=")
    name = name.strip()
    if name not in names:
        if name in PERTURBATIONS:
            raise ValueError(f"{name} does not apply here; this takes {', '.join(names)}")
        raise ValueError(f"unknown perturbation {name!r}; known: {', '.join(names)}")
    levels = PERTURBATIONS[name]
    if levels is None:
        if sep:
            raise ValueError(f"{name} takes no level (gymnasium's own randomisation), got {text!r}")
        return name, None
    default, low, high = levels
    if not sep:
        return name, default
    number, kind = (float, "a number") if isinstance(default, float) else (int, "an integer")
    try:
        level = number(level_text)
    except ValueError:
        raise ValueError(f"{name}: the level must be {kind} in {low}..{high}, got {level_text!r}") from None
    if not low <= level <= high:   # NaN fails too
        raise ValueError(f"{name}: the level must be {kind} in {low}..{high}, got {level}")
    return name, level


def frame_drops(text: str | None) -> FrameDrops | None:
    """The drop schedule of a ``frame-drop`` perturbation ``text`` (for the driver); None for
    none or another perturbation."""
    if text is None:
        return None
    name, level = parse_perturbation(text)
    return FrameDrops(level) if name == "frame-drop" else None


def perturbation_record(text: str | None) -> dict | None:
    """The summary's ``perturbation``: ``{"name", "level"}`` of ``text``, None for none."""
    if text is None:
        return None
    name, level = parse_perturbation(text)
    return {"name": name, "level": level}


class _EpisodeStream:
    """A random stream restarted by each seeded reset: ``SeedSequence([salt, seed])``, its
    own, apart from the env's ``SeedSequence(seed)``."""

    salt = 0

    def _restart(self, seed: int | None) -> None:
        self.rng = np.random.default_rng([self.salt] if seed is None else [self.salt, int(seed)])


class ColourShift(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """The background and grass colours shifted by ``shift`` in every channel (0-255
    units, clipped to 0..255); the road, the car and the indicators keep theirs.

    Set before each reset, which draws the episode's first frame; the env must not draw its
    own colours (``domain_randomize``)."""

    def __init__(self, env: gym.Env, shift: int = -51):
        gym.utils.RecordConstructorArgs.__init__(self, shift=shift)
        gym.Wrapper.__init__(self, env)
        base = env.unwrapped
        if getattr(base, "domain_randomize", False):
            raise ValueError("ColourShift: the env draws its own colours (domain_randomize); perturb one or the other")
        self.shift = int(shift)
        self._plain = {name: np.array(getattr(base, name), dtype=np.float64) for name in ("bg_color", "grass_color")}
        self._shift_colours()

    def _shift_colours(self) -> None:
        for name, colour in self._plain.items():
            setattr(self.env.unwrapped, name, np.clip(colour + self.shift, 0, 255))

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._shift_colours()
        return self.env.reset(seed=seed, options=options)


class SideBars(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Columns ``[0, width)`` and ``[96 - width, 96)`` of every frame black."""

    def __init__(self, env: gym.Env, width: int = 7):
        gym.utils.RecordConstructorArgs.__init__(self, width=width)
        gym.ObservationWrapper.__init__(self, env)
        if not 1 <= width < FRAME // 2:
            raise ValueError(f"SideBars: width must be in 1..{FRAME // 2 - 1}, got {width}")
        self.width = width

    def observation(self, obs: np.ndarray) -> np.ndarray:
        obs = obs.copy()
        obs[:, :self.width] = 0
        obs[:, -self.width:] = 0
        return obs


class PixelNoise(_EpisodeStream, gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Gaussian noise of std ``std`` (0-255 units) added to every pixel and channel of every
    frame, rounded and clipped to 0..255; the stream restarts at each seeded reset."""

    salt = 1

    def __init__(self, env: gym.Env, std: int = 25):
        gym.utils.RecordConstructorArgs.__init__(self, std=std)
        gym.ObservationWrapper.__init__(self, env)
        if not std > 0:
            raise ValueError(f"PixelNoise: std must be > 0, got {std}")
        self.std = float(std)
        self._restart(None)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._restart(seed)
        return super().reset(seed=seed, options=options)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        noisy = obs + np.rint(self.rng.normal(0.0, self.std, obs.shape))
        return np.clip(noisy, 0, 255).astype(np.uint8)


class Occlusion(_EpisodeStream, gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """A ``size`` x ``size`` patch of ``BLOB_RGB`` over every frame of an episode, its top-left
    corner drawn uniformly per episode so that it stays above the indicator bar (rows
    ``[0, 84)``); the draw restarts at each seeded reset. ``corner``: ``(row, col)`` now."""

    salt = 2

    def __init__(self, env: gym.Env, size: int = 16):
        gym.utils.RecordConstructorArgs.__init__(self, size=size)
        gym.ObservationWrapper.__init__(self, env)
        if not 1 <= size <= FRAME - INDICATOR_ROWS:
            raise ValueError(f"Occlusion: size must be in 1..{FRAME - INDICATOR_ROWS}, got {size}")
        self.size = size
        self._restart(None)
        self.corner = (0, 0)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._restart(seed)
        self.corner = (int(self.rng.integers(FRAME - INDICATOR_ROWS - self.size + 1)),
                       int(self.rng.integers(FRAME - self.size + 1)))
        return super().reset(seed=seed, options=options)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        obs = obs.copy()
        row, col = self.corner
        obs[row:row + self.size, col:col + self.size] = BLOB_RGB
        return obs


WRAPPERS = {"colour": ColourShift, "side-bars": SideBars, "noise": PixelNoise, "occlusion": Occlusion}


def apply_perturbation(env: gym.Env, text: str | None) -> gym.Env:
    """``env`` (CarRacing-v3, maybe wrapped) under the perturbation ``text`` (``NAME[=LEVEL]``,
    :func:`parse_perturbation`; None: ``env`` itself). ``domain-randomize`` is an option of
    the env itself: ``env`` must have been made with it (:func:`randomizes_domain`)."""
    if text is None:
        return env
    name, level = parse_perturbation(text)
    if name == "frame-drop":
        raise ValueError("frame-drop changes no env: the driver drops the frames (PolicyDriver(policy, "
                         "drops=frame_drops(text)))")
    if name == "domain-randomize":
        if not getattr(env.unwrapped, "domain_randomize", False):
            raise ValueError("domain-randomize: make the env with gymnasium's domain_randomize=True")
        return env
    return WRAPPERS[name](env, level)


def randomizes_domain(text: str | None) -> bool:
    """Whether the perturbation ``text`` is gymnasium's ``domain_randomize``, an argument of
    ``gymnasium.make`` rather than a wrapper."""
    return text is not None and parse_perturbation(text)[0] == "domain-randomize"
