"""The Udacity emulator as a gymnasium env (``nac_drive/UdacityEmulator-v0``), through
gymnasium's own API: ``gymnasium.make``, ``check_env``, ``TimeLimit``, specs. And the shipped
Udacity policy scored in it and over the bridge, on the same track and start."""

import base64
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from nac_drive.simulators.udacity_bridge import decode_image
from nac_drive.simulators.udacity_emulator import EmulatorConfig, UdacityEmulator
from nac_drive.simulators.udacity_env import ENV_ID, MAX_EPISODE_STEPS, SpeedControl, UdacityEmulatorEnv
from nac_drive.simulators.udacity_track import pure_pursuit


def test_importing_the_simulators_registers_the_env_and_nac_drive_alone_stays_light():
    # gymnasium's two ways: import the package, or name it in the id ("module:id")
    for code in ("import gymnasium as gym, nac_drive.simulators; "
                 "env = gym.make('nac_drive/UdacityEmulator-v0', track='gentle')",
                 "import gymnasium as gym; env = gym.make('nac_drive.simulators:nac_drive/UdacityEmulator-v0', "
                 "track='gentle')"):
        out = subprocess.run([sys.executable, "-c", code + "; print(env.spec.id, env.spec.max_episode_steps, "
                              "env.observation_space.shape, env.action_space.shape)"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [ENV_ID, str(MAX_EPISODE_STEPS), "(160,", "320,", "3)", "(2,)"]
    # the model library (the NAC layer, the policy, checkpoints) never imports gymnasium
    light = ("import sys, nac_drive, nac_drive.policy.driving_policy, nac_drive.nac, nac_drive.io.checkpoint; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'gymnasium' "
             "or m.startswith('nac_drive.simulators')))")
    out = subprocess.run([sys.executable, "-c", light], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_check_env_passes_and_the_spec_recreates_the_env():
    env = gym.make(ENV_ID, track="serpentine", render_mode="rgb_array")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    again = gym.make(env.spec)
    assert again.unwrapped.track.spec.name == "serpentine" and again.spec.max_episode_steps == MAX_EPISODE_STEPS
    steering = SpeedControl(env, speed_mph=12.0)
    rebuilt = gym.make(steering.spec)
    assert isinstance(rebuilt, SpeedControl) and rebuilt.controller.set_speed == 12.0
    assert rebuilt.action_space.shape == (1,)


def test_observation_is_the_frame_the_bridge_decodes_and_render_is_the_raw_frame():
    env = gym.make(ENV_ID, track="lakeside", start=40.0, render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(np.array([0.1, 0.5], np.float32))
    raw = env.unwrapped.frame_jpeg
    decoded, _ = decode_image(base64.b64encode(raw).decode("ascii"))
    assert obs.dtype == np.uint8 and obs.shape == (160, 320, 3)
    assert np.array_equal(obs, decoded)  # bit for bit what `drive udacity` hands the policy
    frame = env.render()
    assert frame.shape == obs.shape and not np.array_equal(frame, obs)  # before the JPEG round trip
    assert np.abs(frame.astype(int) - obs).mean() < 4  # ... of the same RGB picture
    assert np.abs(frame[..., ::-1].astype(int) - obs).mean() > 10  # (not BGR)


def test_the_socket_emulator_sends_the_env_frame():
    env = UdacityEmulatorEnv(track="canyon", start=25.0)
    obs, _ = env.reset()
    emulator = UdacityEmulator(EmulatorConfig(track="canyon", start=25.0))
    sent, _ = decode_image(emulator.telemetry()["image"])
    assert np.array_equal(sent, obs)
    emulator._step((0.3, 1.0))
    obs, *_ = env.step([0.3, 1.0])
    assert np.array_equal(decode_image(emulator.telemetry()["image"])[0], obs)
    assert emulator.car.x == env.car.x and emulator.progress.cte == env.progress.cte


def test_reward_is_centred_progress_and_leaving_the_road_terminates():
    env = gym.make(ENV_ID, track="lakeside")
    env.reset(seed=0)
    track = env.unwrapped.track
    total = 0.0
    for _ in range(150):  # pure pursuit on the centre line, from standstill
        steer = pure_pursuit(track, env.unwrapped.car, env.unwrapped.progress.index)
        _, reward, terminated, truncated, info = env.step([steer, 0.4])
        assert reward > 0 and not terminated and not truncated  # every step's progress, not 0.5 m lumps
        total += reward
    # centred: nearly all the progress (info's distance counts centre-line points, 0.5 m apart)
    assert info["distance_m"] > 20 and 0.95 * info["distance_m"] < total <= info["distance_m"] + 0.5
    # full right lock leaves the road: terminated, and the steps near the edge earned little
    rewards = []
    for _ in range(200):
        _, reward, terminated, truncated, info = env.step([1.0, 1.0])
        rewards.append(reward)
        if terminated:
            break
    assert terminated and not truncated and info["off_road_events"] == 1
    assert abs(info["cte_m"]) > track.half_width
    assert rewards[-1] < 0.2 * max(rewards)


def test_time_limit_truncates_and_seeded_random_starts_repeat():
    env = gym.make(ENV_ID, track="gentle", start=None, max_episode_steps=7)
    first, _ = env.reset(seed=3)
    again, _ = env.reset(seed=3)
    other, _ = env.reset(seed=4)
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    for k in range(7):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not terminated and truncated == (k == 6)


def test_speed_control_holds_the_bridge_set_speed():
    env = SpeedControl(gym.make(ENV_ID, track="lakeside"), speed_mph=12.0)
    env.reset(seed=0)
    for _ in range(300):
        u = env.unwrapped
        _, _, terminated, _, info = env.step([pure_pursuit(u.track, u.car, u.progress.index)])
        assert not terminated
    assert info["speed_mph"] == pytest.approx(12.0, abs=0.5)


@pytest.mark.slow
def test_shipped_policy_scores_in_the_env_as_over_the_bridge():
    """The same track and start, 600 frames (40 s at 15 Hz): the env, and ``nac-drive drive
    udacity`` with the socket emulator in real time. Not bit for bit: over the bridge each
    answer is applied one frame late (Unity's interleaved telemetry chains, starting with the
    connect command's zero throttle) and the policy's timestamps are wall-clock arrival times.
    Measured: 158.57 m against 160.07 m, mean |cte| 0.0368 m against 0.0363 m (at 900 frames:
    238.61 m against 240.61 m, 0.0403-0.0408 m against 0.0387 m). The bounds leave 2x that room."""
    pytest.importorskip("socketio")
    pytest.importorskip("websocket")
    from support.udacity_procs import Proc, free_port

    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.simulators.udacity_emulator import run_emulator

    frames, track = 600, "serpentine"
    port = free_port()
    bridge = Proc([sys.executable, "-m", "nac_drive.cli", "drive", "udacity", "--port", str(port), "--json"])
    try:
        bridge.wait_for("listening on", timeout=120)
        report = run_emulator(EmulatorConfig(port=port, track=track, frames=frames, realtime=True))
    finally:
        bridge.stop()
    over_bridge = report.as_dict()
    assert over_bridge["commands"] == frames and bridge.json_summary()["policy_errors"] == 0

    policy = load_driving_policy(task="udacity")
    env = SpeedControl(gym.make(ENV_ID, track=track, start=0.0, max_episode_steps=frames), speed_mph=9.0)
    obs, _ = env.reset(seed=0)
    policy.reset()
    total = 0.0
    for _ in range(frames):
        obs, reward, terminated, truncated, info = env.step([policy.select_action(obs)])
        total += reward
        assert not terminated
    assert truncated  # the TimeLimit ended it
    in_env = env.unwrapped.progress.summary()

    assert in_env["off_road_events"] == over_bridge["off_road_events"] == 0
    assert in_env["distance_m"] == pytest.approx(over_bridge["distance_m"], rel=0.02)
    assert in_env["mean_abs_cte_m"] == pytest.approx(over_bridge["mean_abs_cte_m"], abs=0.01)
    assert in_env["mean_abs_cte_m"] < 0.1 and in_env["max_abs_cte_m"] < 0.3  # it drives as well as it does there
    assert 0.95 * in_env["distance_m"] < total <= in_env["distance_m"] + 0.5


def test_non_finite_actions_and_absurd_settings_are_refused_in_one_line():
    # a NaN action once made position, cte and reward NaN for good; dt=inf and speed_mph=1e308 were taken
    env = UdacityEmulatorEnv(track="gentle")
    env.reset(seed=0)
    for action in ([float("nan"), 0.5], [0.0, float("inf")]):
        with pytest.raises(ValueError, match=r"^action: expected finite \[steer, throttle\]"):
            env.step(action)
    obs, reward, terminated, truncated, info = env.step([0.0, 0.5])   # the car is as it was
    assert np.isfinite([reward, info["cte_m"], info["distance_m"], info["speed_mph"]]).all()
    for dt in (float("inf"), float("nan"), 0.0, 2.0):
        with pytest.raises(ValueError, match=r"^dt: expected a frame period in \(0, 1\] seconds"):
            UdacityEmulatorEnv(track="gentle", dt=dt)
    for speed in (1e308, -1.0, float("nan")):
        with pytest.raises(ValueError, match=r"^options\['speed_mph'\]: expected 0\.\.30"):
            env.reset(options={"speed_mph": speed})
