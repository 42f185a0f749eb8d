"""The limits of CarRacing's Box2D car, measured: what the minimum-time planner plans with.

    python benchmarks/car_limits.py

Every experiment drives a fresh CarRacing-v3 car (continuous actions) with road friction
under every wheel wherever it goes (a stand-in road tile added to each wheel's contacts),
so that the grass's lower friction never enters, and reads the hull's velocity:

- top speed and acceleration at gas 1.0, 0.4, 0.2 from standstill, straight ahead
  (mean acceleration per band of speed);
- braking from 60 and 99 units/s to half that, at brake 0.8 (the discrete BRAKE) and 1.0
  (from 0.9 the wheels lock);
- lateral acceleration ``v * yaw rate``: on a steady circle at a held steer, the speed
  kept by a gentle gas, raised until the car spins; and coasting into a held steer from
  speed (the largest over 60 frames, or SPIN where the car turned over 30 degrees
  from its velocity).
"""

from __future__ import annotations

import math

import numpy as np

DT = 1 / 50


class _Road:
    """A stand-in road tile: CarRacing's wheel friction is the best of its tiles'."""

    road_friction = 1.0


def _car():
    from nac_drive.simulators.carracing import make_carracing

    base = make_carracing(seed=0, continuous=True).unwrapped
    base._render = lambda mode: None   # nothing is looked at
    for wheel in base.car.wheels:
        wheel.tiles.add(_Road())
    return base


def _speed(base) -> float:
    v = base.car.hull.linearVelocity
    return math.hypot(v.x, v.y)


def _up_to(base, speed: float) -> None:
    while _speed(base) < speed:
        base.step(np.array([0.0, 1.0, 0.0]))


def acceleration() -> None:
    for gas in (1.0, 0.4, 0.2):
        base, speeds = _car(), []
        for _ in range(400):
            base.step(np.array([0.0, gas, 0.0]))
            speeds.append(_speed(base))
        v, a = np.array(speeds[1:]), np.diff(speeds) / DT
        bands = [f"{lo}-{lo + 20}: {a[(v >= lo) & (v < lo + 20)].mean():.1f}" for lo in range(0, 100, 20)
                 if ((v >= lo) & (v < lo + 20)).any()]
        print(f"gas {gas}: top speed {max(speeds):.1f} after 8 s; acceleration by speed: {', '.join(bands)}")


def braking() -> None:
    for v0 in (60.0, 99.0):
        for brake in (0.8, 1.0):
            base = _car()
            _up_to(base, v0)
            start, frames = _speed(base), 0
            while _speed(base) > v0 / 2:
                base.step(np.array([0.0, 0.0, brake]))
                frames += 1
            print(f"brake {brake} from {start:.1f} to {_speed(base):.1f}: {frames} frames, "
                  f"{(start - _speed(base)) / (frames * DT):.1f} units/s^2")


def lateral() -> None:
    for steer in (0.03, 0.06, 0.1, 0.2, 0.4):
        last = None
        for target in range(14, 90, 3):
            base, held = _car(), []
            for t in range(500):
                v = _speed(base)
                base.step(np.array([steer, min(max(0.05 * (target - v), 0.0), 1.0), 0.0]))
                if t > 350:
                    held.append((v, v * abs(base.car.hull.angularVelocity)))
            v, a = np.array(held).T
            if abs(v.mean() - target) >= 3 or v.std() >= 1:
                break
            last = v.mean(), a.mean()
        print(f"steady circle, steer {steer}: holds {last[0]:.1f} units/s at {last[1]:.1f} units/s^2 "
              f"(radius {last[0] ** 2 / last[1]:.1f}); spins at {target}")
    for steer in (0.03, 0.06, 0.1, 0.2, 0.4):
        row = []
        for v0 in range(30, 101, 10):
            base = _car()
            _up_to(base, min(v0, 99.0))
            peak, spun = 0.0, False
            for _ in range(60):
                base.step(np.array([steer, 0.0, 0.0]))
                vel, forward = base.car.hull.linearVelocity, base.car.hull.GetWorldVector((0.0, 1.0))
                v = _speed(base)
                if (vel.x * forward.x + vel.y * forward.y) < v * math.cos(math.radians(30)):
                    spun = True
                    break
                peak = max(peak, v * abs(base.car.hull.angularVelocity))
            row.append(f"{v0}: {'SPIN' if spun else f'{peak:.0f}'}")
        print(f"coasting into steer {steer}, from speed: largest v * yaw rate: {', '.join(row)}")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    base = _car()
    mass = base.car.hull.mass + sum(w.mass for w in base.car.wheels)
    print(f"mass {mass:.2f} (hull {base.car.hull.mass:.2f}); 4 wheels x friction limit 400 / mass = "
          f"{4 * 400 / mass:.0f} units/s^2")
    acceleration()
    braking()
    lateral()


if __name__ == "__main__":
    main()
