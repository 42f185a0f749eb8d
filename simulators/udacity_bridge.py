"""Socket.IO bridge between the Udacity Term-1 simulator and a driving policy.

The simulator is the Socket.IO *client*. It connects to
``ws://127.0.0.1:4567/socket.io/?EIO=4&transport=websocket``, sends ``telemetry`` once on
connect and once after every ``steer``/``manual`` it receives (strict lockstep), and
expects ``steer`` with *string* values. This module is the protocol logic: it decodes each
frame, asks the policy for a steering value, controls the speed with a PI controller,
answers every telemetry, optionally records the run in the simulator's training format,
and survives malformed telemetry. The server around it, and its limits against hostile
clients, is :mod:`nac_drive.simulators.udacity_server`.

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
going; so is a policy that raises or returns NaN. The image size is read from the JPEG
header before anything is decoded. Numbers with a decimal comma ("12,5") are valid. A
failing recording (e.g. a full disk) is logged once and driving goes on. One connection
drives at a time; others are refused while it does. A new driving connection starts
from a reset policy and speed controller.

The policy is an actor (:mod:`nac_drive.policy.actor`): ``reset()`` and ``act(obs) -> float``
(steering in [-1, 1], positive = right), ``obs = {"image": uint8 RGB [160, 320, 3],
"timestamp": float seconds (monotonic, arrival of the telemetry), "speed": float mph,
"cte": float metres or None}`` (``cte``: the cross-track error, which the headless emulator
sends and the Unity simulator does not).
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np

from nac_drive.data_collection.udacity_log import DrivingLogWriter, parse_decimal
from nac_drive.io.jpeg import jpeg_size
from nac_drive.policy.tasks import UDACITY_CAMERA

log = logging.getLogger("nac_drive.udacity_bridge")

IMAGE_SHAPE = UDACITY_CAMERA   # the simulator camera: RGB [160, 320, 3]
MAX_STEER_DEG = 25.0
SAFE_STEERING, SAFE_THROTTLE = 0.0, -1.0  # steer straight, brake


class Busy(Exception):
    """A connection arrived while another one drives: it is refused."""


class MissingUdacityExtra(ValueError):
    """The socket libraries the simulator needs (the ``udacity`` extra) are missing or too new."""

    def __init__(self, why: str):
        super().__init__(f"{why}; the Udacity bridge needs the 'udacity' extra: pip install 'nac-drive[udacity]' "
                         "(python-socketio 4.6, python-engineio 3.13, eventlet)")


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
    cte: float | None = None  # metres, + right of the centre line: the emulator's extra field


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
    """base64 JPEG string -> (uint8 RGB [160, 320, 3], the JPEG bytes).

    The size the JPEG's header claims is checked before anything is decoded (a tiny file
    can claim gigapixels), and the decoded frame must have that size too."""
    import cv2

    if not isinstance(text, str):
        raise MalformedTelemetry("bad_base64", f"image is a {type(text).__name__}")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedTelemetry("bad_base64") from None
    try:
        height, width = jpeg_size(raw)
    except ValueError:
        raise MalformedTelemetry("not_jpeg") from None
    if (height, width) != IMAGE_SHAPE[:2]:
        raise MalformedTelemetry("wrong_image_size", f"{width}x{height}")
    if not raw.rstrip(b"\x00").endswith(b"\xff\xd9"):  # libjpeg decodes a cut file with a grey tail
        raise MalformedTelemetry("truncated_jpeg")
    bgr = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise MalformedTelemetry("not_jpeg")
    if bgr.shape != IMAGE_SHAPE:
        raise MalformedTelemetry("wrong_image_size", f"decoded {bgr.shape[1]}x{bgr.shape[0]}, header {width}x{height}")
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
    return Telemetry(steering, throttle, speed, image, jpeg, _optional_number(data, "cte"))


def _optional_number(data: dict, name: str) -> float | None:
    """An extra field no simulator must send: its value if it is a finite number, else None."""
    try:
        return _number(data, name)
    except MalformedTelemetry:
        return None


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


LATENCY_WINDOW = 100_000   # answers the latency percentiles cover: the last ~2 h at 15 Hz


@dataclass
class BridgeStats:
    messages: int = 0  # telemetry messages received
    answered: int = 0
    manual: int = 0  # `{}` telemetry (a human drives)
    malformed: int = 0
    malformed_kinds: Counter = field(default_factory=Counter)
    policy_errors: int = 0
    connects: int = 0
    refused: int = 0  # connections refused while another one drove
    disconnects: int = 0
    rows_recorded: int = 0
    # telemetry arrival -> steer emitted, of the last LATENCY_WINDOW answers (a list grew ~32 B a message for good)
    latency_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

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
            "refused": self.refused,
            "disconnects": self.disconnects,
            "rows_recorded": self.rows_recorded,
            "latency_ms_p50": None if lat is None else round(float(np.percentile(lat, 50)), 3),
            "latency_ms_p95": None if lat is None else round(float(np.percentile(lat, 95)), 3),
        }


class UdacityBridge:
    """Protocol logic, independent of the socket library: each handler returns the
    ``(event, data)`` to send back. With ``policy=None`` it passes the human's driving
    through (answers ``manual``) and records the car's own controls.

    One connection drives at a time: the policy and the speed controller hold the state of
    one car. A connection that arrives while another one drives is refused (:class:`Busy`)
    and touches nothing; once the driver disconnects, the next connection drives, from a
    reset policy and controller."""

    def __init__(self, policy=None, speed: float = 9.0, record_dir=None):
        self.policy = policy
        self.controller = SpeedController(speed)
        self.writer = DrivingLogWriter(record_dir) if record_dir else None
        self.stats = BridgeStats()
        self.driver: str | None = None  # id of the connection that drives
        self.driver_telemetry = 0  # telemetry messages received since the driver connected
        self._logged: set[str] = set()

    def warn_once(self, kind: str, message: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("%s (further '%s' messages are counted, not logged)", message, kind)

    def on_connect(self, sid: str) -> tuple[str, dict] | None:
        """Connection ``sid`` becomes the driver: reset, and the first command to send it.
        None when ``sid`` already drives (a repeated CONNECT packet: nothing is reset).
        Raises :class:`Busy` while another connection drives."""
        if sid == self.driver:
            return None
        if self.driver is not None:
            self.stats.refused += 1
            self.warn_once("refused", f"refused a second connection ({sid}) while {self.driver} drives")
            raise Busy(f"connection {self.driver} is driving")
        self.driver = sid
        self.driver_telemetry = 0
        self.stats.connects += 1
        self.controller.reset()
        if self.policy is not None:
            self.policy.reset()
            return "steer", steer_payload(0.0, 0.0)
        return "manual", {}

    def on_disconnect(self, sid: str) -> bool:
        """True when ``sid`` was the driver (the next connection may drive)."""
        if sid != self.driver:
            return False
        self.driver = None
        self.stats.disconnects += 1
        return True

    def seated_without_telemetry(self, sid: str) -> bool:
        """True while ``sid`` drives but has sent no telemetry yet (the server frees such a
        seat after ``IDLE_TIMEOUT_S``: the simulator sends its first telemetry on connect)."""
        return sid == self.driver and self.driver_telemetry == 0

    def on_telemetry(self, data, arrived: float | None = None) -> tuple[str, dict]:
        """Answer one telemetry; never raises. ``arrived``: time.monotonic() of arrival."""
        arrived = time.monotonic() if arrived is None else arrived
        self.stats.messages += 1
        self.driver_telemetry += 1
        try:
            tel = parse_telemetry(data)
        except MalformedTelemetry as e:
            self.stats.malformed += 1
            self.stats.malformed_kinds[e.kind] += 1
            self.warn_once(e.kind, f"malformed telemetry ({e}); answering steer 0 + brake")
            return self._answer("steer", steer_payload(SAFE_STEERING, SAFE_THROTTLE))
        if tel is None:
            self.stats.manual += 1
            return self._answer("manual", {})
        if self.policy is None:
            self._record(tel, float(np.clip(tel.steering_angle / MAX_STEER_DEG, -1, 1)), tel.throttle)
            return self._answer("manual", {})
        try:
            steering = float(self.policy.act({"image": tel.image, "timestamp": arrived, "speed": tel.speed,
                                              "cte": tel.cte}))
            if not math.isfinite(steering):
                raise ValueError(f"policy returned {steering}")
        except Exception as e:  # a broken policy must not take the connection down
            self.stats.policy_errors += 1
            self.warn_once("policy_error", f"policy failed ({type(e).__name__}: {e}); answering steer 0 + brake")
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
            self.warn_once("record_error", f"recording failed ({e}); still driving")
        self.stats.rows_recorded = self.writer.rows

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
