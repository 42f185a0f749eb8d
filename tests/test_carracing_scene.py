"""Scene variables read from CarRacing's track geometry: known answers on synthetic tracks,
and plausible values on a real drive."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from nac_drive.agents.teacher import PurePursuitTeacher
from nac_drive.simulators.carracing_scene import scene_variables
from nac_drive.simulators.centre_line import curvature_ahead, wrap_angle


class _Vec(SimpleNamespace):
    pass


class _Hull:
    """A Box2D hull's reads the teacher uses: position, GetWorldVector, linearVelocity."""

    def __init__(self, x, y, angle, velocity=(0.0, 0.0)):
        self.position, self.angle = _Vec(x=x, y=y), angle
        self.linearVelocity = _Vec(x=velocity[0], y=velocity[1])

    def GetWorldVector(self, local):
        c, s = math.cos(self.angle), math.sin(self.angle)
        return _Vec(x=local[0] * c - local[1] * s, y=local[0] * s + local[1] * c)


def _env(points, x, y, heading, velocity=(0.0, 0.0)):
    """A fake env: centre line ``points`` [N, 2], the car at (x, y) pointing along ``heading``
    (radians, counter-clockwise from +x; a Box2D car's forward is its local +y)."""
    track = [(0.0, 0.0, float(px), float(py)) for px, py in points]
    car = SimpleNamespace(hull=_Hull(x, y, heading - math.pi / 2, velocity))
    return SimpleNamespace(unwrapped=SimpleNamespace(track=track, car=car))


def _circle(radius, n=300, clockwise=False):
    angles = np.linspace(0.0, 2 * math.pi, n, endpoint=False) * (-1 if clockwise else 1)
    return radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)


def _straight(n=200, step=3.5):
    # a long thin loop: its near side is straight for hundreds of units
    return np.concatenate([np.stack([np.arange(n) * step, np.zeros(n)], 1),
                           np.stack([np.arange(n)[::-1] * step, np.full(n, 50.0)], 1)])


def test_a_straight_track_has_no_curvature_and_a_car_along_it_no_heading_error():
    scene = scene_variables(_env(_straight(), 100.0, 0.0, 0.0, velocity=(30.0, 40.0)), PurePursuitTeacher())
    assert scene["curvature"] == pytest.approx(0.0, abs=1e-12)
    assert scene["heading_error"] == pytest.approx(0.0, abs=1e-12)
    assert scene["cross_track_error"] == pytest.approx(0.0, abs=1e-9)
    assert scene["speed"] == pytest.approx(50.0)


@pytest.mark.parametrize("radius", [25.0, 80.0, 200.0])
@pytest.mark.parametrize("clockwise", [False, True])
def test_a_circle_of_radius_r_has_curvature_one_over_r_left_positive(radius, clockwise):
    points = _circle(radius, clockwise=clockwise)
    x, y = points[37]
    tangent = math.atan2(*(points[38] - points[36])[::-1])
    scene = scene_variables(_env(points, x, y, tangent), PurePursuitTeacher())
    sign = -1.0 if clockwise else 1.0          # counter-clockwise = turning left
    assert scene["curvature"] == pytest.approx(sign / radius, rel=1e-3)
    assert scene["heading_error"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("theta", [-2.5, -0.3, 0.0, 0.2, 1.0, 3.0])
def test_a_car_rotated_by_theta_has_heading_error_theta(theta):
    points = _circle(60.0)
    x, y = points[100]
    tangent = math.atan2(*(points[101] - points[99])[::-1])
    scene = scene_variables(_env(points, x, y, tangent + theta), PurePursuitTeacher())
    assert scene["heading_error"] == pytest.approx(theta, abs=1e-9)


def test_curvature_ahead_wraps_headings_across_pi():
    # segments turning left through the +-pi seam: headings 3.0, 3.1, -3.13 ...
    headings = np.array([3.0, 3.1, 3.2 - 2 * math.pi, 3.3 - 2 * math.pi, 3.4 - 2 * math.pi])
    assert curvature_ahead(headings, np.ones(5), 0, distance=3.0) == pytest.approx(0.3 / 3.0)
    assert wrap_angle(math.pi + 0.1) == pytest.approx(-math.pi + 0.1)


def test_the_teacher_drives_with_small_heading_error_and_finite_curvature():
    from nac_drive.simulators.carracing import make_carracing

    env = make_carracing(continuous=True)
    env.reset(seed=900001)
    teacher = PurePursuitTeacher(continuous=True)
    teacher.reset()
    scenes = []
    for _ in range(150):
        scenes.append(scene_variables(env, teacher))
        env.step(teacher.action_for(env))
    env.close()
    curvature = np.array([s["curvature"] for s in scenes])
    heading_error = np.array([s["heading_error"] for s in scenes])
    assert np.isfinite(curvature).all() and np.abs(curvature).max() < 0.2   # sharpest bends: radius > 5 units
    assert np.median(np.abs(heading_error)) < 0.15 and np.abs(heading_error).max() < 0.8
    assert np.array([s["speed"] for s in scenes])[-50:].mean() > 10


def test_a_traced_carracing_drive_records_the_scene_and_an_older_trace_loads_without_it(tmp_path):
    from nac_drive.interpret.archive import write_archive
    from nac_drive.interpret.trace import SCENE_FIELDS, load_trace
    from nac_drive.pipeline.drive import DriveArgs, drive_carracing

    drive = drive_carracing(DriveArgs(episodes=1, max_steps=120, trace=str(tmp_path / "run")), progress=False)
    run = load_trace(drive["trace"])
    assert run.num_steps == 120 and run.has_scene
    for name in SCENE_FIELDS:
        assert np.isfinite(getattr(run, name)).all(), name
    assert np.abs(run.curvature).max() < 0.2                        # 1/units: no bend sharper than radius 5
    assert np.all(np.abs(run.heading_error) <= math.pi)
    assert np.median(np.abs(run.heading_error)) < 0.3               # the shipped policy follows the road
    assert run.speed[-30:].mean() > run.speed[0]                    # it sets off from standstill
    assert np.isfinite(run.cross_track_error).all()

    chunk = next((tmp_path / "run" / "trace").glob("chunk-*.npz"))   # as written before the scene existed
    with np.load(chunk, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k not in (*SCENE_FIELDS, "metadata.json")}
        metadata = json.loads(bytes(z["metadata.json"]).decode()) if "metadata.json" in z.files else None
    assert metadata is not None
    write_archive(chunk, arrays, metadata)
    old = load_trace(tmp_path / "run")
    assert not old.has_scene and all(np.isnan(getattr(old, name)).all() for name in SCENE_FIELDS)
    np.testing.assert_array_equal(old.cross_track_error, run.cross_track_error)
