"""The scene a CarRacing car is in, read from the track's geometry (not from any policy's actions).

:func:`scene_variables` reads the env's centre line (``env.unwrapped.track``) and the car's
hull through :meth:`~nac_drive.agents.teacher.PurePursuitTeacher.locate` (the teacher's
nearest-point search and track arrays; no second copy of them) and returns, per step, the
scene of :func:`~nac_drive.simulators.centre_line.centre_line_scene` in track units:

* ``curvature``: the mean signed curvature (1 / track units) of the centre line over the
  :data:`CURVE_AHEAD` track units ahead of the car's nearest point; left positive.
* ``cross_track_error``: the teacher's signed distance to the centre line, positive RIGHT of
  it (the trace's existing field and the Udacity emulator's ``cte_m`` convention).
* ``heading_error``: the car's heading minus the track's tangent at its nearest point
  (radians, wrapped to [-pi, pi); positive = the car points left of the road).
* ``speed``: the hull's speed (track units / s).
"""

from __future__ import annotations

import math

from nac_drive.simulators.centre_line import centre_line_scene

CURVE_AHEAD = 40.0   # track units (~3 road widths, ~11 segments): the road the policy's frame shows ahead


def scene_variables(env, reader, distance: float = CURVE_AHEAD) -> dict[str, float]:
    """The scene of ``env``'s current state (module docstring): ``curvature``,
    ``cross_track_error``, ``heading_error``, ``speed`` (floats).

    reader: what reads this env's track and car, with ``locate(env)`` and
    ``cross_track_error(env)``: a :class:`~nac_drive.agents.teacher.PurePursuitTeacher` (the
    driving loop's oracle, so the scene and the expert's action share one nearest-point search;
    passed in, as agents sit a layer above the simulators)."""
    pose, index, headings, lengths = reader.locate(env)
    car_heading = math.atan2(float(pose.forward[1]), float(pose.forward[0]))
    return centre_line_scene(headings, lengths, index, car_heading, reader.cross_track_error(env), pose.speed,
                             distance)
