"""Socket.IO bridge between the Udacity Term-1 simulator and a driving policy.

The simulator is the Socket.IO *client*. It connects to
``ws://127.0.0.1:4567/socket.io/?EIO=4&transport=websocket``, sends ``telemetry`` once on
connect and once after every ``steer``/``manual`` it receives (strict lockstep), and
expects ``steer`` with *string* values. This module is the server: it decodes each frame,
asks the policy for a steering value, controls the speed with a PI controller, answers
every telemetry, optionally records the run in the simulator's training format, and
survives malformed telemetry.

Why python-socketio 4.6.x + python-engineio 3.13.x (the ``udacity`` extra) and not 5.x:
the simulator's Unity client speaks Socket.IO v2 semantics. It never sends the namespace
CONNECT packet ``40``; a v2 server treats every Engine.IO connection as connected to
"/" at once, and python-socketio 4.x does the same. python-socketio 5.x implements
Socket.IO v5, where a client is in a namespace only after sending ``40``: it drops every
event of the Unity client ("<sid> is not connected to namespace /"), so no telemetry is
ever answered and the car never moves (``tests/test_udacity_sio5.py`` shows it with the
emulator). python-engineio 3.14 added a check that rejects clients announcing ``EIO=4``
in their URL ("unsupported version of the Socket.IO or Engine.IO protocols"), which the
Unity client does although it speaks Engine.IO v3; hence python-engineio < 3.14.

Robustness: a malformed telemetry (not an object, bad base64, non-JPEG or truncated
JPEG bytes, wrong image size, missing or non-numeric fields, NaN) is answered with a
safe command (steer 0, full brake), logged once per kind, counted, and the bridge keeps
going; so is a policy that raises or returns NaN. Numbers with a decimal comma ("12,5")
are valid. A failing recording (e.g. a full disk) is logged once and driving goes on. A (re)connect of the simulator resets the policy and
the speed controller.

The policy interface: an object with ``reset()`` and ``select_action(obs) -> float``
(steering in [-1, 1], positive = right), ``obs = {"image": uint8 RGB [160, 320, 3],
"timestamp": float seconds (monotonic, arrival of the telemetry), "speed": float mph}``.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import importlib
import json
import logging
import math
import signal
import socket
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from nac_drive.data_collection.udacity_log import DrivingLogWriter, parse_decimal

log = logging.getLogger("nac_drive.udacity_bridge")

IMAGE_SHAPE = (160, 320, 3)
MAX_STEER_DEG = 25.0
SAFE_STEERING, SAFE_THROTTLE = 0.0, -1.0  # steer straight, brake


class MalformedTelemetry(ValueError):
    """A telemetry message the bridge cannot use; ``kind`` names what was wrong."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass
class Telemetry:
    steering_angle: float  # degrees, the car's current wheel angle
    throttle: float
    speed: float  # mph
    image: np.ndarray  # uint8 RGB [160, 320, 3]
    jpeg: bytes  # the frame as the simulator sent it


def _number(data: dict, name: str) -> float:
    if name not in data:
        raise MalformedTelemetry(f"missing_{name}")
    try:
        value = parse_decimal(data[name])
    except (ValueError, TypeError):
        raise MalformedTelemetry(f"non_numeric_{name}", repr(data[name])[:40]) from None
    if not math.isfinite(value):
        raise MalformedTelemetry(f"nan_{name}", repr(data[name])[:40])
    return value


def decode_image(text) -> tuple[np.ndarray, bytes]:
    """base64 JPEG string -> (uint8 RGB [160, 320, 3], the JPEG bytes)."""
    import cv2

    if not isinstance(text, str):
        raise MalformedTelemetry("bad_base64", f"image is a {type(text).__name__}")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedTelemetry("bad_base64") from None
    bgr = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR) if raw else None
    if bgr is None or not raw.startswith(b"\xff\xd8"):
        raise MalformedTelemetry("not_jpeg")
    if not raw.rstrip(b"\x00").endswith(b"\xff\xd9"):  # libjpeg decodes a cut file with a grey tail
        raise MalformedTelemetry("truncated_jpeg")
    if bgr.shape != IMAGE_SHAPE:
        raise MalformedTelemetry("wrong_image_size", f"{bgr.shape[1]}x{bgr.shape[0]}")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), raw


def parse_telemetry(data) -> Telemetry | None:
    """Validate one telemetry payload; None means manual driving (``{}``)."""
    if not isinstance(data, dict):
        raise MalformedTelemetry("not_an_object", type(data).__name__)
    if not data:
        return None
    steering = _number(data, "steering_angle")
    throttle = _number(data, "throttle")
    speed = _number(data, "speed")
    if "image" not in data:
        raise MalformedTelemetry("missing_image")
    image, jpeg = decode_image(data["image"])
    return Telemetry(steering, throttle, speed, image, jpeg)


def steer_payload(steering: float, throttle: float) -> dict:
    """The ``steer`` event data: values must be strings (the simulator ignores numbers)."""
    return {"steering_angle": f"{steering:.6f}", "throttle": f"{throttle:.6f}"}


class SpeedController:
    """PI controller from speed (mph) to throttle in [-1, 1], with anti-windup."""

    def __init__(self, set_speed: float, kp: float = 0.1, ki: float = 0.05):
        self.set_speed, self.kp, self.ki = set_speed, kp, ki
        self.reset()

    def reset(self) -> None:
        self.integral = 0.0
        self.last_t: float | None = None

    def update(self, speed: float, t: float) -> float:
        error = self.set_speed - speed
        dt = 0.0 if self.last_t is None else min(max(t - self.last_t, 0.0), 0.2)
        self.last_t = t
        out = self.kp * error + self.ki * (self.integral + error * dt)
        if -1.0 < out < 1.0:  # integrate only when not saturated (anti-windup)
            self.integral += error * dt
        return float(np.clip(out, -1.0, 1.0))


@dataclass
class BridgeStats:
    messages: int = 0  # telemetry messages received
    answered: int = 0
    manual: int = 0  # `{}` telemetry (a human drives)
    malformed: int = 0
    malformed_kinds: Counter = field(default_factory=Counter)
    policy_errors: int = 0
    connects: int = 0
    disconnects: int = 0
    rows_recorded: int = 0
    latency_ms: list[float] = field(default_factory=list)  # telemetry arrival -> steer emitted

    def summary(self) -> dict:
        lat = np.array(self.latency_ms) if self.latency_ms else None
        return {
            "messages": self.messages,
            "answered": self.answered,
            "manual": self.manual,
            "malformed": self.malformed,
            "malformed_kinds": dict(sorted(self.malformed_kinds.items())),
            "policy_errors": self.policy_errors,
            "connects": self.connects,
            "disconnects": self.disconnects,
            "rows_recorded": self.rows_recorded,
            "latency_ms_p50": None if lat is None else round(float(np.percentile(lat, 50)), 3),
            "latency_ms_p95": None if lat is None else round(float(np.percentile(lat, 95)), 3),
        }


class UdacityBridge:
    """Protocol logic, independent of the socket library: each handler returns the
    ``(event, data)`` to send back. With ``policy=None`` it passes the human's driving
    through (answers ``manual``) and records the car's own controls."""

    def __init__(self, policy=None, speed: float = 9.0, record_dir=None):
        self.policy = policy
        self.controller = SpeedController(speed)
        self.writer = DrivingLogWriter(record_dir) if record_dir else None
        self.stats = BridgeStats()
        self._logged: set[str] = set()

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s (further '%s' messages are counted, not logged)", message, kind)

    def on_connect(self) -> tuple[str, dict]:
        self.stats.connects += 1
        self.controller.reset()
        if self.policy is not None:
            self.policy.reset()
            return "steer", steer_payload(0.0, 0.0)
        return "manual", {}

    def on_disconnect(self) -> None:
        self.stats.disconnects += 1

    def on_telemetry(self, data, arrived: float | None = None) -> tuple[str, dict]:
        """Answer one telemetry; never raises. ``arrived``: time.monotonic() of arrival."""
        arrived = time.monotonic() if arrived is None else arrived
        self.stats.messages += 1
        try:
            tel = parse_telemetry(data)
        except MalformedTelemetry as e:
            self.stats.malformed += 1
            self.stats.malformed_kinds[e.kind] += 1
            self._warn_once(e.kind, f"malformed telemetry ({e}); answering steer 0 + brake")
            return self._answer("steer", steer_payload(SAFE_STEERING, SAFE_THROTTLE))
        if tel is None:
            self.stats.manual += 1
            return self._answer("manual", {})
        if self.policy is None:
            self._record(tel, float(np.clip(tel.steering_angle / MAX_STEER_DEG, -1, 1)), tel.throttle)
            return self._answer("manual", {})
        try:
            steering = float(self.policy.select_action({"image": tel.image, "timestamp": arrived, "speed": tel.speed}))
            if not math.isfinite(steering):
                raise ValueError(f"policy returned {steering}")
        except Exception as e:  # a broken policy must not take the connection down
            self.stats.policy_errors += 1
            self._warn_once("policy_error", f"policy failed ({type(e).__name__}: {e}); answering steer 0 + brake")
            return self._answer("steer", steer_payload(SAFE_STEERING, SAFE_THROTTLE))
        steering = float(np.clip(steering, -1.0, 1.0))
        throttle = self.controller.update(tel.speed, arrived)
        self._record(tel, steering, throttle)
        return self._answer("steer", steer_payload(steering, throttle))

    def _answer(self, event: str, data: dict) -> tuple[str, dict]:
        self.stats.answered += 1
        return event, data

    def _record(self, tel: Telemetry, steering: float, throttle: float) -> None:
        if self.writer is None:
            return
        try:
            self.writer.write(tel.jpeg, steering, max(throttle, 0.0), max(-throttle, 0.0), tel.speed)
        except OSError as e:  # never stall the simulator because of the disk
            self._warn_once("record_error", f"recording failed ({e}); still driving")
        self.stats.rows_recorded = self.writer.rows

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _apply_mask_numpy(data, mask, length=None, offset=0):
    """XOR websocket payload bytes with the 4-byte client mask (vectorised)."""
    n = len(data) if length is None else length
    key = np.roll(np.frombuffer(bytes(mask), np.uint8), -(offset % 4))
    return (np.frombuffer(data, np.uint8, count=n) ^ np.tile(key, n // 4 + 1)[:n]).tobytes()


def _speed_up_eventlet_unmasking() -> None:
    """eventlet unmasks every client frame byte by byte in Python: ~5 ms for one 15 kB
    telemetry frame, more than the whole decode + policy step. Replace it by the same XOR
    done with numpy (checked against the RFC 6455 definition in the tests)."""
    import eventlet.websocket as ews

    ews.RFC6455WebSocket._apply_mask = staticmethod(_apply_mask_numpy)


def serve(bridge: UdacityBridge, host: str = "127.0.0.1", port: int = 4567,
          exit_on_disconnect: bool = False, ready=None) -> None:
    """Run the Socket.IO server until Ctrl-C / SIGTERM (or the first disconnect when
    ``exit_on_disconnect``). ``ready(port)`` is called once the socket listens."""
    import warnings

    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    # our own log lines only: the socket libraries log every packet at INFO
    logging.getLogger("socketio").setLevel(logging.WARNING)
    logging.getLogger("engineio").setLevel(logging.WARNING)
    try:
        import eventlet
        import eventlet.event
        import eventlet.wsgi
        import socketio
    except ImportError as e:
        raise SystemExit(f"the Udacity bridge needs the 'udacity' extra: pip install 'nac-drive[udacity]' ({e})")
    from importlib.metadata import version

    if int(version("python-socketio").split(".")[0]) >= 5:
        raise SystemExit("python-socketio >= 5 cannot talk to the Udacity simulator; "
                         "pip install 'nac-drive[udacity]' (python-socketio 4.6, python-engineio 3.13)")

    _speed_up_eventlet_unmasking()
    # async_handlers=False: telemetry is handled in arrival order on the connection's reader,
    # never by two green threads at once (the policy is stateful).
    sio = socketio.Server(async_mode="eventlet", async_handlers=False, logger=False, engineio_logger=False)
    stop = eventlet.event.Event()

    @sio.on("connect")
    def _connect(sid, environ):
        event, data = bridge.on_connect()
        log.info("simulator connected (%s)", sid)
        sio.emit(event, data, room=sid)

    @sio.on("telemetry")
    def _telemetry(sid, data=None):
        arrived = time.monotonic()
        event, payload = bridge.on_telemetry(data, arrived)
        sio.emit(event, payload, room=sid)
        bridge.stats.latency_ms.append((time.monotonic() - arrived) * 1000)

    @sio.on("disconnect")
    def _disconnect(sid):
        bridge.on_disconnect()
        s = bridge.stats
        print(f"simulator disconnected: {s.messages} telemetry, {s.answered} answered, {s.malformed} malformed, "
              f"{s.rows_recorded} rows recorded so far", file=sys.stderr, flush=True)
        if exit_on_disconnect and not stop.ready():
            stop.send()

    app = socketio.WSGIApp(sio)
    listener = eventlet.listen((host, port))
    # no Nagle delay for the small steer messages (accepted sockets inherit it on Linux)
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server = eventlet.spawn(eventlet.wsgi.server, listener, app, log_output=False)

    # Ctrl-C / SIGTERM only set a flag: an exception raised by a signal handler would land
    # in whichever green thread happens to run (possibly the server's) instead of here.
    signalled = []

    def _terminate(signum, frame):
        signalled.append(signum)

    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGINT, signal.SIGTERM)}
    if ready is not None:
        ready(listener.getsockname()[1])
    try:
        while not signalled and not stop.ready():
            eventlet.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.kill()
        listener.close()


def _run(bridge: UdacityBridge, host: str, port: int, json_out: bool, exit_on_disconnect: bool) -> int:
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)

    def ready(p):
        print(f"udacity bridge listening on {host}:{p} "
              f"({'driving' if bridge.policy is not None else 'passing manual driving through'}"
              f"{', recording to ' + str(bridge.writer.out_dir) if bridge.writer else ''})",
              file=sys.stderr, flush=True)

    try:
        serve(bridge, host, port, exit_on_disconnect, ready=ready)
    finally:
        bridge.close()
        summary = bridge.stats.summary()
        if json_out:
            print(json.dumps(summary), flush=True)
        else:
            print("udacity bridge summary:", flush=True)
            for k, v in summary.items():
                print(f"  {k}: {v}", flush=True)
    return 0


def drive_udacity(policy, host: str = "127.0.0.1", port: int = 4567, speed: float = 9.0,
                  record_dir=None, json_out: bool = False, exit_on_disconnect: bool = False) -> int:
    """Drive the simulator with ``policy`` (``reset()`` + ``select_action(obs)``) until
    Ctrl-C; print the summary (one JSON line with ``json_out``). Returns an exit code."""
    return _run(UdacityBridge(policy, speed, record_dir), host, port, json_out, exit_on_disconnect)


def record_udacity(out_dir, host: str = "127.0.0.1", port: int = 4567, json_out: bool = False,
                   exit_on_disconnect: bool = False) -> int:
    """Record a human's driving (pass-through: answers ``manual``) to ``out_dir``."""
    return _run(UdacityBridge(None, record_dir=out_dir), host, port, json_out, exit_on_disconnect)


def load_policy_factory(spec: str):
    """``"package.module:callable"`` -> the object ``callable()`` returns."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"--policy must look like package.module:callable, got {spec!r}")
    return getattr(importlib.import_module(module), name)()


def main(argv: list[str] | None = None) -> int:
    """Developer entry point (tests, benchmarks): drive with a policy given as module:callable.
    Users run ``nac-drive drive udacity`` / ``nac-drive record udacity``."""
    p = argparse.ArgumentParser(prog="python -m nac_drive.simulators.udacity_bridge", description=main.__doc__)
    p.add_argument("--policy", help="module:callable returning a policy; omit to record manual driving")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4567)
    p.add_argument("--speed", type=float, default=9.0, help="set speed (mph)")
    p.add_argument("--record", metavar="DIR")
    p.add_argument("--json", action="store_true")
    p.add_argument("--exit-on-disconnect", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.policy is None:
        if not args.record:
            p.error("without --policy, --record DIR is required")
        return record_udacity(args.record, args.host, args.port, args.json, args.exit_on_disconnect)
    return drive_udacity(load_policy_factory(args.policy), args.host, args.port, args.speed, args.record,
                         args.json, args.exit_on_disconnect)


if __name__ == "__main__":
    sys.exit(main())
