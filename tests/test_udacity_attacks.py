"""The Udacity bridge under attack, over real sockets on 127.0.0.1: after each attack a
legitimate client still gets the policy's steering, in order, from an untouched state.

The bridge drives ``ResetProbe`` (steer +0.5 for the first three frames after a reset,
then -0.25), so a reset or a shared state shows in the answers."""

import base64
import http.client
import re
import socket
import struct
import time

import cv2
import numpy as np
import pytest

from support import hostile_jpegs
from support.udacity_procs import SocketIOClient, free_port, start_bridge, websocket_url

from nac_drive.cli import main as cli_main
from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

websocket = pytest.importorskip("websocket")
pytest.importorskip("socketio")
from nac_drive.simulators.udacity_server import IDLE_TIMEOUT_S, MAX_MESSAGE_BYTES  # noqa: E402

POLICY = "udacity_test_policies:ResetProbe"
SAFE = ["steer", {"steering_angle": "0.000000", "throttle": "-1.000000"}]
CONNECT_COMMAND = ["steer", {"steering_angle": "0.000000", "throttle": "0.000000"}]
_FRAME = base64.b64encode(cv2.imencode(".jpg", np.random.default_rng(0).integers(
    0, 255, (160, 320, 3), dtype=np.uint8))[1].tobytes()).decode()


def telemetry(image: str = _FRAME) -> dict:
    return {"steering_angle": "1.5", "throttle": "0.2", "speed": "4.0", "image": image}


class Driver(SocketIOClient):
    """The legitimate simulator: checks that every answer is the policy's, counted from
    its own connect (a reset in between, or a frame of another client, breaks the count)."""

    def __init__(self, port: int):
        super().__init__(port)
        assert self.next_event() == CONNECT_COMMAND
        self.frames = 0

    def drive(self, n: int) -> None:
        for _ in range(n):
            self.frames += 1
            event, data = self.ask(telemetry())
            assert event == "steer" and float(data["steering_angle"]) == (0.5 if self.frames <= 3 else -0.25), (
                self.frames, data)
            assert float(data["throttle"]) > 0  # 4 mph, below the set speed


def peak_memory_mb(pid: int) -> float:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def http_request(port: int, method: str, path: str, headers: dict | None = None,
                 body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def close_code(ws) -> int:
    """Read until the server's close frame; its status code."""
    while True:
        opcode, data = ws.recv_data(control_frame=True)
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            return struct.unpack(">H", data[:2])[0]


def masked_frame_header(opcode: int, length: int, final: bool) -> bytes:
    """RFC 6455 header of a client frame with a 64-bit length (the mask follows it)."""
    return bytes([(0x80 if final else 0) | opcode, 0x80 | 127]) + struct.pack(">Q", length)


def send_fragment(ws, opcode: int, payload: bytes, final: bool) -> None:
    mask = b"\x01\x02\x03\x04"
    body = (np.frombuffer(payload, np.uint8) ^ np.resize(np.frombuffer(mask, np.uint8), len(payload))).tobytes()
    ws.sock.sendall(masked_frame_header(opcode, len(payload), final) + mask + body)


@pytest.fixture
def bridge():
    """(the bridge process, its port)"""
    port = free_port()
    proc = start_bridge(port, POLICY)
    yield proc, port
    proc.stop()


def test_giant_jpeg_header_is_refused_before_decoding(bridge):
    bridge, port = bridge
    driver = Driver(port)
    driver.drive(2)
    peak_before = peak_memory_mb(bridge.p.pid)
    giant = base64.b64encode(hostile_jpegs.giant()).decode()  # 630 bytes claiming 30000 x 30000
    assert driver.ask(telemetry(giant)) == SAFE               # decoded, it took ~15 s and ~5 GB
    assert driver.ask(telemetry(base64.b64encode(hostile_jpegs.rotated()).decode())) == SAFE
    driver.drive(3)                                            # 0.5, then -0.25: nothing was reset
    assert peak_memory_mb(bridge.p.pid) - peak_before < 100
    driver.close()
    bridge.wait_for("simulator disconnected")
    bridge.stop()
    assert bridge.json_summary()["malformed_kinds"] == {"wrong_image_size": 2}


def test_second_clients_and_stray_connection_events_leave_the_driving_car_alone(capsys):
    port = free_port()
    bridge = start_bridge(port, POLICY, extra=["--exit-on-disconnect"])
    try:
        driver = Driver(port)
        driver.drive(2)
        # a second simulator, on either transport, is refused while the first one drives
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(websocket_url(port), timeout=5)
        assert refused.value.status_code == 401
        assert http_request(port, "GET", "/socket.io/?EIO=3&transport=polling")[0] == 401
        # the emulator's CLI says why, in one line
        assert cli_main(["sim", "udacity-emulator", "--port", str(port), "--frames", "3"]) == 2
        assert "another simulator is driving" in capsys.readouterr().err.strip().splitlines()[-1]
        # a page in a browser, from another origin
        with pytest.raises(websocket.WebSocketBadStatusException) as cross_origin:
            websocket.create_connection(websocket_url(port), timeout=5, origin="http://attacker.example")
        assert cross_origin.value.status_code == 400
        # on the driving connection: a repeated namespace CONNECT, client events named like the
        # connection handlers, and a binary packet announcing attachments
        for packet in ("40", '42["connect",{}]', '42["disconnect"]', '451-["telemetry",{"_placeholder":true,"num":0}]'):
            driver.ws.send(packet)
        driver.ws.send_binary(b"\x04" + bytes(1000))
        driver.drive(3)                      # no reset: 0.5 once more, then -0.25
        assert bridge.p.poll() is None       # the fake disconnect did not end an --exit-on-disconnect bridge
        driver.close()
        assert bridge.p.wait(20) == 0        # the real one did
    finally:
        bridge.stop()
    summary = bridge.json_summary()
    assert (summary["connects"], summary["refused"], summary["disconnects"]) == (1, 3, 1)
    assert summary["messages"] == summary["answered"] == 5 and summary["malformed"] == 0


def test_idle_connections_are_dropped_and_cannot_lock_the_simulator_out():
    # With 200 file descriptors the bridge can hold fewer connections than the attack opens:
    # before, eventlet's accept loop died on EMFILE and the bridge stopped listening for good.
    port = free_port()
    bridge = start_bridge(port, POLICY, max_open_files=200)
    idle = []
    try:
        for _ in range(400):   # connect and send nothing
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            idle.append(s)
        time.sleep(0.5)
        report = run_emulator(EmulatorConfig(port=port, frames=10, answer_timeout=30))
        assert report.telemetry_sent == 10 and not report.no_answer
        assert report.steering[:6] == pytest.approx([0.0, 0.5, 0.5, 0.5, -0.25, -0.25])
        # the server closes the idle connections it accepted
        dropped, deadline = set(), time.time() + IDLE_TIMEOUT_S + 5
        while time.time() < deadline and len(dropped) < 100:
            for k, s in enumerate(idle):
                try:
                    if s.recv(1) == b"":
                        dropped.add(k)
                except BlockingIOError:
                    pass
                except OSError:
                    dropped.add(k)
            time.sleep(0.2)
        assert len(dropped) >= 100
        assert bridge.p.poll() is None and not any("stopped listening" in line for line in bridge.err)
    finally:
        for s in idle:
            s.close()
        bridge.stop()


def test_errors_reach_no_client_as_a_traceback(bridge):
    bridge, port = bridge
    # engineio opened an unusable session for this request and eventlet answered 500 with a traceback
    status, body = http_request(port, "GET", "/socket.io/?EIO=3&transport=websocket")
    assert status == 400 and b"Traceback" not in body and b".py" not in body
    driver = Driver(port)                # that request took no seat
    driver.drive(2)
    # asking to upgrade the driver's (already upgraded) session makes engineio raise
    status, body = http_request(port, "GET", f"/socket.io/?EIO=3&transport=polling&sid={driver.sid}",
                                {"Connection": "Upgrade", "Upgrade": "websocket"})
    assert status == 500 and body == b""
    driver.drive(3)


def test_oversized_messages_are_refused_on_every_transport(bridge):
    bridge, port = bridge
    # websocket, one frame: refused from its header, before its payload is read
    attacker = SocketIOClient(port)
    attacker.ws.sock.sendall(masked_frame_header(1, 2 * MAX_MESSAGE_BYTES, final=True))
    assert close_code(attacker.ws) == 1009
    attacker.close()
    bridge.wait_for("simulator disconnected", count=1)   # the seat is free again
    # websocket, fragments each under the limit, together one byte over it
    attacker = SocketIOClient(port)
    half = MAX_MESSAGE_BYTES // 2
    send_fragment(attacker.ws, 1, b"4" * half, final=False)
    send_fragment(attacker.ws, 0, b"2" * half, final=False)
    send_fragment(attacker.ws, 0, b"x", final=True)
    assert close_code(attacker.ws) == 1009
    attacker.close()
    bridge.wait_for("simulator disconnected", count=2)
    # polling: a POST announcing more than the limit is answered at once, its body unread
    status, body = http_request(port, "GET", "/socket.io/?EIO=3&transport=polling")
    sid = re.search(rb'"sid":"(\w+)"', body).group(1).decode()
    session = f"/socket.io/?EIO=3&transport=polling&sid={sid}"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"POST {session} HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                  f"Content-Length: {8 * MAX_MESSAGE_BYTES}\r\n\r\n".encode() + b"x" * 65536)
        assert s.recv(100).startswith(b"HTTP/1.1 413")
    # the session still works: its close packet ("1", framed "1:1") ends it
    assert http_request(port, "POST", session, {"Content-Type": "text/plain"}, b"1:1")[0] == 200
    bridge.wait_for("simulator disconnected", count=3)
    # each attacker held the seat and lost it with its connection: the simulator drives
    driver = Driver(port)
    driver.drive(5)
    driver.close()
    bridge.wait_for("simulator disconnected", count=4)
    bridge.stop()
    summary = bridge.json_summary()
    assert summary["connects"] == 4 and summary["messages"] == 5 and summary["malformed"] == 0


def seconds_until_a_driver_drives(port: int, since: float, limit: float = IDLE_TIMEOUT_S + 1) -> float | None:
    """Seconds from ``since`` until a well-behaved simulator gets the seat and drives (None
    if it is still refused after ``limit`` s); the driver is left connected-then-closed."""
    while time.monotonic() - since < limit:
        try:
            driver = Driver(port)
        except websocket.WebSocketBadStatusException as e:
            assert e.status_code == 401
            time.sleep(0.1)
            continue
        elapsed = time.monotonic() - since
        driver.drive(4)                 # from a reset policy: 0.5 x3, then -0.25
        driver.close()
        return elapsed
    return None


def _handshake_then_close(head: bytes):
    def attack(port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(head)
            assert s.recv(100).startswith(b"HTTP/1.1 200")   # engineio opened a session: it took the seat
    return attack


def _handshake_kept_open(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /socket.io/?EIO=3&transport=polling HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.1 200")
    return s                                                 # and never polls, posts or upgrades


def _silent_websocket(port):
    return SocketIOClient(port)                              # opens, hears the connect command, says nothing


SEAT_ATTACKS = {
    # before: the seat came back after 60.0 s (engineio's ping timeout) in each case
    "request_line_then_close": _handshake_then_close(b"GET /socket.io/?EIO=3&transport=polling HTTP/1.0\r\n\r\n"),
    "one_header_then_close": _handshake_then_close(
        b"GET /socket.io/?EIO=3&transport=polling HTTP/1.1\r\nHost: x\r\n\r\n"),
    "handshake_that_vanishes": _handshake_kept_open,
    "silent_websocket": _silent_websocket,
}


@pytest.mark.parametrize("attack", sorted(SEAT_ATTACKS))
def test_a_connection_that_sends_no_telemetry_gives_the_seat_back_within_the_idle_timeout(bridge, attack):
    bridge, port = bridge
    held = SEAT_ATTACKS[attack](port)
    since = time.monotonic()
    with pytest.raises(websocket.WebSocketBadStatusException):   # the attacker holds the seat...
        websocket.create_connection(websocket_url(port), timeout=5)
    took = seconds_until_a_driver_drives(port, since)            # ...for IDLE_TIMEOUT_S, no longer
    assert took is not None and took <= IDLE_TIMEOUT_S + 1, took
    bridge.wait_for("simulator disconnected", count=2)
    bridge.stop()
    if held is not None:
        held.close()
    summary = bridge.json_summary()
    assert (summary["connects"], summary["disconnects"]) == (2, 2)
    assert summary["refused"] >= 1 and summary["messages"] == 4


def test_a_message_nested_100k_deep_is_dropped_and_the_driver_drives_on(bridge):
    """A 200 kB telemetry of 100,000 nested arrays, under the size cap, reached json.loads, whose
    recursion ended in a RecursionError inside python-socketio; every JSON the bridge reads is
    now parsed with its depth bounded (nac_drive.io.bounded_json)."""
    bridge, port = bridge
    driver = Driver(port)
    driver.drive(2)
    deep = "[" * 100_000 + "]" * 100_000
    assert len(deep) < MAX_MESSAGE_BYTES
    driver.ws.send('42["telemetry",' + deep + "]")
    driver.drive(3)   # the same connection, its count untouched: the deep message was no frame
    bridge.stop()
    err = "".join(bridge.err)
    assert "RecursionError" not in err and "Traceback" not in err, err[-2000:]
