"""The scene a car in the Udacity emulator is in, read from its track's geometry.

:func:`scene_variables` reads an emulator env's own objects (``env.unwrapped``'s ``track``,
``car`` and ``progress``: :class:`~nac_drive.simulators.udacity_env.UdacityEmulatorEnv`) and
returns the scene of :func:`~nac_drive.simulators.centre_line.centre_line_scene` in metres,
as CarRacing's (:mod:`~nac_drive.simulators.carracing_scene`) is in track units:

* ``curvature``: the centre line's mean signed curvature (1/m) over the :data:`CURVE_AHEAD`
  metres ahead of the car's nearest point; left positive in the direction of travel (the
  track's own ``curvature`` convention; a track runs counter-clockwise, its mean +2 pi /
  length, ~+0.01, and its ``-cw`` twin clockwise, the same curves negated: right ones).
* ``cross_track_error``: the emulator's ``cte`` (``info["cte_m"]``, the telemetry's
  ``cte``): metres, positive RIGHT of the centre line, as CarRacing's.
* ``heading_error``: the car's heading minus the centre line's tangent at its nearest point
  (radians, wrapped to [-pi, pi); positive = the car points left of the road).
* ``speed``: the car's speed (m/s; the telemetry's ``speed`` is in mph).

Only the in-process emulator knows these: the Unity simulator's telemetry carries none of
them, so a trace driven through the bridge records NaN there.
"""

from __future__ import annotations

from nac_drive.simulators.centre_line import centre_line_scene

CURVE_AHEAD = 24.0   # m: 3 widths of the 8 m road, as CarRacing's 40 units are 3 of its road's; ~6 s at 9 mph


def scene_variables(env, distance: float = CURVE_AHEAD) -> dict[str, float]:
    """The scene of the emulator env ``env``'s current state (module docstring):
    ``curvature``, ``cross_track_error``, ``heading_error``, ``speed`` (floats)."""
    base = env.unwrapped
    track, car, progress = base.track, base.car, base.progress
    return centre_line_scene(track.segment_headings, track.segment_lengths, progress.index, car.heading,
                             progress.cte, car.speed, distance)
