"""The minimum-time planner (agents/planner.py): its speed profile on known geometry, its
speed decisions in a real env, and one real episode."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from nac_drive.agents.planner import MinimumTimePlanner, PlannerConfig, speed_profile, track_curvature
from nac_drive.simulators.carracing import BRAKE, GAS, make_carracing, run_episodes

STEP = 3.5   # track units between CarRacing's centre-line points


def _circle(radius: float, n: int = 200) -> np.ndarray:
    angle = 2 * np.pi * np.arange(n) / n
    return radius * np.stack([np.cos(angle), np.sin(angle)], axis=1)


def test_a_straight_gives_the_top_speed():
    cfg = PlannerConfig(v_top=100.0)
    v = speed_profile(np.zeros(80), np.full(80, STEP), cfg, closed=False)
    assert np.all(v == 100.0)


@pytest.mark.parametrize("radius", [15.0, 40.0, 120.0])
def test_a_circle_of_radius_r_gives_sqrt_a_lat_r(radius):
    cfg = PlannerConfig(a_lat=150.0, v_top=1000.0)
    points = _circle(radius)
    curvature = track_curvature(points, window=20.0)
    assert curvature == pytest.approx(np.full(len(points), 1 / radius), rel=1e-3)   # turning left: +
    assert track_curvature(points[::-1], window=20.0) == pytest.approx(np.full(len(points), -1 / radius), rel=1e-3)
    ds = np.linalg.norm(np.roll(points, -1, axis=0) - points, axis=1)
    v = speed_profile(curvature, ds, cfg)
    assert v == pytest.approx(np.full(len(points), math.sqrt(150.0 * radius)), rel=1e-3)


def test_the_car_slows_before_a_bend_not_in_it():
    cfg = PlannerConfig(a_lat=100.0, a_brake=150.0, a_acc=40.0, v_top=100.0)
    before, bend, after = 100, 20, 100   # points: a straight, an arc of radius 16, a straight
    curvature = np.concatenate([np.zeros(before), np.full(bend, 1 / 16), np.zeros(after)])
    v = speed_profile(curvature, np.full(len(curvature), STEP), cfg, closed=False)
    v_bend = math.sqrt(100.0 * 16)
    assert v[before:before + bend] == pytest.approx(v_bend)   # at the bend's speed all through it
    # braking ends where the bend starts: each point before it is as fast as can still brake to it
    distance = STEP * np.arange(before, 0, -1)   # [before] from each point to the bend's first
    assert v[:before] == pytest.approx(np.minimum(100.0, np.sqrt(v_bend ** 2 + 2 * 150.0 * distance)))
    braking = (100.0 ** 2 - v_bend ** 2) / (2 * 150.0)
    assert v[before - int(braking / STEP) - 2] == 100.0 and v[before - 1] < 100.0
    # and the engine's limit after it: a forward pass at a_acc
    assert v[before + bend + 1] == pytest.approx(math.sqrt(v_bend ** 2 + 2 * 40.0 * 2 * STEP))
    assert np.all(np.diff(v[before + bend:]) >= 0) and v[-1] == 100.0


def test_the_forward_pass_follows_the_engines_power():
    cfg = PlannerConfig(a_acc=1000.0, v_top=1000.0)
    ds = np.full(200, 0.01)
    v = speed_profile(np.r_[1e3, np.zeros(199)], ds, cfg, power=2600.0, closed=False)
    # a = power / v: d(v^2)/ds = 2 a  ->  d(v^3)/ds = 3 power, so v^3 grows linearly
    assert np.diff(v[50:] ** 3) == pytest.approx(np.full(149, 3 * 2600.0 * 0.01), rel=0.02)


def _moving(env, speed: float) -> None:
    """The car (hull and wheels) moving straight ahead at ``speed``, its wheels rolling."""
    car = env.unwrapped.car
    forward = car.hull.GetWorldVector((0.0, 1.0))
    for body in (car.hull, *car.wheels):
        body.linearVelocity = (forward[0] * speed, forward[1] * speed)
    for wheel in car.wheels:
        wheel.omega = speed / wheel.wheel_rad


@pytest.mark.parametrize("continuous", [False, True])
def test_it_brakes_when_too_fast_and_presses_gas_when_too_slow(continuous):
    env = make_carracing(seed=800_000, continuous=continuous, gas=0.2 if continuous else 1.0)
    slow = MinimumTimePlanner(continuous, PlannerConfig(v_top=30.0), gas=1.0)   # target <= 30
    fast = MinimumTimePlanner(continuous, PlannerConfig(a_lat=1e9), gas=1.0)    # target 100 everywhere
    for planner in (slow, fast):
        planner.reset_env(env)
    for speed, too_fast in ((0.0, []), (60.0, [slow])):
        if speed:
            _moving(env, speed)
        for planner in (slow, fast):
            steer, gas, brake = planner.control(env)
            action = planner.action_for(env)
            if planner in too_fast:
                assert brake > 0 and gas == 0
                assert action == BRAKE if not continuous else action[2] > 0 and action[1] == 0
            else:
                assert gas > 0 and brake == 0
                assert action == GAS if not continuous else action[1] > 0 and action[2] == 0


@pytest.mark.slow
@pytest.mark.parametrize("continuous", [False, True])
def test_the_planner_drives_round_the_track(continuous):
    torch.set_num_threads(1)
    planner = MinimumTimePlanner(continuous=continuous, **({} if continuous else {"gas": 1.0}))
    results = run_episodes(planner, [800_005], continuous=continuous, max_steps=300)
    visited = planner._env.unwrapped.tile_visited_count
    # 300 frames (6 s) at a mean of ~60 units/s is ~100 tiles of ~3.4 units; standing still is 0
    assert visited > 70 and results.returns[0] > 150


def test_the_cli_knows_the_planner(capsys):
    from nac_drive.agents.experts import load_expert
    from nac_drive.cli import main

    actor, continuous = load_expert("planner-discrete", gas=1.0)
    assert isinstance(actor, MinimumTimePlanner) and not continuous and actor.gas == 1.0
    with pytest.raises(ValueError, match="continuous env"):
        load_expert("planner", gas=0.5)
    assert main(["expert", "eval", "--expert", "planner-discrete", "--gas", "1.0", "--episodes", "1",
                 "--seed-base", "800000", "--max-steps", "60", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["expert"] == "planner-discrete" and summary["lengths"] == [60]
    assert summary["returns"][0] > 0   # tiles visited in 60 frames outweigh 6 points of time
