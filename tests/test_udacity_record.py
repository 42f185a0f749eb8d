"""Recording: `nac-drive collect udacity` (pass-through of a human's driving), the SIGKILL test,
the bridge's --record, and the emulator's own training-mode recordings."""

import json
import signal
import threading
import time

import cv2
import numpy as np
import pytest

from support.udacity_procs import free_port, start_bridge, start_recorder

from nac_drive.agents.udacity_scripted import LaneMarkingPolicy
from nac_drive.cli import main as cli_main
from nac_drive.data_collection.udacity_dataset import UdacityWindowDataset, segments_from_log
from nac_drive.data_collection.udacity_log import load_rgb, read_driving_log
from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

pytest.importorskip("socketio")
pytest.importorskip("websocket")


def _rows_in(csv_path):
    try:
        return csv_path.read_text().count("\n")
    except FileNotFoundError:
        return 0


def test_record_udacity_passes_the_human_through_and_records_every_full_frame(tmp_path):
    port = free_port()
    rec = start_recorder(port, str(tmp_path / "rec"))
    try:
        report = run_emulator(EmulatorConfig(port=port, frames=120, human=True))
        rec.wait_for("simulator disconnected")
    finally:
        rec.stop()
    summary = rec.json_summary()
    full = report.telemetry_sent - report.manual_sent
    assert report.manual_sent > 0 and full > 30
    assert report.steer == 0 and report.manual == report.commands  # never overrides the human
    assert summary["rows_recorded"] == full and summary["answered"] == summary["messages"] == 120
    rows = read_driving_log(tmp_path / "rec" / "driving_log.csv")
    assert len(rows) == full
    # full telemetry is only sent once the human is near its 9 mph (below 8 it holds the key: {})
    assert all(r.speed >= 8.0 - 1e-3 for r in rows)
    assert all(r.left is None and r.right is None for r in rows)
    assert load_rgb(rows[-1].center).shape == (160, 320, 3)
    assert len({r.center for r in rows}) == len(rows)  # one image per row


def test_recording_killed_with_sigkill_still_parses(tmp_path):
    port = free_port()
    out = tmp_path / "rec"
    rec = start_recorder(port, str(out))
    reports = []
    driver = threading.Thread(target=lambda: reports.append(
        run_emulator(EmulatorConfig(port=port, human=True, human_speed_mph=3.0, answer_timeout=10))), daemon=True)
    driver.start()
    csv_path = out / "driving_log.csv"
    end = time.time() + 60
    while _rows_in(csv_path) < 40 and time.time() < end:
        time.sleep(0.01)
    rec.p.send_signal(signal.SIGKILL)  # mid-recording: no chance to close anything
    rec.p.wait(10)
    driver.join(20)
    assert reports and reports[0].stop_reason == "server_closed"
    rows = read_driving_log(csv_path)  # parses: at most the last row is lost
    lines = csv_path.read_text().splitlines()
    assert len(rows) >= 40 and len(rows) >= len(lines) - 1
    for r in rows:  # every recorded row points at a complete image
        assert cv2.imread(str(r.center)) is not None


def test_drive_with_record_writes_the_commands_sent(tmp_path):
    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:Constant03", record=str(tmp_path / "drive"))
    try:
        report = run_emulator(EmulatorConfig(port=port, frames=40))
        bridge.wait_for("simulator disconnected")
    finally:
        bridge.stop()
    assert bridge.json_summary()["rows_recorded"] == 40
    rows = read_driving_log(tmp_path / "drive" / "driving_log.csv")
    assert len(rows) == 40 and all(r.steering == pytest.approx(0.3) for r in rows)
    assert rows[0].throttle > 0 and report.telemetry_sent == 40


def test_emulator_training_recording_three_cameras(tmp_path, capsys):
    out = tmp_path / "train"
    code = cli_main(["collect", "udacity", "--driver", "scripted", "--out", str(out), "--frames", "24", "--track", "canyon",
                     "--seed", "2", "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["frames"] == 24 and summary["off_road_events"] == 0
    rows = read_driving_log(out / "driving_log.csv")
    assert len(rows) == 24 and all(r.left.exists() and r.right.exists() for r in rows)
    assert np.diff([r.timestamp for r in rows]) == pytest.approx(np.full(23, 1 / 15), abs=1.5e-3)  # 15 Hz
    # the left camera sits left of the car, so the road appears further right in it
    lane = LaneMarkingPolicy()
    r = rows[5]
    c, left, right = (lane.road_centre(load_rgb(p)) for p in (r.center, r.left, r.right))
    assert left > c + 3 and right < c - 3
    frames, times, steer = UdacityWindowDataset(segments_from_log(out / "driving_log.csv"), window=8)[0]
    assert frames.shape == (8, 3, 66, 200) and times[-1] == pytest.approx(7 / 15, abs=0.01)
    assert steer.abs().max() <= 1.0 and steer.tolist() == pytest.approx([r.steering for r in rows[:8]])


def test_a_second_recording_into_the_folder_appends_its_own_rows_and_frames(tmp_path, capsys):
    """Issue 44 item 1: two scripted recordings (other tracks, the same simulated clock)
    into one folder once shared 30 image names: the second overwrote the first's frames,
    which kept their labels. Now every row keeps its own frame, as if recorded alone."""
    def record(out, track):
        assert cli_main(["collect", "udacity", "--driver", "scripted", "--out", str(out), "--frames", "10",
                         "--track", track, "--json"]) == 0
        capsys.readouterr()
        return read_driving_log(out / "driving_log.csv")

    alone = record(tmp_path / "lakeside", "lakeside") + record(tmp_path / "canyon", "canyon")
    record(tmp_path / "both", "lakeside")
    both = record(tmp_path / "both", "canyon")
    images = [p for r in both for p in (r.center, r.left, r.right)]
    assert len(both) == 20 and len(set(images)) == 60 and len(list((tmp_path / "both" / "IMG").iterdir())) == 60
    for row, ref in zip(both, alone):   # the label and the frame of each row are those of its own recording
        assert (row.steering, row.speed, row.timestamp) == (ref.steering, ref.speed, ref.timestamp)
        assert [p.read_bytes() for p in (row.center, row.left, row.right)] == \
               [p.read_bytes() for p in (ref.center, ref.left, ref.right)]
    assert both[10].center.name == alone[10].center.name.replace(".jpg", "-2.jpg")
    assert [len(s.rows) for s in segments_from_log(tmp_path / "both" / "driving_log.csv")] == [10, 10]
