"""A privileged pure-pursuit teacher for CarRacing: it reads the track, not the pixels.

Every frame it finds the car's place on the track centre line (``env.unwrapped.track``),
steers towards a look-ahead point further along it and sets a target speed from how
sharply the track bends ahead. Because it reads the env's state it can label any
state the student reaches: :meth:`PurePursuitTeacher.action_for` is the DAgger oracle.

Continuous output is ``float32 [3]`` = (steer in [-1, 1] with + = right, gas, brake);
the discrete version maps it to CarRacing's 5 actions (0 no-op, 1 right, 2 left,
3 gas, 4 brake).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from nac_drive.simulators.carracing import BRAKE, DISCRETE_GAS, GAS, LEFT, NOOP, RIGHT

WHEEL_LOCK = 0.4  # radians: the front wheel joints' limit in CarRacing's car model
_BACK, _WINDOW = 10, 50   # the nearest-point search: 50 points, from 10 behind the last nearest one


class CarPose(NamedTuple):
    """The car's hull as the teacher reads it: position, unit forward and right vectors
    (``float64 [2]`` each) and speed (track units/s)."""

    x: float
    y: float
    forward: np.ndarray
    right: np.ndarray
    speed: float


@dataclass
class TeacherConfig:
    """Gains of the pure-pursuit teacher (distances in track units, speeds in units/s)."""

    lookahead: float = 8.0
    """look-ahead distance at standstill"""
    lookahead_per_speed: float = 0.15
    """extra look-ahead per unit of speed"""
    steer_gain: float = 2.5
    """steer = gain * heading error to the look-ahead point (radians), clipped to [-1, 1]"""
    max_speed: float = 90.0
    """target speed on a straight"""
    min_speed: float = 35.0
    """target speed in the sharpest bend"""
    curve_horizon: float = 45.0
    """how far ahead (track units) bends lower the target speed"""
    curve_for_min_speed: float = 1.2
    """total heading change (radians) over the horizon that gives ``min_speed``"""
    gas_gain: float = 0.05
    """gas per unit of speed below the target"""
    max_gas: float = 0.5
    """gas never exceeds this (more only spins the wheels)"""
    gas_steer_cut: float = 0.7
    """gas is multiplied by 1 - gas_steer_cut * |steer|"""
    brake_margin: float = 5.0
    """brake when faster than the target speed by this much"""
    brake: float = 0.6
    """brake strength when braking"""
    steer_deadband: float = 0.05
    """discrete mode: wanted wheel angles (radians) smaller than this count as straight"""
    steer_tolerance: float = 0.03
    """discrete mode: steer while the wheels are further than this from the wanted angle"""


def default_config(continuous: bool) -> TeacherConfig:
    """Gains tuned on collection-range tracks (100000..100003), one set per action mode.

    Discrete gas is weak (0.2) and steering means no gas, so the discrete teacher keeps
    more speed into bends and steers only for larger errors.
    """
    if continuous:
        return TeacherConfig(max_speed=110.0, min_speed=40.0)
    return TeacherConfig(max_speed=120.0, min_speed=45.0, brake_margin=10.0,
                         curve_for_min_speed=1.6, steer_deadband=0.12, steer_tolerance=0.05)


class PurePursuitTeacher:
    """Privileged expert; actor interface ``reset()``, ``reset_env(env)``, ``act(obs)``.

    ``continuous=False`` gives discrete actions for the discrete env, whose GAS presses
    ``gas`` (read by :func:`~nac_drive.simulators.carracing.actor_gas`; the teacher's choice
    of action does not depend on it). The minimum-time planner (``planner.py``) is this
    teacher with another :meth:`control`: it shares the track geometry, the car's pose on
    the line and the discrete mapping.
    """

    def __init__(self, continuous: bool = True, config: TeacherConfig | None = None, gas: float = DISCRETE_GAS):
        self.continuous, self.gas = continuous, gas
        self.cfg = config or default_config(continuous)
        self.name = "teacher" if continuous else "teacher-discrete"
        self._env: gym.Env | None = None
        self._track_key: int | None = None
        self._points = np.zeros((0, 2))
        self._cum = np.zeros(0)
        self._heading = np.zeros(0)
        self._idx = 0

    # -- actor interface ---------------------------------------------------------------
    def reset(self) -> None:
        self._idx = 0

    def reset_env(self, env: gym.Env) -> None:
        """Attach to ``env`` (called by the episode runner after each reset)."""
        self._env = env
        self._track_key = None  # re-read the track lazily

    def act(self, obs: np.ndarray | None = None):
        """Action for the attached env's current state (``obs`` is not used)."""
        if self._env is None:
            raise RuntimeError("PurePursuitTeacher.act: call reset_env(env) first "
                               "(it reads the env's track and car state)")
        return self.action_for(self._env)

    # -- oracle ------------------------------------------------------------------------
    def action_for(self, env: gym.Env):
        """The teacher's action for ``env``'s CURRENT state (e.g. DAgger labels)."""
        steer, gas, brake = self.control(env)
        if self.continuous:
            return np.array([steer, gas, brake], dtype=np.float32)
        wheel_angle = float(env.unwrapped.car.wheels[0].joint.angle)
        return self.discretise(steer, gas, brake, wheel_angle)

    def cross_track_error(self, env: gym.Env) -> float:
        """Signed distance (track units; the road is ~13 wide) from the car to the centre
        line, positive right of it (as the Udacity emulator's ``cte_m``)."""
        base = env.unwrapped
        self._load_track(base.track)
        pos = base.car.hull.position
        x, y = pos.x, pos.y
        self._idx = self._nearest(x, y)
        pts, n = self._pts, len(self._pts)
        best = math.inf
        for i in (self._idx - 1, self._idx):   # the two segments that meet at the nearest point
            (ax, ay), (bx, by) = pts[i % n], pts[(i + 1) % n]
            dx, dy = bx - ax, by - ay
            along = min(max(((x - ax) * dx + (y - ay) * dy) / max(dx * dx + dy * dy, 1e-12), 0.0), 1.0)
            ox, oy = x - (ax + along * dx), y - (ay + along * dy)
            dist = math.sqrt(ox * ox + oy * oy)
            if dist < abs(best):
                side = dx * oy - dy * ox      # > 0: left of the direction of travel
                best = -math.copysign(dist, side)
        return best

    def control(self, env: gym.Env) -> tuple[float, float, float]:
        """Continuous (steer, gas, brake) for the current state of ``env``."""
        pose = self._pose(env)
        cfg = self.cfg
        heading_error = self._heading_error(pose, cfg.lookahead + cfg.lookahead_per_speed * pose.speed)
        steer = _clip(cfg.steer_gain * heading_error, -1.0, 1.0)

        bend = self._bend_ahead(self._idx, cfg.curve_horizon)
        frac = min(bend / cfg.curve_for_min_speed, 1.0)
        target_speed = cfg.max_speed - frac * (cfg.max_speed - cfg.min_speed)
        # Full gas spins the rear wheels and full gas while steering hard skids: gas is
        # proportional to the missing speed, capped, and reduced in proportion to steering.
        gas = _clip(cfg.gas_gain * (target_speed - pose.speed), 0.0, cfg.max_gas)
        gas *= 1.0 - cfg.gas_steer_cut * abs(steer)
        brake = 0.0
        if pose.speed > target_speed + cfg.brake_margin:
            gas, brake = 0.0, cfg.brake
        return steer, gas, brake

    def discretise(self, steer: float, gas: float, brake: float,
                   wheel_angle: float = 0.0) -> int:
        """Map (steer, gas, brake) to one of CarRacing's 5 discrete actions.

        A discrete steer turns the front wheels towards full lock (the joint stops at
        +-0.4 rad) and any other action lets them return to straight. So the teacher
        steers only while the wheels (``wheel_angle``, radians, + = left) must turn
        further towards the wanted angle (``-steer``, clipped to the lock); otherwise it
        controls speed. This needs no memory, so it also labels arbitrary states.
        """
        wanted = _clip(-steer, -WHEEL_LOCK, WHEEL_LOCK)
        turn_further = (abs(wanted) > self.cfg.steer_deadband
                        and (_sign(wanted) != _sign(wheel_angle)
                             or abs(wanted) > abs(wheel_angle) + self.cfg.steer_tolerance))
        if brake > 0:
            return BRAKE
        if turn_further:
            return LEFT if wanted > 0 else RIGHT
        if gas > 0:
            return GAS
        return NOOP

    # -- the car on the line -----------------------------------------------------------
    def locate(self, env: gym.Env) -> tuple[CarPose, int, np.ndarray, np.ndarray]:
        """The car on ``env``'s track: its pose, the index of its nearest centre-line point,
        and the track's segment headings and lengths (``float64 [N]`` each, segment i runs
        from point i to point i + 1; headings in radians, counter-clockwise = left). The
        scene variables (:mod:`nac_drive.simulators.carracing_scene`) read the track so."""
        pose = self._pose(env)
        return pose, self._idx, self._heading, self._seg

    def _pose(self, env: gym.Env) -> CarPose:
        """The car's pose in ``env``; also moves ``self._idx`` to its nearest centre-line point."""
        base = env.unwrapped
        if getattr(base, "car", None) is None or not getattr(base, "track", None):
            raise RuntimeError(f"{type(self).__name__}: env has no car/track yet; reset it first")
        self._load_track(base.track)
        hull = base.car.hull
        x, y = hull.position.x, hull.position.y
        # The dot products stay numpy's (BLAS, which may fuse multiply-adds): the actions
        # must not change by an ulp.
        forward, right, vel = (np.array((v.x, v.y)) for v in (hull.GetWorldVector((0.0, 1.0)),
                                                               hull.GetWorldVector((1.0, 0.0)), hull.linearVelocity))
        speed = math.sqrt(float(vel.dot(vel)))   # np.linalg.norm(vel)
        self._idx = self._nearest(x, y)
        return CarPose(x, y, forward, right, speed)

    def _heading_error(self, pose: CarPose, distance: float) -> float:
        """Angle (radians, + = right) from the car's forward axis to the centre-line point
        ``distance`` ahead of its nearest point: pure pursuit's alpha."""
        tx, ty = self._point_ahead(self._idx, distance)
        d = np.array((tx - pose.x, ty - pose.y))
        return math.atan2(float(d.dot(pose.right)), float(d.dot(pose.forward)))

    # -- track geometry ----------------------------------------------------------------
    def _load_track(self, track) -> None:
        key = id(track)
        if key == self._track_key:
            return
        pts = np.array([(t[2], t[3]) for t in track], dtype=np.float64)  # [N, 2] centre line
        seg = np.linalg.norm(np.roll(pts, -1, axis=0) - pts, axis=1)  # [N] to the next point
        self._points, self._seg = pts, seg
        self._pts, self._seg_len = pts.tolist(), seg.tolist()   # the same, as floats (per-step math)
        self._cum = np.concatenate([[0.0], np.cumsum(seg)])  # [N+1]
        diff = np.roll(pts, -1, axis=0) - pts
        self._heading = np.arctan2(diff[:, 1], diff[:, 0])  # [N] direction of each segment
        self._track_key = key
        self._idx = 0
        # x and y of points -BACK .. N - 1 + WINDOW - BACK: the search window of point i is [i:i + WINDOW]
        wrapped = pts[np.arange(-_BACK, len(pts) + _WINDOW - _BACK) % len(pts)]
        self._x_wrapped, self._y_wrapped = wrapped[:, 0].copy(), wrapped[:, 1].copy()
        self._near_key, self._near = None, 0
        self._bends: dict[tuple[int, float], float] = {}

    def _nearest(self, x: float, y: float) -> int:
        """Index of the closest centre-line point to the car at (``x``, ``y``) (searched near
        the last one, or globally when the car is far from there). The answer is kept for
        the position and the last index: the label and the cross-track error of one state
        share it."""
        if self._near_key == (x, y, self._idx):
            return self._near
        # the window's points in order: a slice of the wrapped copies (no index arrays)
        window = slice(self._idx, self._idx + _WINDOW)
        dx, dy = self._x_wrapped[window] - x, self._y_wrapped[window] - y
        dist = np.sqrt(dx * dx + dy * dy)   # [WINDOW] = np.linalg.norm(points[window] - pos, axis=1)
        j = int(np.argmin(dist))
        best = (self._idx - _BACK + j) % len(self._pts)
        if dist[j] > 15.0:  # lost (spun off, or first call): search everywhere
            best = int(np.argmin(np.linalg.norm(self._points - (x, y), axis=1)))
        self._near_key, self._near = (x, y, self._idx), best
        return best

    def _point_ahead(self, idx: int, distance: float) -> tuple[float, float]:
        """The centre-line point ``distance`` along the track from point ``idx``."""
        seg, n = self._seg_len, len(self._seg_len)
        i = idx
        while distance > seg[i % n]:
            distance -= seg[i % n]
            i += 1
        (ax, ay), (bx, by) = self._pts[i % n], self._pts[(i + 1) % n]
        t = distance / max(seg[i % n], 1e-9)
        return ax + (bx - ax) * t, ay + (by - ay) * t

    def _bend_ahead(self, idx: int, horizon: float) -> float:
        """Largest heading change (radians) between the segment at ``idx`` and any segment
        within ``horizon`` track units ahead (a function of the track: kept per point)."""
        key = (idx % len(self._points), horizon)
        bend = self._bends.get(key)
        if bend is None:
            n = len(self._points)
            steps = max(1, int(horizon / max(float(np.mean(self._seg)), 1e-6)))
            ahead = self._heading[(idx + np.arange(steps)) % n]
            delta = np.angle(np.exp(1j * (ahead - self._heading[idx % n])))  # wrapped to [-pi, pi]
            bend = self._bends[key] = float(np.abs(delta).max())
        return bend



def _clip(value: float, low: float, high: float) -> float:
    """``float(np.clip(value, low, high))`` of a float, without numpy."""
    return min(max(value, low), high)


def _sign(value: float) -> int:
    """``np.sign`` of a float (-1, 0 or 1), without numpy."""
    return (value > 0) - (value < 0)
