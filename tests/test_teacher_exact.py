"""The teacher's per-step geometry (plain floats, one nearest-point search per state) labels
exactly as its first, numpy-on-2-vectors version, kept here as the reference.

The teacher drives the collections: on real states (seeded CarRacing tracks, the teacher and
the shipped policy driving) its actions must be bit-identical and its cross-track error equal
to ~1e-12 (plain floats add in their own order where numpy's BLAS fused a multiply-add).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nac_drive.agents.teacher import PurePursuitTeacher
from nac_drive.simulators.carracing import EVAL_SEED_BASE, run_episodes

STEPS = 150   # per episode


class _Reference(PurePursuitTeacher):
    """The teacher's geometry as it was before it went per-step plain-float (numpy on 2-vectors,
    a nearest-point search per call)."""

    def cross_track_error(self, env):
        base = env.unwrapped
        self._load_track(base.track)
        pos = np.array(base.car.hull.position, dtype=np.float64)
        self._idx = self._ref_nearest(pos)
        n, best = len(self._points), math.inf
        for i in (self._idx - 1, self._idx):
            a, b = self._points[i % n], self._points[(i + 1) % n]
            d = b - a
            along = float(np.clip((pos - a) @ d / max(float(d @ d), 1e-12), 0.0, 1.0))
            offset = pos - (a + along * d)
            if np.linalg.norm(offset) < abs(best):
                best = -math.copysign(float(np.linalg.norm(offset)), d[0] * offset[1] - d[1] * offset[0])
        return best

    def control(self, env):
        base = env.unwrapped
        self._load_track(base.track)
        hull = base.car.hull
        pos = np.array(hull.position, dtype=np.float64)
        forward = np.array(hull.GetWorldVector((0.0, 1.0)), dtype=np.float64)
        right = np.array(hull.GetWorldVector((1.0, 0.0)), dtype=np.float64)
        speed = float(np.linalg.norm(np.array(hull.linearVelocity, dtype=np.float64)))
        self._idx = self._ref_nearest(pos)
        cfg, n, i = self.cfg, len(self._points), self._idx
        distance = cfg.lookahead + cfg.lookahead_per_speed * speed
        while distance > self._seg[i % n]:
            distance -= self._seg[i % n]
            i += 1
        a, b = self._points[i % n], self._points[(i + 1) % n]
        d = a + (b - a) * (distance / max(self._seg[i % n], 1e-9)) - pos
        steer = float(np.clip(cfg.steer_gain * math.atan2(float(d @ right), float(d @ forward)), -1.0, 1.0))
        steps = max(1, int(cfg.curve_horizon / max(float(np.mean(self._seg)), 1e-6)))
        ahead = self._heading[(self._idx + np.arange(steps)) % n]
        bend = float(np.abs(np.angle(np.exp(1j * (ahead - self._heading[self._idx % n])))).max())
        target_speed = cfg.max_speed - min(bend / cfg.curve_for_min_speed, 1.0) * (cfg.max_speed - cfg.min_speed)
        gas = float(np.clip(cfg.gas_gain * (target_speed - speed), 0.0, cfg.max_gas))
        gas *= 1.0 - cfg.gas_steer_cut * abs(steer)
        if speed > target_speed + cfg.brake_margin:
            return steer, 0.0, cfg.brake
        return steer, gas, 0.0

    def discretise(self, steer, gas, brake, wheel_angle=0.0):
        wanted = float(np.clip(-steer, -0.4, 0.4))
        turn = abs(wanted) > self.cfg.steer_deadband and (np.sign(wanted) != np.sign(wheel_angle)
                                                          or abs(wanted) > abs(wheel_angle) + self.cfg.steer_tolerance)
        return 4 if brake > 0 else (2 if wanted > 0 else 1) if turn else 3 if gas > 0 else 0

    def _ref_nearest(self, pos):
        window = (self._idx + np.arange(-10, 40)) % len(self._points)
        dist = np.linalg.norm(self._points[window] - pos, axis=1)
        if dist.min() > 15.0:
            return int(np.argmin(np.linalg.norm(self._points - pos, axis=1)))
        return int(window[int(np.argmin(dist))])


class _Labelling:
    """Drives with ``driver`` (with ``swerves``: off the road to the left and right now and
    then); in every state, asks each (reference, teacher) pair what PolicyDriver._oracle_view
    asks: the cross-track error, then the label."""

    def __init__(self, driver, swerves: bool = False):
        self.driver, self.gas, self.swerves = driver, getattr(driver, "gas", 0.1), swerves
        self.pairs = [(_Reference(continuous=c), PurePursuitTeacher(continuous=c)) for c in (False, True)]
        self.rows: list[tuple] = []
        self.controls: dict[object, list] = {}   # each teacher's (steer, gas, brake), float64 before the label
        for teacher in (t for pair in self.pairs for t in pair):
            teacher.control = self._recording(teacher.control, self.controls.setdefault(teacher, []))

    @staticmethod
    def _recording(control, into: list):
        def recorded(env):
            into.append(control(env))
            return into[-1]
        return recorded

    def reset(self):
        self.driver.reset()
        for teacher in (t for pair in self.pairs for t in pair):
            teacher.reset()

    def reset_env(self, env):
        self.env = env
        for teacher in (self.driver, *(t for pair in self.pairs for t in pair)):
            if hasattr(teacher, "reset_env"):
                teacher.reset_env(env)

    def act(self, obs):
        for ref, new in self.pairs:
            expected = ref.cross_track_error(self.env), np.asarray(ref.action_for(self.env))
            got = new.cross_track_error(self.env), np.asarray(new.action_for(self.env))
            self.rows.append((*expected, *got))
        action, step = self.driver.act(obs), len(self.rows) // len(self.pairs)
        if self.swerves and step % 75 >= 30:   # off the road, to the right, then to the left
            return ((2, 3, 1, 3) if step < 75 else (1, 3, 2, 3))[step % 75 * 4 // 75]
        return action


def test_the_teacher_labels_real_states_exactly_as_its_reference():
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.policy.loading import load_driving_policy

    torch.set_num_threads(1)
    rows, controls = [], []
    for driver, seed, swerves in ((PurePursuitTeacher(continuous=False), EVAL_SEED_BASE + 1, True),
                                  (PolicyDriver(load_driving_policy()), EVAL_SEED_BASE, False)):
        labelling = _Labelling(driver, swerves)
        run_episodes(labelling, [seed], continuous=False, max_steps=STEPS)
        rows += labelling.rows
        controls += [(labelling.controls[ref], labelling.controls[new]) for ref, new in labelling.pairs]
    assert len(rows) == 2 * 2 * STEPS
    ref_cte, ref_action, cte, action = (list(c) for c in zip(*rows))
    for i, (a, b) in enumerate(zip(ref_action, action)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (i, a, b)
    for expected, got in controls:   # float64, not only the labels they round to
        assert len(got) == STEPS and got == expected
    np.testing.assert_allclose(cte, ref_cte, rtol=0, atol=1e-12)
    # the states cover both sides of the road, and off it: over 15 from every centre-line point,
    # where the nearest-point search goes global
    assert min(ref_cte) < -5 and max(ref_cte) > 15
    continuous = np.array([a for a in ref_action if a.shape == (3,)])
    assert np.abs(continuous[:, 0]).max() == 1.0 and continuous[:, 1].max() > 0   # steer at the lock, gas
    assert {int(a) for a in ref_action if a.shape == ()} >= {1, 2, 3}
