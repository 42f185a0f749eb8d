"""Irregular time (issue 53 item 3): under ``frame-drop=P`` a share P of the frames, drawn per
track from the documented stream, never reaches the policy; the simulator steps every frame
with the last action; the frames that arrive carry their real timestamps; P = 0 is the plain
drive, bit for bit; the CarRacing drive, the Udacity emulator drive and the bridge all do it;
training windows under ``frame_drop`` are cut from the frames left, with gaps of the right
share; bad values are refused in one line."""

import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from nac_drive.agents.driver import PolicyDriver
from nac_drive.policy.loading import load_driving_policy
from nac_drive.data_collection.carracing_dataset import Episode, WindowDataset
from nac_drive.pipeline.drive import udacity_emulator_env, udacity_emulator_episodes
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig
from nac_drive.simulators.carracing import run_episodes
from nac_drive.simulators.frame_drops import SALT, FrameDrops, window_frames
from nac_drive.simulators.perturbations import (ENV_PERTURBATIONS, apply_perturbation, check_perturb_flag,
                                                frame_drops, parse_perturbation)
from nac_drive.simulators.udacity_bridge import UdacityBridge

torch.set_num_threads(1)
SEEDS = (900_000, 900_001)


def expected_arrivals(share: float, seed, frames: int) -> np.ndarray:
    """The documented schedule, written out: one uniform draw per frame from
    ``default_rng([SALT, *seed])``, a frame dropped when its draw is below the share, the first kept."""
    key = [] if seed is None else list(np.atleast_1d(seed))
    arrived = np.random.default_rng([SALT, *key]).random(frames) >= share
    arrived[0] = True
    return arrived


class Spy:
    """A policy that records what it is shown and answers each frame with a new action
    (CarRacing: cycling through the 5; Udacity: a steering that grows), so a repeated action
    can only be a held one."""

    def __init__(self, policy):
        self.policy, self.seen = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def select_action(self, obs):
        self.seen.append(obs)
        return len(self.seen) % 5 if self.config.task == "carracing" else len(self.seen) / 1000


def test_the_schedule_is_the_documented_stream_and_the_seed_repeats_it():
    for share in (0.25, 0.5):
        for seed in (900_000, (0, 3, 7), None):
            drops = FrameDrops(share)
            drops.restart(seed)
            one_by_one = np.array([drops.delivers() for _ in range(500)])
            drops.restart(seed)
            assert np.array_equal(drops.schedule(500), one_by_one)
            assert np.array_equal(one_by_one, expected_arrivals(share, seed, 500))
    drops = FrameDrops(0.25)
    drops.restart(900_000)
    many = drops.schedule(20_000)
    assert abs((~many).mean() - 0.25) < 0.01 and many[0]
    drops.restart(900_001)
    assert not np.array_equal(drops.schedule(20_000), many)   # another track, another schedule
    none = FrameDrops(0.0)
    none.restart(900_000)
    assert none.schedule(5000).all()


def test_bad_values_are_refused_in_one_line():
    assert parse_perturbation("frame-drop") == ("frame-drop", 0.25)
    assert parse_perturbation("frame-drop=0.5") == ("frame-drop", 0.5)
    assert parse_perturbation("frame-drop=0") == ("frame-drop", 0.0)
    for text, shown in (("frame-drop=0.95", "0.95"), ("frame-drop=-0.1", "-0.1"), ("frame-drop=nan", "nan"),
                        ("frame-drop=1", "1.0")):
        with pytest.raises(ValueError, match=rf"^frame-drop: the level must be a number in 0\.0\.\.0\.9, got {shown}$"):
            parse_perturbation(text)
    with pytest.raises(ValueError, match=r"^frame-drop: the level must be a number in 0\.0\.\.0\.9, got 'lots'$"):
        parse_perturbation("frame-drop=lots")
    with pytest.raises(ValueError, match=r"^frame-drop: the share of dropped frames must be a number in 0\.\.0\.9"):
        FrameDrops(0.95)
    # where it does not apply: expert eval's actors take every frame, the Udacity drives only frame-drop
    with pytest.raises(ValueError, match="^--perturb: frame-drop does not apply here; this takes colour, side-bars, "
                                         "noise, occlusion, domain-randomize$"):
        check_perturb_flag("frame-drop=0.25", ENV_PERTURBATIONS)
    with pytest.raises(ValueError, match="^--perturb: noise does not apply here; this takes frame-drop$"):
        check_perturb_flag("noise", ("frame-drop",))
    with pytest.raises(ValueError, match="^frame-drop changes no env"):   # the driver drops, never the env
        apply_perturbation(gym.make("CarRacing-v3"), "frame-drop")
    assert frame_drops(None) is None and frame_drops("noise=3") is None and frame_drops("frame-drop").share == 0.25


def carracing_drive(driver, seeds=SEEDS, frames=60):
    """``driver`` drives ``frames`` frames of each track; (the frame and action of every env step)."""
    steps = []
    run_episodes(driver, list(seeds), max_steps=frames,
                 on_step=lambda ep, i, obs, action, reward, info: steps.append((ep, i, obs, action)))
    return steps


def test_the_carracing_policy_sees_the_scheduled_frames_at_their_times_and_the_env_steps_every_frame():
    spy = Spy(DrivingPolicy(PolicyConfig()).eval())
    driver = PolicyDriver(spy, drops=FrameDrops(0.5))
    steps = carracing_drive(driver)
    assert len(steps) == 2 * 60   # the env stepped every frame
    shown = iter(spy.seen)
    for ep, seed in enumerate(SEEDS):
        arrived = expected_arrivals(0.5, seed, 60)
        assert driver.dropped[ep] == (~arrived).sum() > 20
        last = None
        for ep_, i, obs, action in (s for s in steps if s[0] == ep):
            if arrived[i]:
                seen = next(shown)
                assert np.array_equal(seen["image"], obs) and seen["timestamp"] == i * 0.02   # its real time
                last = action
            assert action == last   # a dropped frame: the last action again
    assert next(shown, None) is None   # the policy saw nothing else
    assert len(driver.latencies_ms) == len(spy.seen)   # only the frames it saw are timed


def test_drop_zero_is_the_plain_drive_bit_for_bit():
    policy = load_driving_policy()
    outputs = {}
    for name, drops in (("plain", None), ("P=0", FrameDrops(0.0))):
        driver, seen = PolicyDriver(policy, drops=drops), []
        run_episodes(driver, list(SEEDS), max_steps=80,
                     on_step=lambda *step: seen.append((step[3], policy.last_output.clone())))
        outputs[name] = seen
        assert drops is None or driver.dropped == [0, 0]
    assert len(outputs["plain"]) == 160
    assert all(a == b and torch.equal(x, y) for (a, x), (b, y) in zip(outputs["plain"], outputs["P=0"]))


class ActionLog(gym.Wrapper):
    """Records every action the env is stepped with."""

    def __init__(self, env):
        super().__init__(env)
        self.actions = []

    def step(self, action):
        self.actions.append(float(np.asarray(action).reshape(-1)[0]))
        return self.env.step(action)


def udacity_policy():
    return DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1,
                                      frame_dt=1 / 15)).eval()


def test_the_udacity_emulator_drive_drops_the_scheduled_frames():
    spy = Spy(udacity_policy())
    env = ActionLog(udacity_emulator_env("random-900000"))
    [result] = udacity_emulator_episodes(PolicyDriver(spy, drops=FrameDrops(0.5)), [env], frames=40)
    assert result["frames"] == len(env.actions) == 40 and not result["off_road"]
    arrived = expected_arrivals(0.5, 900_000, 40)   # the track's seed
    assert [obs["timestamp"] for obs in spy.seen] == pytest.approx(np.flatnonzero(arrived) / 15, abs=1e-12)
    held = np.maximum.accumulate(np.where(arrived, np.arange(40), 0))   # the frame whose action each step sends
    answers = {i: (k + 1) / 1000 for k, i in enumerate(np.flatnonzero(arrived))}
    assert env.actions == pytest.approx([answers[i] for i in held])
    env.close()


def test_the_bridge_sends_the_last_steering_again_for_a_dropped_telemetry_frame():
    import base64

    import cv2

    image = base64.b64encode(cv2.imencode(".jpg", np.full((160, 320, 3), 90, np.uint8))[1].tobytes()).decode()
    spy = Spy(udacity_policy())
    driver = PolicyDriver(spy, drops=FrameDrops(0.5))
    bridge = UdacityBridge(driver, speed=9.0)
    bridge.on_connect("car")
    sent = [float(bridge.on_telemetry({"steering_angle": "0", "throttle": "0.2", "speed": "8.0", "image": image},
                                      arrived=100.0 + k / 15)[1]["steering_angle"]) for k in range(30)]
    arrived = expected_arrivals(0.5, None, 30)   # no track seed: the fixed stream, at every connection
    assert [obs["timestamp"] for obs in spy.seen] == [100.0 + k / 15 for k in np.flatnonzero(arrived)]
    held = np.maximum.accumulate(np.where(arrived, np.arange(30), 0))
    answers = {i: (k + 1) / 1000 for k, i in enumerate(np.flatnonzero(arrived))}
    assert sent == pytest.approx([answers[i] for i in held], abs=1e-6)
    assert driver.dropped == [(~arrived).sum()] and bridge.stats.answered == 30


def episodes(lengths=(300, 200), fps=50.0):
    rng = np.random.default_rng(0)
    return [Episode(frames=rng.integers(0, 255, (n, 96, 96, 3), dtype=np.uint8), actions=np.arange(n) % 5,
                    rewards=np.zeros(n), timestamps=np.arange(n) / fps, seed=e, expert="test", source="test")
            for e, n in enumerate(lengths)]


def test_training_windows_under_drop_are_cut_from_the_frames_left_with_their_real_timestamps():
    eps, window, share = episodes(), 8, 0.25
    dropped = WindowDataset(eps, window, frame_drop=share, seed=5)
    regular = WindowDataset(eps, window)
    assert len(dropped) == len(regular)   # the same windows to sample, each cut from the frames left
    gaps, spans, firsts = 0, 0, {}
    for i in range(len(dropped)):
        e, start = dropped.index[i]
        arrived = np.flatnonzero(expected_arrivals(share, (5, 0, e), len(eps[e])))
        at = dropped.positions(i)
        frames, stamps, actions = dropped[i]
        k = int(np.searchsorted(arrived, at[0]))
        assert np.array_equal(at, arrived[k:k + window])   # consecutive frames that arrived
        assert torch.equal(frames, torch.from_numpy(eps[e].frames[at]).permute(0, 3, 1, 2))
        assert torch.equal(actions, torch.from_numpy(eps[e].actions[at]))
        assert torch.allclose(stamps, torch.from_numpy((at - at[0]) / 50).float())   # real time: gaps show
        gaps, spans = gaps + (at[-1] - at[0] - (window - 1)), spans + at[-1] - at[0]
        firsts.setdefault(e, set()).add(k)
    schedules = [expected_arrivals(share, (5, 0, e), len(ep)) for e, ep in enumerate(eps)]
    realised = np.mean(~np.concatenate(schedules))   # 0.274 here (the stream's share is P over long runs)
    assert abs(gaps / spans - realised) < 0.01   # the windows' gaps: the share of their frames that were dropped
    for e, ks in firsts.items():   # every window of frames that arrived is drawn
        assert ks == set(range(len(np.flatnonzero(expected_arrivals(share, (5, 0, e), len(eps[e])))) - window + 1))
    before = [dropped.positions(i) for i in range(0, len(dropped), 7)]
    dropped.set_epoch(1)   # redrawn each epoch
    assert not all(np.array_equal(a, dropped.positions(i)) for a, i in zip(before, range(0, len(dropped), 7)))
    none = WindowDataset(eps, window, frame_drop=0.0, seed=5)
    assert all(torch.equal(a, b) for i in range(0, len(regular), 13) for a, b in zip(none[i], regular[i]))


def test_training_feeds_the_dropped_windows_and_validation_stays_regular(tmp_path, monkeypatch):
    from nac_drive.data_collection.carracing_dataset import write_dataset
    from nac_drive.pipeline import train as train_module
    from nac_drive.pipeline.train_args import TrainArgs
    from support.demos import synthetic_episodes

    write_dataset(tmp_path / "demos", "synthetic", synthetic_episodes(length=120), "CarRacing-v3", expert="bands",
                  description="test")
    fed = {True: [], False: []}   # the timestamps the core was given, training (True) and validation
    outputs_from_features = DrivingPolicy.outputs_from_features
    monkeypatch.setattr(DrivingPolicy, "outputs_from_features", lambda self, x, t, *rest: (
        fed[self.training].append(t.clone()), outputs_from_features(self, x, t, *rest))[1])
    args = TrainArgs(data=str(tmp_path / "demos"), out=str(tmp_path / "runs"), window=6, d_model=16, num_heads=2,
                     topk=3, epochs=2, windows_per_epoch=96, batch_size=16, progress=False, val_fraction=0.25,
                     frame_drop=0.5)
    run = train_module.train(args)
    assert run.name == "carracing__nac-exact__w6__s0__drop0.5"
    assert json.loads((run / "train_args.json").read_text())["frame_drop"] == 0.5
    steps = torch.cat([t.diff(dim=1) for t in fed[True]]).flatten() / 0.02   # frame periods between frames
    assert abs(1 - 1 / steps.mean().item() - 0.5) < 0.06   # a share 0.5 of the spanned frames was dropped
    assert fed[False] and torch.allclose(torch.cat([t.diff(dim=1) for t in fed[False]]), torch.tensor(0.02))


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nac_drive.cli", *args], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONSAFEPATH="1"))


def test_the_drive_reports_its_dropped_frames_and_the_cli_refuses_what_cannot_apply():
    done = cli("drive", "carracing", "--episodes", "2", "--max-steps", "50", "--perturb", "frame-drop=0.5", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["perturbation"] == {"name": "frame-drop", "level": 0.5} and summary["lengths"] == [50, 50]
    assert summary["frames_dropped"] == [int((~expected_arrivals(0.5, s, 50)).sum()) for s in SEEDS]
    for args, error in (
            (["drive", "carracing", "--perturb", "frame-drop=0.95"],
             "--perturb: frame-drop: the level must be a number in 0.0..0.9, got 0.95"),
            (["drive", "udacity", "--perturb", "noise"], "--perturb: noise does not apply here; this takes frame-drop"),
            (["expert", "eval", "--perturb", "frame-drop"],
             "--perturb: frame-drop does not apply here; this takes colour, side-bars, noise, occlusion, "
             "domain-randomize"),
            (["drive", "carracing", "--perturb", "frame-drop", "--trace", "/nonexistent/run", "--video", "v.webm"],
             "--video: under frame-drop the video shows every frame and the trace only those the policy saw, which "
             "the dashboard cannot pair; give --trace or --video"),
            (["train", "--window", "1", "--frame-drop", "0.5"], "--frame-drop: a window of one frame (--window 1) "
                                                                 "has no time between frames for dropped frames to "
                                                                 "stretch"),
            (["train", "--frame-drop", "0.95"], "--frame-drop: must be <= 0.9, got 0.95")):
        refused = cli(*args)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, (args, refused.stderr[-2000:])
        assert refused.stderr.strip().splitlines()[-1].endswith(error), (args, refused.stderr[-500:])


def test_a_perturbed_drive_names_its_perturbation_in_its_trace(tmp_path):
    """The trace of a drive under --perturb once did not say so: its replays could not be told
    from a plain drive's."""
    from nac_drive.interpret.trace import load_trace
    from nac_drive.pipeline.drive import DriveArgs, drive_carracing, drive_udacity_emulator

    for perturb, expected in ((None, None), ("frame-drop=0.25", {"name": "frame-drop", "level": 0.25})):
        summary = drive_carracing(DriveArgs(episodes=1, max_steps=10, trace=str(tmp_path / "car"), perturb=perturb),
                                  progress=False)
        assert load_trace(summary["trace"]).metadata["run"]["perturbation"] == expected
    summary = drive_udacity_emulator(tracks=["random-900000"], frames=10, trace_dir=tmp_path / "udacity",
                                     perturb="frame-drop=0.5", progress=False)
    assert load_trace(summary["trace"]).metadata["run"]["perturbation"] == {"name": "frame-drop", "level": 0.5}
