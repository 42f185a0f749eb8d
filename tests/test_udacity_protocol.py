"""The emulator against the bridge over real sockets on 127.0.0.1, and the emulator's wire bytes."""

import base64
import json
import sys
import time

import cv2
import numpy as np
import pytest

from support.udacity_procs import Proc, free_port, start_bridge

from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

pytest.importorskip("socketio")
pytest.importorskip("websocket")


def test_every_telemetry_is_answered_in_lockstep_with_string_steers():
    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:ResetProbe")
    try:
        report = run_emulator(EmulatorConfig(port=port, frames=150))
        bridge.wait_for("simulator disconnected")  # every message before it has been handled
    finally:
        bridge.stop()
    summary = bridge.json_summary()
    assert report.stop_reason == "frames" and not report.no_answer
    assert report.telemetry_sent == 150 and report.non_string_steer == 0
    assert summary["messages"] == 150 and summary["answered"] == 150
    assert summary["malformed"] == 0 and summary["policy_errors"] == 0  # the probe checked every obs
    assert report.steer == report.commands >= 150  # every answer parsed by the Unity-style client
    # steer 0,0 on connect, then the policy: 0.5 for three frames, then -0.25
    assert report.steering[:6] == pytest.approx([0.0, 0.5, 0.5, 0.5, -0.25, -0.25])
    assert summary["latency_ms_p50"] is not None and summary["latency_ms_p50"] < 50


def test_reconnect_resets_the_policy_and_summary_counts_both_sessions():
    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:ResetProbe")
    try:
        first = run_emulator(EmulatorConfig(port=port, frames=20))
        second = run_emulator(EmulatorConfig(port=port, frames=20, track="gentle"))
        bridge.wait_for("simulator disconnected", count=2)
    finally:
        bridge.stop()
    summary = bridge.json_summary()
    for report in (first, second):
        assert report.steering[:5] == pytest.approx([0.0, 0.5, 0.5, 0.5, -0.25])
    assert summary["connects"] == 2 and summary["disconnects"] == 2 and summary["messages"] == 40


def test_manual_driving_and_decimal_commas():
    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:Constant03")
    try:
        report = run_emulator(EmulatorConfig(port=port, frames=80, human=True, decimal_comma=True))
        bridge.wait_for("simulator disconnected")
    finally:
        bridge.stop()
    summary = bridge.json_summary()
    assert report.manual_sent > 0 and report.manual == report.manual_sent  # every {} answered with manual
    assert summary["manual"] == report.manual_sent and summary["malformed"] == 0
    assert summary["answered"] == summary["messages"] == 80
    assert report.steer > 0 and 0.3 in [round(s, 6) for s in report.steering]  # "12,3456" telemetry parsed


def test_realtime_emulator_paces_telemetry_at_15_hz():
    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:Constant03")
    try:
        t0 = time.perf_counter()
        report = run_emulator(EmulatorConfig(port=port, frames=16, realtime=True))
        elapsed = time.perf_counter() - t0
    finally:
        bridge.stop()
    # 16 telemetry = 1 on connect + 15 after paced steps of 1/15 s
    assert report.telemetry_sent == 16 and 0.9 < elapsed < 3.0


def test_bridge_exits_with_summary_when_the_simulator_closes():
    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:Constant03", extra=["--exit-on-disconnect"])
    run_emulator(EmulatorConfig(port=port, frames=10))
    assert bridge.p.wait(20) == 0
    bridge.stop()
    assert bridge.json_summary()["answered"] == 10


def _capture(mode, cfg_kwargs):
    port = free_port()
    server = Proc([sys.executable, "-u", str(__import__("support.udacity_procs").udacity_procs.SUPPORT
                                            / "capture_server.py"), str(port), mode])
    server.wait_for("listening")
    try:
        report = run_emulator(EmulatorConfig(port=port, expect_connect_command=False, **cfg_kwargs))
        server.wait_for('"closed"', stream="out")  # the server has printed every frame and exits
    finally:
        server.stop()
    events = [json.loads(line) for line in server.out if line.startswith("{")]
    assert events.pop() == {"closed": True}
    return report, events


def test_emulator_speaks_like_the_unity_client_on_the_wire():
    # without its one extra field (the cross-track error, send_cte), the emulator sends what Unity sends
    report, events = _capture("strings", dict(frames=40, ping_interval=0.2, send_cte=False))
    assert events[0] == {"path": "/socket.io/", "query": "EIO=4&transport=websocket"}
    frames = [e["frame"] for e in events[1:]]
    assert "40" not in frames and not any(f.startswith("40") for f in frames)  # never the namespace CONNECT
    assert frames.count("2") >= 2 and report.pongs >= 2  # its own pings
    telemetry = [f for f in frames if f.startswith("42")]
    assert len(telemetry) == 40 and report.telemetry_sent == 40
    name, data = json.loads(telemetry[0][2:])
    assert name == "telemetry" and telemetry[0].startswith('42["telemetry",{"steering_angle":"')
    assert set(data) == {"steering_angle", "throttle", "speed", "image"}
    assert all(isinstance(v, str) for v in data.values())
    assert data["speed"] == "0.0000"
    jpeg = base64.b64decode(data["image"])
    assert jpeg[:2] == b"\xff\xd8"
    assert cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR).shape == (160, 320, 3)
    # lockstep: exactly one telemetry per command received (+1 on connect)
    assert report.telemetry_sent == report.commands + 1 or report.stop_reason == "frames"


def test_emulator_stalls_like_unity_when_steer_values_are_numbers():
    report, events = _capture("numbers", dict(frames=10, answer_timeout=1.5))
    telemetry = [e for e in events[1:] if e["frame"].startswith("42")]
    assert len(telemetry) == 1 and report.non_string_steer == 1
    assert report.no_answer and report.commands == 0


def test_sim_cli_drives_against_the_bridge_and_exits_2_without_answers(capsys):
    from nac_drive.cli import main as cli_main

    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:Constant03")
    try:
        code = cli_main(["sim", "udacity-emulator", "--port", str(port), "--frames", "12", "--track", "canyon",
                         "--json"])
    finally:
        bridge.stop()
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["telemetry_sent"] == 12 and summary["track"] == "canyon"
    assert summary["steer"] >= 12 and summary["no_answer"] is False

    port = free_port()
    server = Proc([sys.executable, "-u", str(__import__("support.udacity_procs").udacity_procs.SUPPORT
                                            / "capture_server.py"), str(port), "numbers"])
    server.wait_for("listening")
    try:
        code = cli_main(["sim", "udacity-emulator", "--port", str(port), "--frames", "5", "--timeout", "1",
                         "--json"])
    finally:
        server.stop()
    captured = capsys.readouterr()
    assert code == 2 and json.loads(captured.out.strip().splitlines()[-1])["no_answer"] is True
    assert "namespace CONNECT" in captured.err


def test_a_driver_that_sent_telemetry_keeps_the_seat_through_a_pause():
    # the seat goes back IDLE_TIMEOUT_S after connecting only without any telemetry: a simulator
    # that drove and pauses (its window in the background) keeps it, up to engineio's ping timeout
    from support.udacity_procs import SocketIOClient
    from test_udacity_attacks import Driver

    from nac_drive.simulators.udacity_server import IDLE_TIMEOUT_S

    import websocket

    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:ResetProbe")
    try:
        driver = Driver(port)
        driver.drive(2)
        time.sleep(IDLE_TIMEOUT_S + 1)
        with pytest.raises(websocket.WebSocketBadStatusException):   # still seated
            SocketIOClient(port, timeout=5)
        driver.drive(3)                                              # 0.5 once more, then -0.25: no reset
        driver.close()
        bridge.wait_for("simulator disconnected")
    finally:
        bridge.stop()
    summary = bridge.json_summary()
    assert (summary["connects"], summary["disconnects"], summary["messages"]) == (1, 1, 5)
