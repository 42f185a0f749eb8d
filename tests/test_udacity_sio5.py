"""The simulator's Unity client cannot drive against python-socketio 5 (why the bridge pins 4.6).

The emulator reproduces the Unity client; against a drive.py-style server on python-socketio
5.x it connects (the Engine.IO handshake works) but no telemetry is ever answered: it never
sends the namespace CONNECT packet "40", and python-socketio 5 drops events of clients that
are not connected to "/". Sending "40" (what a v3+ client would do, and Unity does not)
makes the same server answer, which pins the cause down. python-socketio 5 cannot live in
the project's venv next to 4.6, so the server runs in a side venv:

    NAC_DRIVE_SIO5_PYTHON=/path/sio5-venv/bin/python bash tests/support/make_sio5_venv.sh
"""

import json
import os
from pathlib import Path

import pytest

from support.udacity_procs import SUPPORT, Proc, free_port, start_bridge

from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

pytest.importorskip("websocket")
SIO5_PYTHON = os.environ.get("NAC_DRIVE_SIO5_PYTHON")
pytestmark = pytest.mark.skipif(
    not SIO5_PYTHON or not Path(SIO5_PYTHON).exists(),
    reason="needs a python with python-socketio 5: set NAC_DRIVE_SIO5_PYTHON and run "
           "tests/support/make_sio5_venv.sh",
)


def _run_against_sio5(**cfg):
    port = free_port()
    server = Proc([SIO5_PYTHON, "-u", str(SUPPORT / "sio5_server.py"), str(port)])
    server.wait_for("listening", stream="out")
    try:
        report = run_emulator(EmulatorConfig(port=port, frames=20, answer_timeout=2.0, **cfg))
    finally:
        server.stop(sig=15)
    counts = [json.loads(line) for line in server.out if line.startswith("{")][-1]
    return report, counts


def test_unity_client_gets_no_answer_from_python_socketio_5():
    report, counts = _run_against_sio5()
    assert counts["socketio_major"] == 5
    assert report.no_answer and report.stop_reason == "no_answer"
    assert report.telemetry_sent == 1 and report.commands == 0  # the car never moves
    assert counts["telemetry"] == 0 and counts["connects"] == 0  # every event dropped


def test_sending_the_namespace_connect_packet_is_what_makes_sio5_answer():
    report, counts = _run_against_sio5(send_namespace_connect=True)
    assert not report.no_answer and report.telemetry_sent == 20
    assert counts["telemetry"] >= 19 and counts["connects"] == 1


def test_the_same_unity_client_drives_against_the_bridge():
    port = free_port()
    bridge = start_bridge(port, "udacity_test_policies:Constant03")
    try:
        report = run_emulator(EmulatorConfig(port=port, frames=20, answer_timeout=2.0))
    finally:
        bridge.stop()
    assert not report.no_answer and report.telemetry_sent == 20 and report.steer >= 20
