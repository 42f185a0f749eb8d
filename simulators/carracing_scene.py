"""The scene a CarRacing car is in, read from the track's geometry (not from any policy's actions).

:func:`scene_variables` reads the env's centre line (``env.unwrapped.track``) and the car's
hull through :meth:`~nac_drive.agents.teacher.PurePursuitTeacher.locate` (the teacher's
nearest-point search and track arrays; no second copy of them) and returns, per step:

* ``curvature``: the mean signed curvature (1 / track units) of the centre line over the
  :data:`CURVE_AHEAD` track units ahead of the car's nearest point: the heading change from
  its segment to the segment that far ahead divided by the arc length between their
  midpoints. Left (counter-clockwise, seen from above) positive; a circle of radius R driven
  counter-clockwise gives +1/R.
* ``cross_track_error``: the teacher's signed distance to the centre line, positive RIGHT of
  it (the trace's existing field and the Udacity emulator's ``cte_m`` convention).
* ``heading_error``: the car's heading minus the track's tangent at its nearest point
  (radians, wrapped to [-pi, pi); positive = the car points left of the road).
* ``speed``: the hull's speed (track units / s).
"""

from __future__ import annotations

import math

import numpy as np

CURVE_AHEAD = 40.0   # track units (~3 road widths, ~11 segments): the road the policy's frame shows ahead
SCENE_FIELDS = ("curvature", "cross_track_error", "heading_error", "speed")


def wrap_angle(angle: float) -> float:
    """``angle`` (radians) wrapped to [-pi, pi)."""
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


def curvature_ahead(headings: np.ndarray, lengths: np.ndarray, index: int, distance: float = CURVE_AHEAD) -> float:
    """Mean signed curvature (left positive) of a closed polyline over ``distance`` ahead of
    point ``index``: the summed wrapped heading changes from segment ``index`` to the segment
    ``m`` further, over the arc length between the two segments' midpoints, where ``m`` is the
    smallest count of segments whose length covers ``distance``.

    headings, lengths: ``[N]`` each segment's direction (radians) and length (segment i runs
    from point i to point i + 1, the last back to point 0)."""
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


def scene_variables(env, reader, distance: float = CURVE_AHEAD) -> dict[str, float]:
    """The scene of ``env``'s current state (module docstring): ``curvature``,
    ``cross_track_error``, ``heading_error``, ``speed`` (floats).

    reader: what reads this env's track and car, with ``locate(env)`` and
    ``cross_track_error(env)``: a :class:`~nac_drive.agents.teacher.PurePursuitTeacher` (the
    driving loop's oracle, so the scene and the expert's action share one nearest-point search;
    passed in, as agents sit a layer above the simulators)."""
    pose, index, headings, lengths = reader.locate(env)
    car_heading = math.atan2(float(pose.forward[1]), float(pose.forward[0]))
    return {"curvature": curvature_ahead(headings, lengths, index, distance),
            "cross_track_error": float(reader.cross_track_error(env)),
            "heading_error": wrap_angle(car_heading - tangent_heading(headings, index)),
            "speed": float(pose.speed)}
