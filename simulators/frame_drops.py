"""Irregular time: the frames a driving policy never receives (``--perturb frame-drop=P`` of the
drives, ``train --frame-drop P``).

On a share P of an episode's frames the policy gets nothing: the simulator steps on with the
policy's last action, and the next frame that arrives carries its real timestamp, so the
policy's window of its last W frames spans more time. Which frames arrive is one uniform draw
per frame from ``numpy.random.default_rng([SALT, *seed])``, restarted at each episode with the
episode's seed (the track's reset seed): a frame is dropped when its draw is below P, except the
episode's first frame, which always arrives. So a drive with drops and one without are paired
(the same tracks), a seed gives the same schedule every time, and P = 0 drops nothing.

The closed loop asks :class:`FrameDrops` frame by frame (:class:`~nac_drive.agents.driver.PolicyDriver`,
which every drive of a trained policy goes through); training draws the same schedule over a
whole recorded episode and cuts its windows from the frames that arrived (:func:`window_frames`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

SALT = 3          # the schedule's stream, apart from the env's and the other perturbations' (noise 1, occlusion 2)
MAX_SHARE = 0.9   # past it a window of 16 frames would span 160 frames and more


def check_share(share: float) -> float:
    """``share`` as a float in [0, MAX_SHARE]; anything else refused in one line."""
    try:
        value = float(share)
    except (TypeError, ValueError):
        raise ValueError(f"frame-drop: the share of dropped frames must be a number in 0..{MAX_SHARE}, "
                         f"got {share!r}") from None
    if not 0.0 <= value <= MAX_SHARE:   # NaN fails too
        raise ValueError(f"frame-drop: the share of dropped frames must be a number in 0..{MAX_SHARE}, got {share!r}")
    return value


class FrameDrops:
    """Which frames of an episode reach the policy: :meth:`restart` at each episode, then one
    :meth:`delivers` per frame (or :meth:`schedule` for many at once, the same stream)."""

    def __init__(self, share: float):
        self.share = check_share(share)
        self.restart(None)

    def restart(self, seed: int | Sequence[int] | None) -> None:
        """A new episode, its schedule drawn from ``seed`` (None: a fixed stream of its own);
        its first frame arrives."""
        key = [] if seed is None else [int(s) for s in np.atleast_1d(seed)]
        self._rng = np.random.default_rng([SALT, *key])
        self._first = True

    def delivers(self) -> bool:
        """Whether the episode's next frame reaches the policy."""
        return bool(self.schedule(1)[0])

    def schedule(self, frames: int) -> np.ndarray:
        """bool ``[frames]``: whether each of the episode's next ``frames`` frames reaches the
        policy, as that many calls of :meth:`delivers` would say."""
        delivered = self._rng.random(frames) >= self.share
        if self._first and frames:
            delivered[0], self._first = True, False
        return delivered


def window_frames(share: float, seed: Sequence[int], length: int, start: int, window: int) -> np.ndarray:
    """The frames (positions ``[window]``, increasing) of the training window that starts at
    ``start`` of a ``length``-frame episode, when a share ``share`` of the episode's frames is
    dropped by the schedule of ``seed``.

    ``share`` 0: the ``window`` consecutive frames from ``start``. Otherwise the episode's
    windows are the runs of ``window`` consecutive frames that arrived, as the policy's window
    is in closed loop, and the ``length - window + 1`` window starts are spread evenly over
    them, so each is drawn about equally often. An episode where fewer than ``window`` frames
    arrived keeps its regular windows."""
    regular = np.arange(start, start + window)
    if share == 0:
        return regular
    drops = FrameDrops(share)
    drops.restart(seed)
    arrived = np.flatnonzero(drops.schedule(length))
    runs = len(arrived) - window + 1
    if runs < 1:
        return regular
    return arrived[start * runs // (length - window + 1):][:window]
