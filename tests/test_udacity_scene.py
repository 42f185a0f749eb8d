"""Scene variables read from the Udacity emulator's track geometry: known answers on a circular
track and on the emulator's own tracks (curvature left positive, the cte positive right, the
heading error positive left), and a traced emulator drive that records them."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from nac_drive.simulators.centre_line import curvature_ahead
from nac_drive.simulators.udacity_env import UdacityEmulatorEnv
from nac_drive.simulators.udacity_scene import CURVE_AHEAD, scene_variables
from nac_drive.simulators.udacity_track import MPH_PER_MPS, Car, Progress, Track, TrackSpec, track_spec

torch.set_num_threads(1)


def _placed(track: Track, s: float, left: float = 0.0, turn: float = 0.0, speed: float = 0.0):
    """An env-like object: the car ``left`` metres left of the centre line at arc length ``s``,
    turned ``turn`` radians left of the line, at ``speed`` m/s, its progress updated there."""
    i = int(round(s / track.length * len(track.points))) % len(track.points)
    x, y = track.points[i] + left * track.normals[i]
    heading = math.atan2(track.tangents[i, 1], track.tangents[i, 0]) + turn
    progress = Progress(track, index=i)
    progress.update(x, y)
    return SimpleNamespace(unwrapped=SimpleNamespace(track=track, car=Car(x=x, y=y, heading=heading, speed=speed),
                                                     progress=progress))


@pytest.mark.parametrize("radius", [30.0, 90.0])
def test_a_circular_track_has_curvature_one_over_r_left_positive(radius):
    circle = Track(TrackSpec("circle", seed=0, radius=radius, amplitude=0.0))   # driven counter-clockwise: left
    scene = scene_variables(_placed(circle, 40.0, speed=4.0))
    assert scene["curvature"] == pytest.approx(1.0 / radius, rel=1e-3)
    assert scene["heading_error"] == pytest.approx(0.0, abs=1e-9)
    assert scene["cross_track_error"] == pytest.approx(0.0, abs=1e-9) and scene["speed"] == 4.0


@pytest.mark.parametrize("left", [-2.5, -0.5, 1.0, 3.0])
def test_the_cte_is_positive_right_of_the_centre_line(left):
    track = Track(TrackSpec("circle", seed=0, radius=60.0, amplitude=0.0))
    scene = scene_variables(_placed(track, 100.0, left=left))
    assert scene["cross_track_error"] == pytest.approx(-left, abs=1e-9)   # the emulator's cte: + right, as CarRacing's
    assert scene["heading_error"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("turn", [-2.0, -0.3, 0.2, 1.0, 3.0])
def test_a_car_turned_left_by_theta_has_heading_error_theta(turn):
    track = Track(TrackSpec("circle", seed=0, radius=60.0, amplitude=0.0))
    assert scene_variables(_placed(track, 100.0, turn=turn))["heading_error"] == pytest.approx(turn, abs=1e-9)


def test_a_cw_track_has_right_curves_where_its_twin_has_left_ones():
    """random-900000 (explain's first held-out track) has no right curve at the road scale's
    threshold (radius <= 60 m); its -cw twin, driven clockwise, has one at each of its left ones."""
    from nac_drive.interpret.road_scenes import ROAD_SCALES, road_sides

    ccw, cw = Track(track_spec("random-900000")), Track(track_spec("random-900000-cw"))
    along = np.arange(0.0, ccw.length, 2.0)                                          # every 2 m of a lap
    # the car 1 m left of the line, turned 0.1 rad left: in the direction of travel, whichever way round
    scenes = [[scene_variables(_placed(track, s, left=1.0, turn=0.1, speed=4.0)) for s in along] for track in (ccw, cw)]
    curvature = np.array([[scene["curvature"] for scene in track] for track in scenes])   # [2, steps] 1/m
    np.testing.assert_allclose(curvature[1], -curvature[0], atol=1e-9)
    sides = [road_sides(c, ROAD_SCALES["udacity"].curve) for c in curvature]             # -1 left, +1 right curve
    assert (sides[0] == 1).sum() == 0 and (sides[0] == -1).mean() > 0.1
    np.testing.assert_array_equal(sides[1], -sides[0])
    for track in scenes:
        assert all(scene["cross_track_error"] == pytest.approx(-1.0, abs=1e-6) for scene in track)   # + right
        assert all(scene["heading_error"] == pytest.approx(0.1, abs=1e-6) for scene in track)        # + left


def test_on_an_emulator_track_the_curvature_ahead_is_the_tracks_own():
    env = UdacityEmulatorEnv(track="serpentine", jpeg_quality=None)
    track = env.track
    spacing, n = track.length / len(track.points), len(track.points)
    points_ahead = np.arange(1, int(round(CURVE_AHEAD / spacing)) + 1)            # the vertices over 24 m
    for sharpest, sign in ((int(np.argmin(track.curvature)), -1), (int(np.argmax(track.curvature)), +1)):
        env.reset(options={"start": float(track.s[sharpest])})                     # on the centre line, along it
        scene = scene_variables(env)
        own = float(track.curvature[(sharpest + points_ahead) % n].mean())        # the track's curvature, 1/m
        assert np.sign(scene["curvature"]) == sign and scene["curvature"] == pytest.approx(own, rel=0.02)
        assert scene["cross_track_error"] == 0.0 and scene["heading_error"] == pytest.approx(0.0, abs=1e-6)
    for _ in range(20):                                                            # full right lock from the left bend
        env.step((1.0, 1.0))
    scene = scene_variables(env)
    assert scene["heading_error"] < -0.1 and scene["cross_track_error"] > 0.1    # it points and drifts right
    assert scene["cross_track_error"] == env.progress.cte and scene["speed"] == pytest.approx(env.car.speed)


def test_a_traced_emulator_drive_records_the_scene(tmp_path):
    from nac_drive.interpret.trace import SCENE_FIELDS, load_trace
    from nac_drive.pipeline.drive import drive_udacity_emulator

    drive = drive_udacity_emulator(tracks=["lakeside"], frames=40, trace_dir=tmp_path / "run", progress=False)
    run = load_trace(drive["trace"])
    assert run.num_steps == 40 and run.has_scene
    for name in SCENE_FIELDS:
        assert np.isfinite(getattr(run, name)).all(), name
    start = Track(track_spec("lakeside"))
    expected = curvature_ahead(start.segment_headings, start.segment_lengths, 0, CURVE_AHEAD)
    assert expected < -0.01 and run.curvature[0] == pytest.approx(expected, rel=1e-5)   # lakeside starts in a right bend
    set_speed = 9.0 / MPH_PER_MPS                                                      # m/s: the bridge's 9 mph
    assert run.speed[0] == 0.0 and 0.5 * set_speed < run.speed[-1] < 1.2 * set_speed
    assert np.abs(run.heading_error).max() < 0.1 and np.abs(run.cross_track_error).max() < 0.5   # the shipped policy
