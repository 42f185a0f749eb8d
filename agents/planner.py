"""A privileged minimum-time planner for CarRacing: a speed profile from the track ahead.

It is the pure-pursuit teacher (``teacher.py``: the track's centre line read from the env,
pure-pursuit steering, the discrete mapping) with another target speed: the classic
minimum-time speed profile of lap-time simulation, computed once per track
(:func:`speed_profile`):

1. the curvature-limited speed ``v_max(s) = min(v_top, sqrt(a_lat / |kappa(s)|))``, with
   ``kappa`` the centre line's curvature averaged over a window (:func:`track_curvature`:
   a car cuts a bend within the road's width, so it drives a gentler one);
2. a backward pass, so that the car can brake in time:
   ``v(s) <= sqrt(v(s + ds)^2 + 2 a_brake ds)``;
3. a forward pass, the engine's limit: ``v(s + ds) <= sqrt(v(s)^2 + 2 a(v) ds)`` with
   ``a(v) = min(a_acc, power / v)``.

On the closed lap both passes start at the profile's lowest point, which no other point
constrains, so one lap each gives the periodic solution. The car's target is the lowest
profile speed within the distance it covers in ``preview`` seconds from its place on the
line; it presses gas below the target and brakes above it (plus a margin).

The limits were measured on the Box2D car with road friction under every wheel
(docs/findings.md, "A planner for CarRacing"): at most 100 units/s (Box2D moves a body at
most 2 units a step, 50 steps/s), 44 units/s^2 of acceleration at full gas up to ~80
units/s and ``power / v`` with ``power`` ~2600 x gas beyond, 170-219 units/s^2 of braking
(4 wheels x friction limit 400 / mass 7.3 = 219), lateral accelerations up to ~200 while
coasting, though a steady circle under gas spins out at 60-120 units/s^2 (power
oversteer). The settings, ``a_lat`` among them, are chosen on validation tracks
(:func:`default_config`).
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from nac_drive.agents.teacher import PurePursuitTeacher, _clip
from nac_drive.simulators.carracing import DISCRETE_GAS
from nac_drive.simulators.centre_line import segments

TOP_SPEED = 100.0   # units/s: Box2D's b2_maxTranslation (2 units a step) at 50 steps a second
ENGINE_POWER_PER_GAS = 2600.0   # (units/s)^2 per s per unit of gas: measured a * v of the car at speed


@dataclass
class PlannerConfig:
    """Limits and gains of the minimum-time planner (distances in track units, speeds in
    units/s, accelerations in units/s^2)."""

    a_lat: float = 200.0
    """lateral acceleration the car holds in a bend (sets v_max = sqrt(a_lat / |curvature|))"""
    a_brake: float = 219.0
    """deceleration the backward pass plans with (the car brakes at up to 219)"""
    a_acc: float = 44.0
    """acceleration at full gas while the rear wheels' grip limits it (measured)"""
    v_top: float = TOP_SPEED
    """speed on a straight"""
    curvature_window: float = 25.0
    """track length over which the centre line's curvature is averaged"""
    preview: float = 0.1
    """seconds ahead of the car whose lowest profile speed is the target"""
    lookahead: float = 16.0
    """pure pursuit: look-ahead distance at standstill"""
    lookahead_per_speed: float = 0.15
    """pure pursuit: extra look-ahead per unit of speed"""
    steer_gain: float = 1.5
    """steer = gain * heading error to the look-ahead point (radians), clipped to [-1, 1]"""
    gas_gain: float = 0.1
    """gas per unit of speed below the target"""
    max_gas: float = 1.0
    """gas never exceeds this"""
    gas_steer_cut: float = 0.7
    """gas is multiplied by 1 - gas_steer_cut * |steer| (gas while steering hard skids)"""
    brake_margin: float = 3.0
    """brake when faster than the target by more than this"""
    brake: float = 0.8
    """brake strength (from 0.9 on CarRacing locks the wheels, which then cannot steer)"""
    steer_deadband: float = 0.12
    """discrete mode: wanted wheel angles (radians) smaller than this count as straight"""
    steer_tolerance: float = 0.05
    """discrete mode: steer while the wheels are further than this from the wanted angle"""


def default_config(continuous: bool) -> PlannerConfig:
    """The planner's settings, chosen on the validation tracks 800000-800019 by
    ``benchmarks/planner_search.py`` (discrete: at GAS 1.0; docs/findings.md)."""
    if continuous:   # its gas is proportional, so it brakes without a margin and steers more gently
        return PlannerConfig(a_lat=180.0, a_brake=180.0, curvature_window=30.0, preview=0.0, brake_margin=0.0,
                             gas_gain=0.2, gas_steer_cut=0.9, brake=0.6, steer_gain=1.0, lookahead=12.0,
                             lookahead_per_speed=0.2)
    return PlannerConfig()


def track_curvature(points: np.ndarray, window: float) -> np.ndarray:
    """Signed curvature (1/units, + = turning left) at each point of the closed line
    ``points`` ``[N, 2]``: the heading change over the points within ``window`` track units
    centred on it, divided by their length. Returns ``[N]``."""
    heading, seg = segments(points)                                 # [N] segment i: point i -> i + 1
    turn = np.angle(np.exp(1j * (heading - np.roll(heading, 1))))   # [N] at point i, wrapped
    length = 0.5 * (seg + np.roll(seg, 1))                          # [N] the line each point stands for
    half = int(round(0.5 * window / max(float(np.mean(seg)), 1e-9)))
    offsets = np.arange(-half, half + 1)
    idx = (np.arange(len(points))[:, None] + offsets[None, :]) % len(points)   # [N, 2 half + 1]
    return turn[idx].sum(axis=1) / length[idx].sum(axis=1)


def speed_profile(curvature: np.ndarray, ds: np.ndarray, cfg: PlannerConfig, power: float = np.inf,
                  closed: bool = True) -> np.ndarray:
    """Minimum-time speed at each point of a line: ``curvature`` ``[N]`` at the points,
    ``ds`` ``[N]`` the distance from point i to point i + 1 (the last one unused on an open
    line). The curvature limit, then the backward (braking, ``cfg.a_brake``) and forward
    (engine: ``min(cfg.a_acc, power / v)``) passes; ``closed``: the line is a lap. Returns
    ``[N]`` speeds."""
    n = len(curvature)
    v = np.minimum(cfg.v_top, np.sqrt(cfg.a_lat / np.maximum(np.abs(curvature), 1e-12)))
    start = int(np.argmin(v)) if closed else n - 1
    for k in range(1, n):   # backward: point i can brake to point i + 1's speed
        i = (start - k) % n
        v[i] = min(v[i], np.sqrt(v[(i + 1) % n] ** 2 + 2.0 * cfg.a_brake * ds[i]))
    start = int(np.argmin(v)) if closed else 0
    for k in range(n - 1):   # forward: point i + 1 is reached from point i's speed
        i = (start + k) % n
        accel = min(cfg.a_acc, power / max(v[i], 1e-9))
        v[(i + 1) % n] = min(v[(i + 1) % n], np.sqrt(v[i] ** 2 + 2.0 * accel * ds[i]))
    return v


class MinimumTimePlanner(PurePursuitTeacher):
    """Privileged expert driving the track's minimum-time speed profile; actor interface
    ``reset()``, ``reset_env(env)``, ``act(obs)``, and the DAgger oracle ``action_for(env)``.

    ``continuous=False`` gives discrete actions for the discrete env whose GAS presses
    ``gas``; the engine's limit in the forward pass is that gas's (continuous: ``max_gas``).
    """

    def __init__(self, continuous: bool = True, config: PlannerConfig | None = None, gas: float = DISCRETE_GAS):
        super().__init__(continuous, gas=gas)
        self.cfg = config or default_config(continuous)
        self.name = "planner" if continuous else "planner-discrete"
        self.power = ENGINE_POWER_PER_GAS * (self.cfg.max_gas if continuous else gas)

    def control(self, env: gym.Env) -> tuple[float, float, float]:
        """Continuous (steer, gas, brake) for the current state of ``env``."""
        pose = self._pose(env)
        cfg = self.cfg
        heading_error = self._heading_error(pose, cfg.lookahead + cfg.lookahead_per_speed * pose.speed)
        steer = _clip(cfg.steer_gain * heading_error, -1.0, 1.0)
        target = self.target_speed(self._idx, pose.speed)
        gas = _clip(cfg.gas_gain * (target - pose.speed), 0.0, cfg.max_gas) * (1.0 - cfg.gas_steer_cut * abs(steer))
        if pose.speed > target + cfg.brake_margin:
            return steer, 0.0, cfg.brake
        return steer, gas, 0.0

    def target_speed(self, idx: int, speed: float) -> float:
        """The lowest profile speed from point ``idx`` to where a car at ``speed`` is in
        ``preview`` seconds (at least the next point)."""
        n = len(self._profile)
        ahead = int(np.searchsorted(self._along, self._along[idx] + speed * self.cfg.preview, side="right")) - idx
        return float(self._profile[(idx + np.arange(max(ahead, 1) + 1)) % n].min())

    def _load_track(self, track) -> None:
        if id(track) != self._track_key:
            super()._load_track(track)
            curvature = track_curvature(self._points, self.cfg.curvature_window)
            self._profile = speed_profile(curvature, self._seg, self.cfg, self.power)   # [N] units/s
            self._along = np.concatenate([self._cum, self._cum[-1] + self._cum[1:]])   # [2N + 1]: distance, 2 laps
