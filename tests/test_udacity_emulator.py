"""Emulator internals: procedural tracks, renderer, car model, progress; and a slow closed loop
through the bridge with a policy that steers from the lane markings it sees."""

import math
import subprocess
import sys
import time

import numpy as np
import pytest

from nac_drive.simulators.udacity_emulator import ScriptedDriver, format_number
from nac_drive.simulators.udacity_track import (
    TRACKS,
    Car,
    Progress,
    Renderer,
    Track,
    pure_pursuit,
    track_spec,
)


@pytest.fixture(scope="module")
def lakeside():
    return Track(track_spec("lakeside"))


@pytest.mark.parametrize("name", sorted(TRACKS) + ["random-11", "canyon-cw", "random-11-cw"])
def test_tracks_are_closed_drivable_loops(name):
    tr = Track(track_spec(name))
    assert np.linalg.norm(tr.points[0] - tr.points[-1]) < 1.0  # closed
    assert np.abs(tr.curvature).max() <= 1 / tr.spec.min_turn_radius + 1e-6
    if name != "gentle":  # curves in both directions
        assert tr.curvature.min() < -0.01 and tr.curvature.max() > 0.01


def test_tracks_differ_by_name_and_unknown_names_are_rejected():
    a, b = Track(track_spec("lakeside")), Track(track_spec("canyon"))
    assert abs(a.length - b.length) > 5
    with pytest.raises(ValueError, match="unknown track"):
        track_spec("monaco")


def _winding(xy: np.ndarray) -> float:
    """Turns (signed, counter-clockwise positive) that the path ``xy`` [N, 2] makes round the origin."""
    angle = np.unwrap(np.arctan2(xy[:, 1], xy[:, 0]))
    return float(angle[-1] - angle[0]) / (2 * math.pi)


@pytest.mark.parametrize("name", ["lakeside", "random-900001"])
def test_a_cw_track_is_its_twin_mirrored_and_driven_clockwise(name):
    ccw, cw = Track(track_spec(name)), Track(track_spec(name + "-cw"))
    assert not ccw.spec.clockwise and cw.spec.clockwise and cw.spec.name == name + "-cw"
    np.testing.assert_allclose(cw.points, ccw.points * (1, -1), atol=1e-9)   # y -> -y, point for point
    assert cw.length == pytest.approx(ccw.length)
    assert _winding(ccw.points) == pytest.approx(1, abs=0.01) and _winding(cw.points) == pytest.approx(-1, abs=0.01)
    # along the direction of travel: the same radii, each left curve a right one
    np.testing.assert_allclose(cw.curvature, -ccw.curvature, atol=1e-9)
    assert cw.curvature.min() == pytest.approx(-ccw.curvature.max()) and ccw.curvature.max() > 1 / 60
    np.testing.assert_allclose(cw.segment_headings, -ccw.segment_headings, atol=1e-9)
    x, y, heading = cw.pose_at(0.0)   # the start: the twin's pose mirrored, facing clockwise along the line
    x0, y0, heading0 = ccw.pose_at(0.0)
    assert (x, y, heading) == pytest.approx((x0, -y0, -heading0))
    with pytest.raises(ValueError, match="unknown track"):
        track_spec(name + "-cw-cw")


def test_a_cw_tracks_frames_are_its_twins_flipped_left_right():
    ccw, cw = Track(track_spec("lakeside")), Track(track_spec("lakeside-cw"))
    x, y, heading = ccw.pose_at(40)
    frame = Renderer(ccw).render(x, y, heading).astype(int)
    mirrored = Renderer(cw).render(x, -y, -heading).astype(int)
    # column u mirrors to 320 - u about the camera's centre (cx = 160): compare columns 1..319
    assert np.abs(mirrored[:, 1:] - frame[:, :0:-1]).mean() < 0.05
    assert np.abs(mirrored - frame).mean() > 1.0   # not merely alike: lakeside at 40 m is no symmetric scene


def test_positive_steering_turns_right():
    car = Car(speed=5.0)
    for _ in range(15):
        car.step(0.5, 0.0, 1 / 15)
    assert car.y < -0.1 and car.heading < 0  # heading 0 = +x; right = -y


def test_throttle_accelerates_and_negative_throttle_brakes():
    car = Car()
    for _ in range(60):
        car.step(0.0, 1.0, 1 / 15)
    fast = car.speed_mph
    assert 10 < fast <= 30
    for _ in range(15):
        car.step(0.0, -1.0, 1 / 15)
    assert car.speed_mph < fast / 2


def test_progress_counts_laps_cross_track_and_off_road(lakeside):
    tr = lakeside
    p = Progress(tr)
    n = len(tr.points)
    for k in range(0, 2 * n + 20, 7):  # drive the centre line twice, 1 m to the right
        x, y = tr.points[k % n] - 1.0 * tr.normals[k % n]
        p.update(x, y)
    assert p.laps == 2 and p.cte == pytest.approx(1.0, abs=0.05) and p.off_road_events == 0
    x, y = tr.points[10] + (tr.half_width + 1) * tr.normals[10]
    p.update(x, y)
    assert p.off_road and p.off_road_events == 1 and p.cte < -tr.half_width


def test_render_is_fast_and_shows_sky_road_and_grass(lakeside):
    r = Renderer(lakeside)
    x, y, h = lakeside.pose_at(40)
    img = r.render(x, y, h)
    assert img.shape == (160, 320, 3) and img.dtype == np.uint8
    b, g, rr = (img[..., c].astype(int) for c in range(3))
    assert (b[5] > rr[5]).all()  # sky (BGR): blue on top
    row = 75  # ahead of the car, below the horizon
    assert g[row, 5] - rr[row, 5] > 20 and g[row, -5] - rr[row, -5] > 20  # grass at both sides
    assert abs(b[row, 160] - rr[row, 160]) < 20  # grey asphalt in the middle
    assert (img[row] > 200).all(axis=1).sum() >= 2  # white edge lines
    t0 = time.perf_counter()
    for k in range(50):
        r.render(*lakeside.pose_at(40 + k))
    assert (time.perf_counter() - t0) / 50 < 0.02  # a few ms per frame (20 ms bound for a busy CI)


@pytest.mark.parametrize("name", ["lakeside", "lakeside-cw"])
def test_pure_pursuit_drives_a_lap(name):
    tr = Track(track_spec(name))
    car = Car(*tr.pose_at(0))
    p = Progress(tr)
    while p.travelled < tr.length and len(p.abs_cte) < 5000:
        car.step(pure_pursuit(tr, car, p.index), 0.3 * (9 - car.speed_mph), 1 / 15)
        p.update(car.x, car.y)
    assert p.laps == 1 and p.off_road_events == 0 and max(p.abs_cte) < 0.5


@pytest.mark.parametrize("name", ["random-900001", "random-900001-cw"])
def test_the_scripted_driver_laps_either_way_round_near_the_centre_line(name):
    """The recordings' driver, its steering noise on: a lap the way the track runs, its cte
    (positive right) wandering to both sides and back."""
    tr = Track(track_spec(name))
    car, p = Car(*tr.pose_at(0)), Progress(tr)
    driver = ScriptedDriver(tr, noise=0.3, seed=1)
    path, signed = [], []
    while p.travelled < tr.length and len(path) < 5000:
        _, steer, throttle = driver.act(car, p.index)
        car.step(steer, throttle, 1 / 15)
        p.update(car.x, car.y)
        path.append((car.x, car.y))
        signed.append(p.cte)
    assert p.laps == 1 and p.off_road_events == 0 and max(p.abs_cte) < 1.5 and np.mean(p.abs_cte) < 0.6
    assert min(signed) < -0.1 and max(signed) > 0.1
    assert _winding(np.array(path)) == pytest.approx(-1 if tr.spec.clockwise else 1, abs=0.02)


def test_numbers_are_formatted_like_the_simulator():
    assert format_number(12.34567) == "12.3457"
    assert format_number(-0.5, decimal_comma=True) == "-0,5000"


@pytest.mark.slow
def test_closed_loop_lane_following_through_the_bridge_stays_on_the_road():
    pytest.importorskip("socketio")
    pytest.importorskip("websocket")
    from support.udacity_procs import free_port, start_bridge

    from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

    port = free_port()
    bridge = start_bridge(port, "nac_drive.agents.udacity_scripted:LaneMarkingPolicy")
    try:
        report = run_emulator(EmulatorConfig(port=port, track="serpentine", laps=1.0, frames=6000,
                                             stop_off_road=True))
        bridge.wait_for("simulator disconnected")
    finally:
        bridge.stop()
    d = report.as_dict()
    summary = bridge.json_summary()
    assert d["stop_reason"] == "laps" and d["laps"] == 1  # a full lap of curves in both directions
    assert d["off_road_events"] == 0 and d["max_abs_cte_m"] < Track(track_spec("serpentine")).half_width
    assert d["mean_abs_cte_m"] < 1.5
    assert summary["answered"] == summary["messages"] == d["telemetry_sent"] and summary["policy_errors"] == 0
    steer = np.array(report.steering)
    assert steer.min() < -0.1 and steer.max() > 0.1  # it really steered both ways
    assert math.isfinite(d["round_trip_ms_p50"])


def _emulator_cli(port: int, *flags: str, stderr_tty: bool = False) -> tuple[int, str, str]:
    """``nac-drive sim udacity-emulator --json ...`` -> (exit code, stdout, stderr); stderr
    is a pseudo-terminal with ``stderr_tty`` (what a user's shell gives it)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    argv = [sys.executable, "-m", "nac_drive.cli", "sim", "udacity-emulator", "--port", str(port), "--json", *flags]
    if not stderr_tty:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        return out.returncode, out.stdout, out.stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))  # 40 rows, 200 columns
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    stdout, _ = proc.communicate(timeout=120)
    return proc.returncode, stdout, b"".join(chunks).decode()


def _last_status(stderr: str) -> dict:
    """The numbers of the last status line the emulator drew."""
    import re

    found = re.findall(r"laps (-?[\d.]+), step (\d+), cte ([+-][\d.]+) m, mean \|cte\| ([\d.]+) m, off-road (\d+)",
                       stderr)
    assert found, f"no status line in stderr: {stderr[-500:]!r}"
    laps, step, cte, mean, off = found[-1]
    return {"laps": float(laps), "step": int(step), "mean_abs_cte_m": float(mean), "off_road_events": int(off)}


def test_emulator_shows_laps_distance_and_cross_track_error_live_on_a_terminal(tmp_path):
    import json

    pytest.importorskip("socketio")
    pytest.importorskip("websocket")
    from support.udacity_procs import free_port, start_bridge

    port = free_port()
    bridge = start_bridge(port, "nac_drive.agents.udacity_scripted:LaneMarkingPolicy")
    try:
        runs = {"terminal": _emulator_cli(port, "--frames", "90", stderr_tty=True),
                "forced": _emulator_cli(port, "--frames", "90", "--progress"),
                "pipe": _emulator_cli(port, "--frames", "90"),
                "terminal, --no-progress": _emulator_cli(port, "--frames", "90", "--no-progress", stderr_tty=True)}
    finally:
        bridge.stop()
    for name, (code, stdout, stderr) in runs.items():
        assert code == 0, (name, stderr)
        lines = stdout.splitlines()
        summary = json.loads(lines[-1])   # --json adds one clean last line to stdout, whatever stderr shows
        assert lines[:-1] == [f"{k}: {v}" for k, v in summary.items()], (name, stdout)   # after the text
        assert summary["commands"] == 90
        if name in ("terminal", "forced"):
            status = _last_status(stderr)
            assert status["step"] == summary["commands"]
            assert status["laps"] == pytest.approx(summary["lap_fraction"], abs=0.006)
            assert status["mean_abs_cte_m"] == pytest.approx(summary["mean_abs_cte_m"], abs=0.0006)
            assert status["off_road_events"] == summary["off_road_events"]
            assert f"{summary['distance_m']:.0f} m" in stderr  # the distance counter
        else:
            assert "cte" not in stderr, (name, stderr)
    # the scripted driver's recordings (collect udacity): the same switch for its frame counter
    record = [sys.executable, "-m", "nac_drive.cli", "collect", "udacity", "--driver", "scripted", "--frames", "5",
              "--json", "--out"]
    quiet = subprocess.run([*record, str(tmp_path / "a")], capture_output=True, text=True, timeout=120).stderr
    shown = subprocess.run([*record, str(tmp_path / "b"), "--progress"], capture_output=True, text=True,
                           timeout=120).stderr
    assert "recording lakeside" not in quiet and "recording lakeside" in shown and "5/5" in shown


def test_a_port_that_accepts_and_never_answers_is_one_line_and_exit_2():
    # once: "unexpected WebSocketTimeoutException ... (a bug)", exit 1
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "nac_drive.cli", "sim", "udacity-emulator", "--port", str(port),
                              "--timeout", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert f"ws://127.0.0.1:{port}" in out.stderr and "no answer within 1 s" in out.stderr
