"""The live Rerun view: what a drive streams equals what its trace holds, a recorded run
replays into the same recording, the gRPC server listens on 127.0.0.1 only with Rerun's
analytics off and serves a viewer, and CarRacing's cross-track error is the car's signed offset from the centre line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rerun")

from support.recordings import read_recording, series  # noqa: E402

from nac_drive.interpret.trace import BACKBONE_GROUPS, PER_KEY, load_trace  # noqa: E402

NAC_DRIVE = str(Path(sys.executable).with_name("nac-drive"))


def check_recording_equals_trace(recording, run, live: bool) -> None:
    """Every value the recording holds for step i is the trace's row i (module docstring of
    nac_drive.interpret.live_view: the layout)."""
    n = run.num_steps
    assert set(recording["camera"]["EncodedImage:blob"]) == set(range(n))
    if live:   # the Grad-CAM overlay of every step, computed while driving
        assert set(recording["saliency"]["EncodedImage:blob"]) == set(range(n))
    episodes = recording["action/policy"]["episode"]
    assert [episodes[i] for i in range(n)] == run.episode.tolist()

    def equal(entity, expected, width=None):
        got = series(recording, entity, n, width if width is not None else expected.shape[-1])
        np.testing.assert_array_equal(got.astype(np.float32), expected.reshape(n, -1).astype(np.float32),
                                      err_msg=entity)

    equal("action/policy", run.policy_action)
    if run.expert_action.shape[1]:
        equal("action/expert", run.expert_action)
    else:
        assert "action/expert" not in recording
    if np.isfinite(run.reward).any():
        equal("reward/frame", run.reward[:, None])
        running = np.concatenate([np.cumsum(run.reward[run.episode == e], dtype=np.float64)
                                  for e in np.unique(run.episode)])
        np.testing.assert_allclose(series(recording, "reward/return", n)[:, 0], running, rtol=1e-6)   # float32 trace
    else:   # the Udacity simulator has no reward
        assert "reward/frame" not in recording and "reward/return" not in recording
    assert np.isfinite(run.cross_track_error).all()
    equal("cte", run.cross_track_error[:, None])
    for gate in ("q", "k", "v"):
        equal(f"nac/sensory/{gate}", getattr(run, gate))
    heads, k = run.tau.shape[1:]
    for h in range(heads):
        for group in BACKBONE_GROUPS:
            equal(f"nac/head{h}/{group}", getattr(run, f"{group}_mean")[:, h])
            equal(f"nac/head{h}/{group}_top", getattr(run, f"{group}_top")[:, h])
        for name in PER_KEY:
            equal(f"nac/head{h}/{name}", getattr(run, name)[:, h], width=k)
        equal(f"nac/head{h}/key_age", np.where(run.key_age[:, h] >= 0, run.key_age[:, h], np.nan), width=k)
        bars = recording[f"nac/head{h}/attention"]["BarChart:values"]
        for i in (0, n // 2, n - 1):
            by_age = np.zeros(run.key_age[i, h].max() + 1)
            np.add.at(by_age, run.key_age[i, h][run.key_age[i, h] >= 0], run.weights[i, h][run.key_age[i, h] >= 0])
            np.testing.assert_allclose(bars[i][0]["buffer"], by_age, rtol=1e-6)


@pytest.mark.slow
def test_a_drive_streams_what_its_trace_records_and_a_trace_replays_into_the_same_recording(tmp_path):
    out = subprocess.run([NAC_DRIVE, "drive", "carracing", "--episodes", "2", "--max-steps", "150",
                          "--rerun", "live.rrd", "--trace", "run", "--json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["rerun"] == "live.rrd" and summary["lengths"] == [150, 150]
    run = load_trace(tmp_path / "run")
    assert run.num_steps == 300 and run.episode.tolist() == [0] * 150 + [1] * 150
    live = read_recording(tmp_path / "live.rrd")
    check_recording_equals_trace(live, run, live=True)

    replay = subprocess.run([NAC_DRIVE, "dashboard", "run", "--rrd", "replay.rrd"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert not (tmp_path / "run" / "dashboard.html").exists()   # --rrd alone writes the recording only
    replayed = read_recording(tmp_path / "replay.rrd")
    check_recording_equals_trace(replayed, run, live=False)
    assert set(replayed) == set(live) - {"saliency"}   # the same layout (no saliency.npz was computed)


def test_a_recorded_run_and_its_saliency_replay_into_the_live_layout(tmp_path):
    from nac_drive.interpret.live_view import trace_to_rrd
    from nac_drive.interpret.saliency import load_saliency
    from support.synthetic_runs import make_synthetic_run

    run = load_trace(make_synthetic_run(tmp_path / "run", steps=60))
    trace_to_rrd(run, tmp_path / "run.rrd", saliency=load_saliency(tmp_path / "run", trace=run), progress=False)
    recording = read_recording(tmp_path / "run.rrd")
    check_recording_equals_trace(recording, run, live=True)
    saliency = load_saliency(tmp_path / "run", trace=run)   # the files' own JPEGs, not re-encoded
    assert bytes(recording["saliency"]["EncodedImage:blob"][7][0]) == saliency.overlay_bytes(7)
    assert bytes(recording["camera"]["EncodedImage:blob"][7][0]) == run.frame_jpeg(7)


@pytest.mark.slow
def test_the_bridge_answers_every_15_hz_telemetry_while_streaming_saliency_and_cte(tmp_path):
    from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator
    from support.udacity_procs import Proc, free_port

    port = free_port()
    bridge = Proc([sys.executable, "-m", "nac_drive.cli", "drive", "udacity", "--port", str(port),
                   "--rerun", str(tmp_path / "live.rrd"), "--trace", str(tmp_path / "run"), "--json"])
    bridge.wait_for("listening on", timeout=60)
    try:   # the shipped PilotNet+NAC policy, paced as the simulator paces it
        report = run_emulator(EmulatorConfig(port=port, frames=60, track="gentle", realtime=True))
    finally:
        assert bridge.stop() == 0
    summary = bridge.json_summary()
    assert report.telemetry_sent == 60 and summary["answered"] == summary["messages"] >= 60
    assert summary["policy_errors"] == 0 and summary["malformed"] == 0
    run = load_trace(tmp_path / "run")
    assert run.num_steps == summary["answered"]
    # the emulator's cross-track error reached the trace: the car starts on the centre line
    assert abs(run.cross_track_error[0]) < 0.5 and np.abs(run.cross_track_error).max() > 0
    check_recording_equals_trace(read_recording(tmp_path / "live.rrd"), run, live=True)


def listening_addresses(port: int) -> set[str]:
    """The local IPv4 addresses listening on ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, p = local.split(":")
        if state == "0A" and int(p, 16) == port:   # LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def connections_to(port: int) -> int:
    """How many established TCP connections the server on ``port`` holds (from /proc/net/tcp)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "01" and int(local.split(":")[1], 16) == port:   # ESTABLISHED, server side
            count += 1
    return count


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_grpc_server_listens_on_loopback_only_with_analytics_off_and_serves_a_viewer(tmp_path, monkeypatch):
    from nac_drive.interpret.live_view import open_view, rerun_executable

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))   # the server's analytics setting lands here
    port = free_port()
    view = open_view(serve_port=port, saliency=False)
    url = f"rerun+http://127.0.0.1:{port}/proxy"
    try:
        assert url in view.where and listening_addresses(port) == {"127.0.0.1"}
        settings = json.loads((tmp_path / "nac-drive" / "rerun-config" / "rerun" / "analytics.json").read_text())
        assert settings["analytics_enabled"] is False
        environ = Path(f"/proc/{view.viewer.pid}/environ").read_bytes().decode(errors="replace").split("\0")
        assert f"XDG_CONFIG_HOME={tmp_path}/nac-drive/rerun-config" in environ
        # a viewer connects (here Rerun's CLI saving what it receives) and gets the drive
        client = subprocess.Popen([rerun_executable(), url, "--bind", "127.0.0.1", "--port", str(free_port()),
                                   "--save", str(tmp_path / "got.rrd")], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)})
        for i in range(25):
            view.add(frame=np.zeros((8, 8, 3), np.uint8), policy_action=[i % 5], reward=0.5)
        view.flush()
        # the server holds the drive for viewers that come late; stop it only once this one is in
        # (two connections: the drive's and the viewer's) and has had time to take it all
        deadline = time.monotonic() + 60
        while connections_to(port) < 2 and client.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert connections_to(port) >= 2, "the viewer never connected"
        time.sleep(3)
    finally:
        view.close()   # stops the server: the client's stream ends and it saves the file
    assert view.viewer.poll() is not None
    assert client.wait(timeout=30) == 0
    got = read_recording(tmp_path / "got.rrd")
    np.testing.assert_array_equal(series(got, "action/policy", 25)[:, 0], np.arange(25) % 5)
    np.testing.assert_allclose(series(got, "reward/return", 25)[:, 0], 0.5 * np.arange(1, 26))


def test_carracing_cross_track_error_is_the_signed_offset_from_the_centre_line():
    from nac_drive.agents.teacher import PurePursuitTeacher
    from nac_drive.simulators.carracing import make_carracing

    env = make_carracing()
    env.reset(seed=900000)
    teacher = PurePursuitTeacher(continuous=False)
    teacher.reset()
    track = np.array([(t[2], t[3]) for t in env.unwrapped.track])
    turn = np.abs(np.diff(np.unwrap(np.array([t[1] for t in env.unwrapped.track]))))
    i = 5 + int(np.argmin(turn[5:30]))   # a straight piece near the start, where the teacher looks first
    direction = (track[i + 1] - track[i]) / np.linalg.norm(track[i + 1] - track[i])
    right = np.array([direction[1], -direction[0]])          # the direction of travel turned clockwise
    middle = (track[i] + track[i + 1]) / 2
    hull = env.unwrapped.car.hull
    for offset in (-3.0, 0.0, 2.5):
        hull.position = tuple(middle + offset * right)
        assert teacher.cross_track_error(env) == pytest.approx(offset, abs=1e-3)
    env.close()


def test_an_rrd_that_cannot_be_written_is_refused_before_the_drive(tmp_path):
    out = subprocess.run([NAC_DRIVE, "drive", "carracing", "--episodes", "1", "--rerun", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, env={**os.environ})
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "--rerun: expected a file name ending in .rrd" in out.stderr


def test_an_existing_rrd_is_refused_before_the_drive_and_left_as_it_was(tmp_path):
    existing = tmp_path / "run.rrd"
    existing.write_bytes(b"an earlier recording")
    out = subprocess.run([NAC_DRIVE, "drive", "carracing", "--episodes", "1", "--rerun", str(existing)],
                         capture_output=True, text=True, timeout=120, env={**os.environ})
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert f"--rerun: {existing} exists; a drive never overwrites a recording" in out.stderr
    assert existing.read_bytes() == b"an earlier recording"


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie no one reaps counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX"
    except FileNotFoundError:
        return True


SERVING = """
import time
from nac_drive.interpret.live_view import start_viewer
server, url = start_viewer(serve_port={port})
print(server.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's PR_SET_PDEATHSIG: Linux only")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_served_drive_killed_takes_its_grpc_server_and_port_with_it(tmp_path, how):
    """The `rerun --serve-grpc` child was re-parented to PID 1 and kept the port, so the next
    --rerun-serve was refused "port in use"; SIGINT alone cleaned up."""
    import signal

    port = free_port()
    drive = subprocess.Popen([sys.executable, "-c", SERVING.format(port=port)], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    server = int(drive.stdout.readline())
    try:
        assert not gone(server) and listening_addresses(port) == {"127.0.0.1"}
        drive.send_signal(getattr(signal, how))
        drive.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not (gone(server) and not listening_addresses(port)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(server) and listening_addresses(port) == set()
    finally:
        if not gone(server):
            os.kill(server, signal.SIGKILL)


def test_the_served_drive_writes_nothing_into_the_users_rerun_folders(tmp_path, monkeypatch):
    """`rerun analytics disable`, once run to turn analytics off, queued a `cli_command_invoked`
    event of its own in ~/.local/share/rerun/analytics/; now nac-drive writes the setting itself."""
    from nac_drive.interpret.live_view import open_view

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        monkeypatch.delenv(name, raising=False)
    view = open_view(serve_port=free_port(), saliency=False)
    try:
        for i in range(5):
            view.add(frame=np.zeros((8, 8, 3), np.uint8), policy_action=[i % 5], reward=0.5)
        view.flush()
    finally:
        view.close()
    written = sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())
    assert written == [".cache/nac-drive/rerun-config/rerun/analytics.json"]
    settings = json.loads((home / written[0]).read_text())
    assert settings["analytics_enabled"] is False
    assert settings["data_dir_path"] == str(home / ".cache/nac-drive/rerun-config/rerun-analytics")


def test_a_recording_that_cannot_be_written_ends_in_one_line_after_the_drives_summary(tmp_path):
    """A full disk while a .rrd was written ended in exit 1 "unexpected RuntimeError: File-writer
    thread shut down prematurely (a bug...)" plus Rust log lines, the summary lost. Here the
    file-size limit (RLIMIT_FSIZE) makes Rerun's file writer fail as a full disk does."""
    import resource
    import signal

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    rrd = tmp_path / "drive.rrd"
    out = subprocess.run([NAC_DRIVE, "drive", "carracing", "--episodes", "1", "--max-steps", "150",
                          "--no-live-saliency", "--rerun", str(rrd)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)}, preexec_fn=small_files)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"nac-drive drive: error: --rerun: the recording to {rrd} failed (") and \
        last.endswith("; the partial file was removed"), out.stderr
    assert "\x1b[" not in out.stderr and "ERROR" not in out.stderr   # no Rust log lines
    assert "seed 900000: return" in out.stdout and "frames  150" in out.stdout   # the summary, printed first
    assert not rrd.exists()


def test_dashboard_rrd_whose_writer_fails_ends_in_one_line_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    """dashboard --rrd on a full disk: exit 1 "unexpected RuntimeError ... (a bug)" before; here
    Rerun's flush raises the error its dead file writer gives."""
    import rerun as rr
    from nac_drive.cli.main import main
    from support.synthetic_runs import make_synthetic_run

    make_synthetic_run(tmp_path / "run", steps=30, with_saliency=False)

    def dead_writer(self, **kwargs):
        raise RuntimeError("File-writer thread shut down prematurely")

    monkeypatch.setattr(rr.RecordingStream, "flush", dead_writer)
    out = tmp_path / "run.rrd"
    assert main(["dashboard", str(tmp_path / "run"), "--rrd", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"nac-drive dashboard: error: --rrd: the recording to {out} failed (File-writer thread shut "
                       "down prematurely); the partial file was removed"), err
    assert not out.exists()


def test_a_drive_terminated_closes_its_recording_whole(tmp_path, monkeypatch):
    """After SIGTERM the .rrd once had no footer (`rerun rrd verify` failed): the drive died where
    it stood. Now SIGTERM ends the verb as Ctrl-C does, closing what it writes, exit 143."""
    import signal

    from nac_drive.interpret.live_view import rerun_executable, viewer_config_home

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rrd = tmp_path / "drive.rrd"
    drive = subprocess.Popen([NAC_DRIVE, "drive", "carracing", "--episodes", "3", "--rerun", str(rrd),
                              "--no-live-saliency"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    deadline = time.monotonic() + 300
    while not (rrd.exists() and rrd.stat().st_size > 50_000) and drive.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert drive.poll() is None, drive.stderr.read()[-2000:]   # still driving: 3 whole episodes take minutes
    drive.send_signal(signal.SIGTERM)
    _, err = drive.communicate(timeout=60)
    assert drive.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == "nac-drive drive: terminated (SIGTERM); what it wrote is closed"
    verify = subprocess.run([rerun_executable(), "rrd", "verify", str(rrd)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "XDG_CONFIG_HOME": str(viewer_config_home())})
    assert verify.returncode == 0, verify.stderr[-2000:]
