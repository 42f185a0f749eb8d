"""A car's scene on a closed centre line (a polyline), in the line's own length unit: what
CarRacing's (:mod:`~nac_drive.simulators.carracing_scene`, track units) and the Udacity
emulator's (:mod:`~nac_drive.simulators.udacity_scene`, metres) scenes share.

:func:`centre_line_scene` returns, for a car nearest to point ``index`` of the line:

* ``curvature``: the line's mean signed curvature (1 / length unit) over ``distance`` ahead
  (:func:`curvature_ahead`); left (counter-clockwise, seen from above) positive: a circle of
  radius R driven counter-clockwise gives +1/R.
* ``cross_track_error``: the signed distance to the line, positive RIGHT of it (given: each
  simulator measures it).
* ``heading_error``: the car's heading minus the line's tangent at ``index``
  (:func:`tangent_heading`; radians, wrapped to [-pi, pi); positive = the car points left of
  the road).
* ``speed``: the car's speed (given; length units / s).
"""

from __future__ import annotations

import math

import numpy as np


def wrap_angle(angle: float) -> float:
    """``angle`` (radians) wrapped to [-pi, pi)."""
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


def segments(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(headings, lengths), ``[N]`` each, of the segments of the closed polyline ``points``
    ``[N, 2]``: segment i runs from point i to point i + 1 (the last back to point 0);
    headings in radians, counter-clockwise from +x."""
    step = np.roll(points, -1, axis=0) - points
    return np.arctan2(step[:, 1], step[:, 0]), np.linalg.norm(step, axis=1)


def curvature_ahead(headings: np.ndarray, lengths: np.ndarray, index: int, distance: float) -> float:
    """Mean signed curvature (left positive) of a closed polyline over ``distance`` ahead of
    point ``index``: the summed wrapped heading changes from segment ``index`` to the segment
    ``m`` further, over the arc length between the two segments' midpoints, where ``m`` is the
    smallest count of segments whose length covers ``distance``.

    headings, lengths: ``[N]`` each segment's direction (radians) and length (:func:`segments`)."""
    n = len(headings)
    ahead = (index + np.arange(n + 1)) % n                                  # segments from index on, one lap
    covered = np.cumsum(lengths[ahead[1:]])                                 # [n] length of segments 1..j ahead
    m = min(int(np.searchsorted(covered, distance)) + 1, n)
    turns = np.angle(np.exp(1j * np.diff(headings[ahead[:m + 1]])))        # [m] wrapped changes at each vertex
    arc = float(covered[m - 1] - lengths[ahead[m]] / 2.0 + lengths[index % n] / 2.0)
    return float(turns.sum()) / max(arc, 1e-9)


def tangent_heading(headings: np.ndarray, index: int) -> float:
    """The centre line's direction (radians) at point ``index`` of ``headings`` ``[N]``: the
    circular mean of the two segments that meet there."""
    before, after = headings[(index - 1) % len(headings)], headings[index % len(headings)]
    return float(np.angle(np.exp(1j * before) + np.exp(1j * after)))


def centre_line_scene(headings: np.ndarray, lengths: np.ndarray, index: int, car_heading: float,
                      cross_track_error: float, speed: float, distance: float) -> dict[str, float]:
    """The scene (module docstring) of a car heading ``car_heading`` (radians, counter-clockwise
    from +x) nearest to point ``index`` of the line of ``headings`` and ``lengths`` ``[N]``
    (:func:`segments`), the curvature averaged over ``distance`` ahead: ``curvature``,
    ``cross_track_error``, ``heading_error``, ``speed`` (floats)."""
    return {"curvature": curvature_ahead(headings, lengths, index, distance),
            "cross_track_error": float(cross_track_error),
            "heading_error": wrap_angle(car_heading - tangent_heading(headings, index)),
            "speed": float(speed)}
