"""The Udacity emulator as a gymnasium environment, in-process: ``nac_drive/UdacityEmulator-v0``.

    import gymnasium as gym
    import nac_drive.simulators  # registers the id (gymnasium's convention for third-party envs)

    env = gym.make("nac_drive/UdacityEmulator-v0", track="serpentine", render_mode="rgb_array")
    obs, info = env.reset(seed=0)           # obs: uint8 RGB [160, 320, 3], the simulator's camera
    obs, reward, terminated, truncated, info = env.step([0.1, 0.3])   # [steer, throttle]

This is the same car, track and camera as ``nac-drive sim udacity-emulator``: the socket
emulator (:mod:`nac_drive.simulators.udacity_emulator`) holds one of these envs and steps
it once per command it receives. The observation is the frame the bridge decodes: the
rendered camera image, JPEG-encoded at the quality the emulator sends (85) and decoded
again (``jpeg_quality=None`` skips the round trip).

- action: ``Box(-1, 1, (2,))`` = [steering (positive right, +-1 = +-25 degrees), throttle
  (negative brakes)]; one step is ``dt`` = 1/15 s of simulated time, the simulator's rate.
- reward: metres of progress along the centre line this step (continuous, not in the
  centre line's 0.5 m point steps), scaled by ``1 - (cte / half_width)^2`` (full on the
  centre line, none at the road's edge; negative when driving backwards). A centred lap
  scores about the track's length.
- terminated: the car left the road (``|cte| > half_width``). The raw class keeps
  stepping after it (the socket emulator drives on); ``gymnasium.make`` adds a TimeLimit
  of ``MAX_EPISODE_STEPS``.
- info: ``cte_m`` (signed, positive right of the centre line), ``distance_m``, ``laps``,
  ``speed_mph``, ``off_road_events``.
- reset: the car stands on the centre line ``start`` metres along the track (``None``:
  a random place drawn from the reset seed), facing along it. ``options`` may override
  ``start`` and give an initial ``speed_mph``.

:class:`SpeedControl` turns it into a steering-only env whose throttle comes from the
bridge's PI speed controller, as ``nac-drive drive udacity`` drives.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.utils import RecordConstructorArgs

from nac_drive.simulators.udacity_track import MPH_PER_MPS, Car, Progress, Renderer, Track, track_spec

ENV_ID = "nac_drive/UdacityEmulator-v0"
MAX_EPISODE_STEPS = 3000  # 200 s at 15 Hz: a lap of any named track at the bridge's default 9 mph
DEFAULT_JPEG_QUALITY = 85  # what the emulator sends (the Unity simulator's frames are JPEG too)


def encode_jpeg(bgr: np.ndarray, quality: int = DEFAULT_JPEG_QUALITY) -> bytes:
    """BGR uint8 [H, W, 3] -> JPEG bytes."""
    import cv2

    ok, buf = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return buf.tobytes()


class UdacityEmulatorEnv(gym.Env):
    """The emulator's kinematic car on a procedural track, seen by its chase camera.

    Attributes besides gymnasium's: ``track``, ``renderer``, ``car``, ``progress`` (the
    emulator's objects, replaced on reset), ``frame_bgr`` (the current camera frame, BGR
    uint8 [160, 320, 3]) and ``frame_jpeg`` (its JPEG bytes, what the emulator sends;
    None when ``jpeg_quality`` is None).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(self, track: str = "lakeside", start: float | None = 0.0, dt: float = 1 / 15,
                 jpeg_quality: int | None = DEFAULT_JPEG_QUALITY, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode: {render_mode!r} is not one of {self.metadata['render_modes']}")
        if not 0 < dt <= 1:   # NaN and infinity fail too
            raise ValueError(f"dt: expected a frame period in (0, 1] seconds, got {dt}")
        if jpeg_quality is not None and not 1 <= jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality: must be 1..100 or None, got {jpeg_quality}")
        self.track = Track(track_spec(track))
        self.renderer = Renderer(self.track)
        self.start, self.dt, self.jpeg_quality, self.render_mode = start, dt, jpeg_quality, render_mode
        camera = self.renderer.camera
        self.observation_space = spaces.Box(0, 255, (camera.height, camera.width, 3), np.uint8)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.metadata = {**self.metadata, "render_fps": round(1 / dt)}
        self.car: Car | None = None
        self.progress: Progress | None = None
        self.frame_bgr: np.ndarray | None = None
        self.frame_jpeg: bytes | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        start = options.get("start", self.start)
        if start is None:
            start = float(self.np_random.uniform(0, self.track.length))
        x, y, heading = self.track.pose_at(float(start))
        speed_mph = float(options.get("speed_mph", 0.0))
        top_mph = Car.top_speed * MPH_PER_MPS
        if not 0 <= speed_mph <= top_mph:
            raise ValueError(f"options['speed_mph']: expected 0..{top_mph:.0f} (the simulator's top speed), "
                             f"got {speed_mph}")
        self.car = Car(x=x, y=y, heading=heading, speed=speed_mph / MPH_PER_MPS)
        self.progress = Progress(self.track, index=self.track.nearest(x, y))
        return self._observe(), self._info()

    def step(self, action):
        steer, throttle = (float(a) for a in np.asarray(action, dtype=np.float64).reshape(2))
        if not (math.isfinite(steer) and math.isfinite(throttle)):   # a NaN would stay in the car's state for good
            raise ValueError(f"action: expected finite [steer, throttle] in [-1, 1], got [{steer}, {throttle}]")
        p = self.progress
        before = p.travelled + p.along
        self.car.step(steer, throttle, self.dt)
        p.update(self.car.x, self.car.y)
        centred = 1.0 - (p.cte / self.track.half_width) ** 2
        reward = (p.travelled + p.along - before) * max(centred, 0.0)
        return self._observe(), reward, self.progress.off_road, False, self._info()

    def render(self):
        """The current camera frame, RGB uint8 [160, 320, 3], before any JPEG round trip."""
        if self.render_mode == "rgb_array" and self.frame_bgr is not None:
            return np.ascontiguousarray(self.frame_bgr[..., ::-1])
        return None

    def _observe(self) -> np.ndarray:
        """Render the current state; the observation is what the bridge would decode."""
        import cv2

        self.frame_bgr = self.renderer.render(self.car.x, self.car.y, self.car.heading)
        if self.jpeg_quality is None:
            self.frame_jpeg = None
            return cv2.cvtColor(self.frame_bgr, cv2.COLOR_BGR2RGB)
        self.frame_jpeg = encode_jpeg(self.frame_bgr, self.jpeg_quality)
        decoded = cv2.imdecode(np.frombuffer(self.frame_jpeg, np.uint8), cv2.IMREAD_COLOR)
        return cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)

    def _info(self) -> dict:
        p = self.progress
        return {"cte_m": p.cte, "distance_m": p.travelled, "laps": p.laps, "speed_mph": self.car.speed_mph,
                "off_road_events": p.off_road_events}


class SpeedControl(gym.Wrapper, RecordConstructorArgs):
    """Steering-only actions (``Box(-1, 1, (1,))``): the throttle comes from the bridge's PI
    speed controller at ``speed_mph``, fed the car's speed and the simulated time, as
    ``nac-drive drive udacity`` does with the telemetry's speed and arrival time. A
    Udacity :class:`~nac_drive.policy.DrivingPolicy` drives it directly:
    ``env.step([policy.select_action(obs)])``."""

    def __init__(self, env: gym.Env, speed_mph: float = 9.0):
        from nac_drive.simulators.udacity_bridge import SpeedController

        RecordConstructorArgs.__init__(self, speed_mph=speed_mph)
        gym.Wrapper.__init__(self, env)
        self.controller = SpeedController(speed_mph)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._time = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self.controller.reset()
        self._time = 0.0
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        steer = float(np.asarray(action, dtype=np.float64).reshape(-1)[0])
        car = self.env.unwrapped.car
        throttle = self.controller.update(car.speed_mph, self._time)
        self._time += self.env.unwrapped.dt
        return self.env.step(np.array([steer, throttle]))


def register() -> None:
    """Register ``nac_drive/UdacityEmulator-v0`` with gymnasium (``import nac_drive.simulators`` does it)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="nac_drive.simulators.udacity_env:UdacityEmulatorEnv",
                     max_episode_steps=MAX_EPISODE_STEPS)
