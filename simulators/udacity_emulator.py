"""Headless stand-in for the Udacity Term-1 simulator: same wire protocol, procedural road.

On the wire it behaves like the simulator's Unity Socket.IO client, byte for byte where it
matters (implemented by hand on a plain websocket, not with a Socket.IO client library,
so that it reproduces the Unity client's quirks rather than a spec-compliant client's):

- connects to ``ws://HOST:PORT/socket.io/?EIO=4&transport=websocket`` (websocket only, no
  polling handshake);
- never sends the Socket.IO namespace CONNECT packet ``40``: the Unity client speaks
  Socket.IO v2 semantics and considers itself connected to "/" as soon as the Engine.IO
  ``0`` open packet arrives. python-socketio 4.x accepts this; 5.x waits for ``40`` and
  drops every event of the client ("not connected to namespace /");
- sends its own Engine.IO pings (``2``) every ``ping_interval`` seconds and does not
  answer server pings (a v2 client never receives any);
- sends one ``telemetry`` on connect and exactly one after each ``steer`` or ``manual``
  it receives (strict lockstep), as ``42["telemetry",{...}]`` with every value a string
  (``"%.4f"``, or with a decimal comma when ``decimal_comma``), the centre camera as a
  base64 JPEG 320x160, and ``{}`` while a human is driving (``human`` mode, while the
  scripted human holds the throttle key);
- like Unity's ``float.Parse(field.str)``, a ``steer`` whose values are not strings is
  not understood: the emulator stalls (sends nothing) as the simulator does.

Each received command moves the car one step (``dt`` seconds of simulated time) with a
kinematic bicycle model: the emulator holds a gymnasium env
(:class:`~nac_drive.simulators.udacity_env.UdacityEmulatorEnv`, the same car, track and
camera) and steps it. It reports cross-track error, laps and off-road events, and can show
them live on stderr (``progress``). ``record_training`` writes training-mode recordings
(three cameras) driven by a noisy pure-pursuit driver through the same env, without any
server.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import numpy as np

from nac_drive.io import bounded_json
from nac_drive.simulators.udacity_env import DEFAULT_JPEG_QUALITY, UdacityEmulatorEnv, encode_jpeg
from nac_drive.simulators.udacity_track import MAX_STEER_DEG, Car, Progress, Track, pure_pursuit

SIDE_CAMERA_OFFSET = 0.8  # m, lateral offset of the left/right cameras in recordings (about the Udacity rig)


def format_number(value: float, decimal_comma: bool = False) -> str:
    """The simulator's number format: 4 decimals, locale-dependent decimal separator."""
    text = f"{value:.4f}"
    return text.replace(".", ",") if decimal_comma else text


def event_packet(name: str, data) -> str:
    """A Socket.IO EVENT inside an Engine.IO MESSAGE: ``42["name",{...}]``."""
    return "42" + json.dumps([name, data], separators=(",", ":"))


class ScriptedDriver:
    """Pure pursuit on the centre line with a speed P-controller and optional steering
    noise (Ornstein-Uhlenbeck, so the car wanders and the clean label teaches recovery)."""

    def __init__(self, track: Track, speed_mph: float = 9.0, noise: float = 0.0, seed: int = 0):
        self.track = track
        self.speed_mph = speed_mph
        self.noise = noise
        self.rng = np.random.default_rng(seed)
        self.n = 0.0

    def act(self, car: Car, index: int) -> tuple[float, float, float]:
        """(clean steering label, steering to execute, throttle)."""
        label = pure_pursuit(self.track, car, index, lookahead=max(5.0, 1.2 * car.speed))
        self.n = 0.92 * self.n + self.noise * 0.4 * self.rng.normal()
        throttle = float(np.clip(0.3 * (self.speed_mph - car.speed_mph), -1, 1))
        return label, float(np.clip(label + self.n, -1, 1)), throttle


@dataclass
class EmulatorConfig:
    """Options of a live emulator run (``nac-drive sim udacity-emulator``)."""

    host: str = "127.0.0.1"
    port: int = 4567
    track: str = "lakeside"  # name in TRACKS or random-<seed>, either with -cw (mirrored, driven clockwise)
    start: float = 0.0  # start position, metres along the centre line
    frames: int | None = None  # stop after this many telemetry messages (None: no limit)
    laps: float | None = None  # stop after this many laps
    dt: float = 1 / 15  # simulated seconds per received command
    human: bool = False  # a scripted human drives; `{}` while it holds the throttle key
    human_speed_mph: float = 9.0
    decimal_comma: bool = False  # format numbers as "12,3456" (simulator under a comma locale)
    jpeg_quality: int = DEFAULT_JPEG_QUALITY
    ping_interval: float = 25.0  # s between the client's own Engine.IO pings
    answer_timeout: float = 5.0  # s without any answer -> give up (reported as no_answer)
    expect_connect_command: bool = True  # the server sends one command on connect (not an answer)
    # Unity answers that connect command with a telemetry too, so two telemetry/command chains
    # run interleaved. single_chain (benchmarks only) ignores it: one message in flight, and
    # the round trip no longer includes the emulator rendering the other chain's frame.
    single_chain: bool = False
    send_namespace_connect: bool = False  # diagnostic only: send "40" like a v3+ client (Unity never does)
    stop_off_road: bool = False  # stop at the first off-road event
    # an extra telemetry field the Unity simulator does not send: "cte", the signed cross-track
    # error (metres, + right of the centre line), which the bridge hands to the driver's trace
    send_cte: bool = True
    # Pace the steps to the wall clock (one step per dt), as the real simulator runs. Without it
    # the emulator runs as fast as the bridge answers, so a policy that reads the wall-clock
    # arrival times as its time stamps sees frames much closer together than in recordings.
    realtime: bool = False
    seed: int = 0
    progress: bool = False  # show laps, distance and cross-track error live on stderr


class LiveStatus:
    """Laps, distance and cross-track error of a run, live on stderr: a tqdm bar counting
    metres (toward ``laps`` laps when given), redrawn at most every ``interval`` seconds."""

    def __init__(self, track: Track, laps: float | None = None, interval: float = 0.5):
        from tqdm import tqdm

        total = laps * track.length if laps else None
        bar_format = ("{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} m [{elapsed}<{remaining}{postfix}]"
                      if total else "{desc}: {n:.0f} m [{elapsed}{postfix}]")
        self.bar = tqdm(total=total, desc=track.spec.name, bar_format=bar_format, file=sys.stderr,
                        mininterval=interval)
        self.interval = interval
        self._shown = 0.0

    def update(self, progress: Progress, steps: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._shown < self.interval:
            return
        self._shown = now
        mean = float(np.mean(progress.abs_cte)) if progress.abs_cte else 0.0
        self.bar.n = progress.travelled if self.bar.total is None else min(progress.travelled, self.bar.total)
        self.bar.set_postfix_str(f"laps {progress.travelled / progress.track.length:.2f}, step {steps}, "
                                 f"cte {progress.cte:+.2f} m, mean |cte| {mean:.3f} m, "
                                 f"off-road {progress.off_road_events}", refresh=False)
        self.bar.refresh()

    def close(self, progress: Progress, steps: int) -> None:
        self.update(progress, steps, force=True)
        self.bar.close()


@dataclass
class EmulatorReport:
    """What a run measured; ``as_dict`` is the JSON summary."""

    track: str
    telemetry_sent: int = 0
    manual_sent: int = 0  # `{}` telemetry (human driving)
    commands: int = 0  # steer + manual received
    steer: int = 0
    manual: int = 0
    non_string_steer: int = 0  # commands the simulator would not parse (it stalls)
    pings_sent: int = 0
    pongs: int = 0
    namespace_connect_received: bool = False
    no_answer: bool = False
    stop_reason: str = ""
    round_trip_ms: list[float] = field(default_factory=list)
    progress: dict = field(default_factory=dict)
    steering: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("round_trip_ms", "steering", "progress")}
        rt = np.array(self.round_trip_ms) if self.round_trip_ms else None
        d["round_trip_ms_p50"] = None if rt is None else round(float(np.percentile(rt, 50)), 3)
        d["round_trip_ms_p95"] = None if rt is None else round(float(np.percentile(rt, 95)), 3)
        d.update(self.progress)
        return d


class UdacityEmulator:
    """A Unity-exact Udacity simulator client over a plain websocket."""

    def __init__(self, cfg: EmulatorConfig):
        self.cfg = cfg
        self.env = UdacityEmulatorEnv(track=cfg.track, start=cfg.start, dt=cfg.dt, jpeg_quality=cfg.jpeg_quality)
        self.env.reset()
        self.human = ScriptedDriver(self.track, cfg.human_speed_mph, seed=cfg.seed) if cfg.human else None
        self.report = EmulatorReport(track=cfg.track)
        self._ws = None
        self._send_lock = threading.Lock()
        self._sent_at: deque[float] = deque()
        self._stop = threading.Event()
        self._t0 = 0.0  # wall-clock start of the run (perf_counter), for --realtime pacing
        self._status: LiveStatus | None = None

    @property
    def url(self) -> str:
        return f"ws://{self.cfg.host}:{self.cfg.port}/socket.io/?EIO=4&transport=websocket"

    # ---- the car (the env's) --------------------------------------------------------
    @property
    def track(self) -> Track:
        return self.env.track

    @property
    def car(self) -> Car:
        return self.env.car

    @property
    def progress(self) -> Progress:
        return self.env.progress

    def _step(self, command: tuple[float, float] | None) -> None:
        """Apply a received steer (steering, throttle), or the human's controls on manual."""
        if command is None:
            if self.human is not None:
                _, steer, throttle = self.human.act(self.car, self.progress.index)
            else:
                steer, throttle = self.car.steer, self.car.throttle
        else:
            steer, throttle = command
        self.env.step((steer, throttle))  # off the road the env terminates; the simulator drives on
        self.report.steering.append(self.car.steer)
        if self._status is not None:
            self._status.update(self.progress, self.report.commands)

    def telemetry(self) -> dict:
        """The telemetry the simulator would send in the current state."""
        if self.human is not None and self.car.speed_mph < self.cfg.human_speed_mph - 1.0:
            return {}  # the human holds the throttle key: the simulator sends an empty object
        c = self.cfg.decimal_comma
        return {
            "steering_angle": format_number(self.car.steer * MAX_STEER_DEG, c),
            "throttle": format_number(self.car.throttle, c),
            "speed": format_number(self.car.speed_mph, c),
            "image": base64.b64encode(self.env.frame_jpeg).decode("ascii"),
            **({"cte": format_number(self.progress.cte, c)} if self.cfg.send_cte else {}),
        }

    # ---- the wire -----------------------------------------------------------------
    def _send(self, text: str) -> None:
        with self._send_lock:
            self._ws.send(text)

    def _send_telemetry(self) -> None:
        data = self.telemetry()
        self.report.telemetry_sent += 1
        self.report.manual_sent += not data
        self._sent_at.append(time.perf_counter())
        self._send(event_packet("telemetry", data))

    def _pinger(self) -> None:
        while not self._stop.wait(self.cfg.ping_interval):
            try:
                self._send("2")
                self.report.pings_sent += 1
            except Exception:
                return

    def _done(self) -> str | None:
        cfg, r = self.cfg, self.report
        if cfg.frames is not None and r.telemetry_sent >= cfg.frames:
            return "frames"
        if cfg.laps is not None and self.progress.travelled >= cfg.laps * self.track.length:
            return "laps"
        if cfg.stop_off_road and self.progress.off_road_events:
            return "off_road"
        return None

    def run(self) -> EmulatorReport:
        """Connect, drive until a stop condition or the server closes, return the report.
        Raises ``OSError`` when it cannot connect (``ConnectionRefusedError`` when the
        server refuses the handshake, as the bridge does while another client drives)."""
        try:
            import websocket
        except ImportError as e:
            from nac_drive.simulators.udacity_bridge import MissingUdacityExtra

            raise MissingUdacityExtra(str(e)) from None

        cfg, r = self.cfg, self.report
        silent = TimeoutError(f"{self.url}: no answer within {cfg.answer_timeout:g} s (is a Udacity bridge "
                              "listening there?)")
        try:
            self._ws = websocket.create_connection(self.url, timeout=cfg.answer_timeout)
        except websocket.WebSocketBadStatusException as e:
            busy = ": another simulator is driving" if e.status_code == 401 else ""
            raise ConnectionRefusedError(f"the server refused the connection (HTTP {e.status_code}){busy}") from None
        except websocket.WebSocketTimeoutException:   # a port that accepts and never answers the handshake
            raise silent from None
        try:
            try:
                opening = self._ws.recv()
            except websocket.WebSocketTimeoutException:
                raise silent from None
            if not isinstance(opening, str) or not opening.startswith("0"):
                raise ConnectionError(f"expected the Engine.IO open packet '0{{...}}', got {opening!r:.80}")
            if cfg.send_namespace_connect:
                self._send("40")
            threading.Thread(target=self._pinger, daemon=True).start()
            if cfg.progress:
                self._status = LiveStatus(self.track, cfg.laps)
            self._t0 = time.perf_counter()
            self._send_telemetry()
            r.stop_reason = self._loop()
        finally:
            self._stop.set()
            if self._status is not None:
                self._status.close(self.progress, r.commands)
            try:
                self._ws.close()
            except Exception:
                pass
        r.progress = self.progress.summary()
        return r

    def _loop(self) -> str:
        import websocket

        r = self.report
        skip_first = self.cfg.expect_connect_command
        while True:
            try:
                msg = self._ws.recv()
            except websocket.WebSocketTimeoutException:
                r.no_answer = True
                return "no_answer"
            except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError):
                return "server_closed"
            if not msg:
                return "server_closed"
            if msg.startswith("3"):
                r.pongs += 1
            elif msg == "40" or msg.startswith("40{") or msg.startswith("40,"):
                r.namespace_connect_received = True
            elif msg.startswith("1") or msg.startswith("41"):
                return "server_closed"
            elif msg.startswith("42"):
                command = self._parse_event(msg[2:])
                if command is False:
                    continue  # not a command, or a steer Unity could not parse: stall
                now = time.perf_counter()
                if skip_first:
                    skip_first = False
                    if self.cfg.single_chain:
                        continue
                elif self._sent_at:
                    r.round_trip_ms.append((now - self._sent_at.popleft()) * 1000)
                r.commands += 1
                self._step(command)
                reason = self._done()
                if reason:
                    return reason
                if self.cfg.realtime:
                    time.sleep(max(0.0, self._t0 + r.commands * self.cfg.dt - time.perf_counter()))
                try:
                    self._send_telemetry()
                except (websocket.WebSocketConnectionClosedException, ConnectionError, OSError):
                    return "server_closed"   # the server went away between its answer and our next frame

    def _parse_event(self, payload: str):
        """(steering, throttle) for steer, None for manual, False for anything else."""
        try:
            name, *rest = bounded_json.loads(payload)
        except (ValueError, TypeError):
            return False
        data = rest[0] if rest else {}
        if name == "manual":
            self.report.manual += 1
            return None
        if name != "steer":
            return False
        try:
            # Unity: float.Parse(json.GetField("steering_angle").str): a JSON number has no .str
            steer_s, throttle_s = data["steering_angle"], data["throttle"]
            if not isinstance(steer_s, str) or not isinstance(throttle_s, str):
                raise TypeError
            command = float(steer_s), float(throttle_s)
        except (KeyError, TypeError, ValueError):
            self.report.non_string_steer += 1
            return False
        self.report.steer += 1
        return command


def run_emulator(cfg: EmulatorConfig) -> EmulatorReport:
    return UdacityEmulator(cfg).run()


def record_training(out_dir, track: str = "lakeside", frames: int = 1000, seed: int = 0, speed_mph: float = 9.0,
                    noise: float = 0.3, dt: float = 1 / 15, start: float | None = None,
                    start_time: _dt.datetime | None = None, progress_bar: bool = True) -> dict:
    """Write a training-mode recording (driving_log.csv + IMG/ with center/left/right).

    The car is driven by ``ScriptedDriver`` with steering noise; the recorded steering is
    the clean pure-pursuit label for the frame's state. Image time stamps advance by
    ``dt`` (15 Hz by default) from ``start_time``. Returns the run's progress summary.
    """
    from tqdm import tqdm

    from nac_drive.data_collection.udacity_log import DrivingLogWriter

    env = UdacityEmulatorEnv(track=track, start=start, dt=dt)
    env.reset(seed=seed, options={"speed_mph": speed_mph})   # start=None: a place drawn from the seed
    driver = ScriptedDriver(env.track, speed_mph, noise, seed)
    when = start_time or _dt.datetime(2026, 1, 1, 12, 0, 0) + _dt.timedelta(minutes=seed % 1000)
    with DrivingLogWriter(out_dir) as writer:
        for k in tqdm(range(frames), desc=f"recording {track}", disable=not progress_bar):
            car, progress = env.car, env.progress
            label, steer, throttle = driver.act(car, progress.index)
            if abs(progress.cte) > env.track.half_width - 1.0:
                steer = label  # keep the noise from taking the car off the road
            sides = [encode_jpeg(env.renderer.render(car.x, car.y, car.heading, lateral=off))
                     for off in (-SIDE_CAMERA_OFFSET, SIDE_CAMERA_OFFSET)]
            writer.write(env.frame_jpeg, label, max(throttle, 0.0), max(-throttle, 0.0), car.speed_mph,
                         left=sides[0], right=sides[1], when=when + _dt.timedelta(seconds=k * dt))
            env.step((steer, throttle))
    summary = env.progress.summary()
    summary.update(frames=frames, track=track, out_dir=str(writer.out_dir))
    return summary
