"""CarRacing env factory, episode runner, PPO expert adapter, privileged teacher, CLI.

CarRacing steps cost ~15 ms, so every test caps its episodes with ``max_steps``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from support.expert_zips import rewrite_zip, shipped_with_data

from nac_drive.agents.ppo_lab.env import Preprocessing, preprocess
from nac_drive.agents.ppo_lab.expert_zip import load_expert_zip, read_data
from nac_drive.agents.ppo_expert import PPOExpert, shipped_expert_path
from nac_drive.agents.teacher import PurePursuitTeacher
from nac_drive.simulators.carracing import (
    COLLECT_SEED_BASE,
    EVAL_SEED_BASE,
    EXPERT_TRAIN_SEED_BASE,
    GAS,
    NOOP,
    ActionBursts,
    ActionRepeat,
    EpisodeResults,
    eval_seeds,
    make_carracing,
    run_episodes,
)


def _track(env) -> np.ndarray:
    return np.array(env.unwrapped.track)


# --- simulators.carracing -------------------------------------------------------------

def test_seed_ranges_are_disjoint():
    assert eval_seeds(20) == list(range(900_000, 900_020))
    assert EXPERT_TRAIN_SEED_BASE < COLLECT_SEED_BASE < EVAL_SEED_BASE
    with pytest.raises(ValueError, match="n must be"):
        eval_seeds(0)


def test_a_human_window_does_not_break_loading_an_expert_later(tmp_path):
    """A process that showed CarRacing's window and then loads an expert zip (which imports
    triton through torch._dynamo) must not crash. Without make_carracing's software
    framebuffer, SDL's OpenGL window left Mesa's libLLVM loaded globally and the import
    segfaulted. The tests' own SDL dummy driver is removed for this process."""
    script = ("from nac_drive.simulators.carracing import make_carracing\n"
              "from nac_drive.agents.ppo_expert import PPOExpert\n"
              "env = make_carracing(render_mode='human'); env.reset(seed=900000); env.step(3); env.close()\n"
              "print(PPOExpert().name)\n")
    env = {k: v for k, v in os.environ.items() if k != "SDL_VIDEODRIVER"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("ppo:ppo_carracing_discrete")


def test_factory_seed_gives_reproducible_tracks():
    a, b, c = make_carracing(seed=7), make_carracing(seed=7), make_carracing(seed=8)
    try:
        # The factory's seed fixes the env's track generator: the next unseeded resets
        # give the same tracks for the same seed, and different ones for another seed.
        for _ in range(2):
            obs_a, _ = a.reset()
            obs_b, _ = b.reset()
            c.reset()
            assert np.array_equal(_track(a), _track(b))
            assert np.array_equal(obs_a, obs_b)
            assert not np.array_equal(_track(a)[:20], _track(c)[:20])
        # A reset seed alone also fixes the track.
        a.reset(seed=123)
        b.reset(seed=123)
        assert np.array_equal(_track(a), _track(b))
        assert obs_a.shape == (96, 96, 3) and obs_a.dtype == np.uint8
    finally:
        for env in (a, b, c):
            env.close()


def test_action_repeat_skip_render_matches_stock_env():
    fast = ActionRepeat(make_carracing(), 4, skip_render=True)
    stock = ActionRepeat(make_carracing(), 4, skip_render=False)
    try:
        assert np.array_equal(fast.reset(seed=3)[0], stock.reset(seed=3)[0])
        rng = np.random.default_rng(0)
        for _ in range(25):
            action = int(rng.choice([NOOP, 1, 2, GAS, GAS, 4]))
            o1, r1, t1, tr1, _ = fast.step(action)
            o2, r2, t2, tr2, _ = stock.step(action)
            assert np.array_equal(o1, o2)
            assert (r1, t1, tr1) == (r2, t2, tr2)
        assert fast.unwrapped.t == pytest.approx(1.0 / 50 * (1 + 25 * 4))  # 4 frames a step
        from nac_drive.simulators.road_drawing import FontLoadedOnce

        assert isinstance(fast.unwrapped.__dict__["_render"], FontLoadedOnce)   # its faster drawing kept
    finally:
        fast.close()
        stock.close()


class _ActionLog(gym.Env):
    """A stand-in env that logs the actions it gets (CarRacing's discrete space by default)."""

    observation_space = gym.spaces.Box(0, 255, (96, 96, 3), np.uint8)

    def __init__(self, action_space=None):
        self.action_space = action_space or gym.spaces.Discrete(5)
        self.executed: list = []
        self.reset_seeds: list = []

    def reset(self, *, seed=None, options=None):
        self.reset_seeds.append(seed)
        return np.zeros((96, 96, 3), np.uint8), {}

    def step(self, action):
        self.executed.append(action)
        return np.zeros((96, 96, 3), np.uint8), 0.0, False, False, {"inner": True}


def _bursts(rate, burst_frames, seed=0, action_space=None):
    return ActionBursts(_ActionLog(action_space), rate, burst_frames, seed=seed)


def _drive(env, steps, action=NOOP, episode_seed=None):
    """One episode of ``steps`` frames: (actions the inner env executed, disturbed flags)."""
    env.reset(seed=episode_seed)
    infos = [env.step(action)[4] for _ in range(steps)]
    assert all(info["inner"] for info in infos)                  # the inner env's info is kept
    return np.array(env.unwrapped.executed[-steps:]), np.array([info["disturbed"] for info in infos])


def test_action_bursts_replace_the_agents_action_for_whole_bursts():
    executed, disturbed = _drive(_bursts(0.0, 5), 300)
    assert not disturbed.any() and (executed == NOOP).all()      # rate 0: the agent drives

    executed, disturbed = _drive(_bursts(1.0, 4), 400)
    assert disturbed.all()
    blocks = executed.reshape(100, 4)
    assert (blocks == blocks[:, :1]).all()                       # one action held per burst
    assert set(blocks[:, 0]) == set(range(5))                    # drawn from the whole space

    executed, disturbed = _drive(_bursts(0.1, 5), 6000)
    # idle frames before a burst are geometric with mean (1 - p) / p = 9, then 5 disturbed
    assert disturbed.mean() == pytest.approx(5 / 14, abs=0.02)
    assert (executed[~disturbed] == NOOP).all()
    edges = np.flatnonzero(np.diff(np.r_[0, disturbed.astype(int), 0]))
    runs = edges[1::2] - edges[::2]                               # back-to-back bursts make longer runs
    assert (runs[:-1] % 5 == 0).all() and len(runs) > 300

    again, _ = _drive(_bursts(0.1, 5), 6000)
    other, _ = _drive(_bursts(0.1, 5, seed=1), 6000)
    assert np.array_equal(again, executed) and not np.array_equal(other, executed)


def test_action_bursts_are_reproducible_per_episode_and_leave_the_envs_space_alone():
    env = _bursts(0.2, 3, seed=4)
    env.unwrapped.action_space.seed(123)
    _drive(env, 137, episode_seed=5)                             # an earlier episode of some length
    later, _ = _drive(env, 200, episode_seed=7)
    alone, _ = _drive(_bursts(0.2, 3, seed=4), 200, episode_seed=7)
    assert np.array_equal(later, alone)
    assert env.unwrapped.reset_seeds == [5, 7]                    # the seed reaches the env
    fresh = gym.spaces.Discrete(5, seed=123)
    assert [env.unwrapped.action_space.sample() for _ in range(20)] == [fresh.sample() for _ in range(20)]


def test_action_bursts_in_a_continuous_space_and_bad_arguments():
    box = gym.spaces.Box(np.array([-1, 0, 0], np.float32), np.array([1, 1, 1], np.float32))
    executed, disturbed = _drive(_bursts(1.0, 2, action_space=box), 40, action=np.zeros(3, np.float32))
    assert disturbed.all() and executed.shape == (40, 3)
    assert ((executed >= box.low) & (executed <= box.high)).all()
    assert np.array_equal(executed[0::2], executed[1::2]) and len(np.unique(executed[:, 0])) == 20

    env = _bursts(1.0, 1000)
    env.reset()
    env.step(NOOP)
    env.rate = 0.0
    env.reset()                                                    # ends the burst under way
    assert env.step(GAS)[4]["disturbed"] is False and env.unwrapped.executed[-1] == GAS
    for rate, burst_frames in ((-0.1, 5), (1.5, 5), (0.1, 0)):
        with pytest.raises(ValueError, match="ActionBursts"):
            ActionBursts(_ActionLog(), rate, burst_frames)


class _GasTeacher:
    def reset(self):
        self.env = None

    def reset_env(self, env):
        self.env = env

    def act(self, obs):
        assert self.env.unwrapped.car is not None                  # the labeller sees the real env
        assert obs.shape == (96, 96, 3)                            # and the frame
        return GAS


def test_dagger_student_env_records_the_teachers_labels_under_bursts():
    from nac_drive.pipeline.dagger import student_env

    env = student_env(_GasTeacher(), continuous=False, disturb_rate=1.0, disturb_frames=5, seed=0)
    try:
        assert isinstance(env.env, ActionBursts)
        env.reset(seed=COLLECT_SEED_BASE)
        assert all(env.step(NOOP)[4]["disturbed"] for _ in range(20))
        (episode,) = env.take_episodes()
        assert list(episode["actions"]) == [GAS] * 20                  # labels, not what the car did
    finally:
        env.close()
    plain = student_env(_GasTeacher(), continuous=False)
    try:
        assert not isinstance(plain.env, ActionBursts)
    finally:
        plain.close()


class _ConstantActor:
    def __init__(self, action):
        self.action, self.resets = action, 0

    def reset(self):
        self.resets += 1

    def act(self, obs):
        assert obs.shape == (96, 96, 3) and obs.dtype == np.uint8
        return self.action


def test_run_episodes_summary_is_computed_from_episodes():
    steps = []
    actor = _ConstantActor(GAS)
    res = run_episodes(actor, [5, 6], max_steps=15,
                       on_step=lambda ep, t, obs, a, r, info: steps.append((ep, t, r)))
    assert actor.resets == 2
    assert res.seeds == [5, 6] and res.lengths == [15, 15] and res.laps == [False, False]
    assert len(res.latencies_ms) == 30 and len(steps) == 30
    for ep in (0, 1):  # per-episode return = sum of the rewards seen by on_step
        assert res.returns[ep] == pytest.approx(sum(r for e, _, r in steps if e == ep))
    s = res.summary()
    for key in ("mean_return", "std_return", "episodes", "laps_finished", "seeds",
                "latency_ms_p50"):
        assert key in s
    assert s["episodes"] == 2 and s["seeds"] == [5, 6] and s["laps_finished"] == 0
    assert s["mean_return"] == pytest.approx(np.mean(res.returns))
    assert s["std_return"] == pytest.approx(np.std(res.returns))
    assert s["latency_ms_p50"] == pytest.approx(np.median(res.latencies_ms))
    json.dumps(s)  # the summary is the JSON line of the CLI


class _LapEnv(gym.Env):
    """Fake env: ends after 3 steps; seeds >= 10 finish the lap, others leave the field."""

    observation_space = gym.spaces.Box(0, 255, (96, 96, 3), np.uint8)
    action_space = gym.spaces.Discrete(5)

    def reset(self, *, seed=None, options=None):
        self.seed_, self.t = seed, 0
        return np.zeros((96, 96, 3), np.uint8), {}

    def step(self, action):
        self.t += 1
        done = self.t == 3
        info = {"lap_finished": self.seed_ >= 10} if done else {}
        return np.zeros((96, 96, 3), np.uint8), 1.0, done, False, info


def test_run_episodes_counts_laps_from_env_termination():
    res = run_episodes(_ConstantActor(NOOP), [1, 10, 11], env=_LapEnv())
    assert res.laps == [False, True, True]
    assert res.lengths == [3, 3, 3] and res.returns == [3.0, 3.0, 3.0]
    assert res.summary()["laps_finished"] == 2
    assert EpisodeResults().summary()["episodes"] == 0


# --- PPO expert adapter ---------------------------------------------------------------

def test_preprocess_shape_and_errors():
    rgb = np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)
    gray = preprocess(rgb)
    assert gray.shape == (64, 64) and gray.dtype == np.uint8
    flat = np.full((96, 96, 3), 100, np.uint8)
    assert (preprocess(flat) == 100).all()
    with pytest.raises(ValueError, match="uint8"):
        preprocess(rgb.astype(np.float32))


@pytest.fixture(scope="module")
def expert() -> PPOExpert:
    return PPOExpert()  # the shipped zip


def shipped_at_repeat(path: Path, repeat: int) -> Path:
    """The shipped zip's network acting every ``repeat`` frames."""
    record = read_data(shipped_expert_path())["preprocessing"]
    return shipped_with_data(path, preprocessing={**record, "action_repeat": repeat})


@pytest.fixture(scope="module", params=["shipped", "repeat 4"])
def expert_at_each_rate(request, expert, tmp_path_factory) -> PPOExpert:
    """The shipped expert (acting every frame), and its network acting every 4th frame."""
    if request.param == "shipped":
        return expert
    return PPOExpert(shipped_at_repeat(tmp_path_factory.mktemp("rep") / "rep4.zip", 4))


def test_expert_repeats_actions_and_stacks_frames(tmp_path, monkeypatch):
    expert = PPOExpert(shipped_at_repeat(tmp_path / "rep4.zip", 4))
    decided = []

    def fake_decide(stack):
        decided.append(stack.copy())
        return len(decided)

    monkeypatch.setattr(expert, "decide", fake_decide)
    expert.reset()
    frames = [np.full((96, 96, 3), 10 * i, np.uint8) for i in range(9)]
    actions = [expert.act(f) for f in frames]
    # one decision every 4 frames, repeated in between
    assert actions == [1, 1, 1, 1, 2, 2, 2, 2, 3]
    assert len(decided) == 3
    # stack [n, 64, 64]: zeros before the first frame, then the frames seen at decisions
    n = expert.preprocessing.frame_stack
    assert n >= 2 and decided[0].shape == (n, 64, 64) and decided[0].dtype == np.uint8
    assert (decided[0] == 0).all()  # frame 0 is black
    assert (decided[1][:-1] == 0).all() and (decided[1][-1] == 40).all()
    assert (decided[2][:-2] == 0).all() and (decided[2][-2] == 40).all() and (decided[2][-1] == 80).all()
    expert.reset()
    assert expert.act(frames[5]) == 4 and (decided[3][:-1] == 0).all() and (decided[3][-1] == 50).all()


def test_expert_matches_sb3_on_the_training_env(expert_at_each_rate):
    """The adapter on the raw env picks the actions SB3 picks on the training wrappers."""
    from stable_baselines3 import PPO

    from nac_drive.agents.ppo_lab.env import make_vec_env

    expert = expert_at_each_rate
    # PPO.load unpickles: only for the zip this package ships (never for a zip from elsewhere)
    no_schedules = {"learning_rate": 0.0, "lr_schedule": lambda _: 0.0, "clip_range": lambda _: 0.0}
    model = PPO.load(expert.path, device="cpu", custom_objects=no_schedules)
    venv = make_vec_env(continuous=False, preprocessing=expert.preprocessing)
    venv.seed(900_003)
    vec_obs = venv.reset()
    raw = make_carracing(gas=expert.gas)
    obs, _ = raw.reset(seed=900_003)
    expert.reset()
    try:
        for step in range(80 // expert.action_repeat):   # 80 env frames
            sb3_action = int(model.predict(vec_obs, deterministic=True)[0][0])
            for k in range(expert.action_repeat):
                action = expert.act(obs)
                if k == 0:
                    assert np.array_equal(expert.observation, vec_obs[0]), step
                    assert action == sb3_action, step
                obs, *_ = raw.step(action)
            vec_obs, *_ = venv.step(np.array([sb3_action]))
    finally:
        venv.close()
        raw.close()


def test_a_stable_baselines3_user_drives_the_expert_with_its_actions(expert_at_each_rate):
    """Issue 18: plain SB3 (``PPO.load(...).predict``) on the gymnasium stack that the zip's
    preprocessing record builds (README) takes PPOExpert's action at every env frame of a
    real episode prefix, on the same observations, and the two cars stay together."""
    from stable_baselines3 import PPO

    from nac_drive.agents.ppo_lab.env import make_expert_env

    expert = expert_at_each_rate
    model = PPO.load(expert.path, device="cpu")   # unpickles: only for the zip this package ships (and a copy)
    env = make_expert_env(Preprocessing(**model.preprocessing))
    raw = make_carracing(gas=expert.gas)
    obs, _ = env.reset(seed=900_003)
    raw_obs, _ = raw.reset(seed=900_003)
    expert.reset()
    sb3_actions, expert_actions = [], []
    try:
        for step in range(400 // expert.action_repeat):   # 400 env frames
            action, _ = model.predict(obs, deterministic=True)
            for k in range(expert.action_repeat):
                expert_actions.append(expert.act(raw_obs))
                sb3_actions.append(int(action))
                if k == 0:
                    assert np.array_equal(expert.observation, obs), step
                raw_obs, *_ = raw.step(expert_actions[-1])
            obs, *_ = env.step(action)
            np.testing.assert_array_equal(raw.unwrapped.car.hull.position, env.unwrapped.car.hull.position)
    finally:
        env.close()
        raw.close()
    assert expert_actions == sb3_actions and len(set(sb3_actions)) >= 3   # it steers, accelerates, ...


def test_expert_evaluation_env_drives_consecutive_track_seeds():
    """Seeded with s, the training's evaluation env drives tracks s, s+1, ... (those of
    `expert eval --seed-base s`); a training env goes on with the generator's stream."""
    from nac_drive.agents.ppo_lab.env import make_vec_env

    def track(seed):
        env = make_carracing()
        env.reset(seed=seed)
        try:
            return _track(env)
        finally:
            env.close()

    def second_track(venv):
        venv.seed(62_000)
        venv.reset()
        venv.env_method("reset")  # what SB3's auto-reset does after an episode: no seed
        return np.array(venv.get_attr("track")[0])

    evaluation, training = make_vec_env(continuous=False), make_vec_env(continuous=False, reward_gamma=0.99)
    try:
        assert np.array_equal(second_track(evaluation), track(62_001))
        assert not np.array_equal(second_track(training), track(62_001))
    finally:
        evaluation.close()
        training.close()


@pytest.mark.slow
def test_scoring_a_checkpoint_fast_gives_what_expert_eval_gives(expert, capsys):
    """The fast path (training's evaluation env, undrawn frames skipped) drives the same
    episodes as the raw env with PPOExpert: one lap finished early (900004), one not."""
    from nac_drive.agents.ppo_lab.training import score_checkpoint
    from nac_drive.cli import main

    fast = score_checkpoint(expert.path, episodes=2, seed_base=900_003)
    raw = run_episodes(expert, [900_003, 900_004])
    assert fast.seeds == raw.seeds == [900_003, 900_004]
    assert fast.lengths == raw.lengths and fast.laps == raw.laps == [False, True]
    assert raw.lengths[1] < 1000
    np.testing.assert_allclose(fast.returns, raw.returns, rtol=0, atol=1e-5)  # Monitor rounds to 6 decimals

    zip_path = str(expert.path)
    assert main(["expert", "compare", zip_path, "--episodes", "1", "--seed-base", "900004", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert list(summary) == [zip_path] and summary[zip_path]["returns"] == [pytest.approx(raw.returns[1], abs=0.01)]
    with pytest.raises(SystemExit) as refused:   # argparse refuses --episodes 0
        main(["expert", "compare", zip_path, "--episodes", "0"])
    assert refused.value.code == 2
    capsys.readouterr()
    # a missing zip ends it in one line, before the good zip is driven
    assert main(["expert", "compare", zip_path, str(expert.path.parent / "nope.zip"), "--episodes", "1"]) == 2
    out, err = capsys.readouterr()
    assert "return" not in out and len(err.strip().splitlines()) == 1 and "nope.zip" in err


@pytest.mark.slow
def test_an_expert_with_a_stronger_gas_is_driven_in_its_own_env(tmp_path, capsys):
    """A zip whose GAS presses 0.5 is driven through DiscreteActions by `expert eval` and
    `expert compare` alike, and `compare --gas 0.5` drives another zip in that env."""
    from nac_drive.agents.ppo_lab.training import score_checkpoint
    from nac_drive.cli import main
    from nac_drive.pipeline.evaluate import ExpertEvalArgs, evaluate_expert

    record = read_data(shipped_expert_path())["preprocessing"]
    path = shipped_with_data(tmp_path / "gas.zip", preprocessing={**record, "gas": 0.5})
    _, evaluated = evaluate_expert(ExpertEvalArgs(expert=str(path), episodes=1, seed_base=900_004), progress=False)
    fast = score_checkpoint(path, 1, 900_004)
    stock = run_episodes(PPOExpert(path), [900_004], env=make_carracing())   # the same network, gymnasium's env
    assert fast.lengths == evaluated.lengths
    np.testing.assert_allclose(fast.returns, evaluated.returns, rtol=0, atol=1e-5)
    assert abs(evaluated.returns[0] - stock.returns[0]) > 1
    shipped = str(shipped_expert_path())
    assert main(["expert", "compare", shipped, "--episodes", "1", "--seed-base", "900004", "--gas", "0.5",
                 "--json"]) == 0
    compared = json.loads(capsys.readouterr().out.strip().splitlines()[-1])[shipped]
    assert compared["returns"] == [pytest.approx(fast.returns[0], abs=0.01)]
    # the teacher with a stronger gas (`expert eval --expert teacher-discrete --gas 0.5`)
    teacher = {gas: evaluate_expert(ExpertEvalArgs(expert="teacher-discrete", episodes=1, seed_base=900_004,
                                                   max_steps=300, gas=gas), progress=False)[1] for gas in (None, 0.5)}
    assert teacher[None].returns[0] < teacher[0.5].returns[0] - 5   # more tiles in the same 300 frames
    with pytest.raises(SystemExit) as refused:   # argparse refuses a gas outside (0, 1]
        main(["expert", "eval", "--expert", "teacher-discrete", "--gas", "0"])
    assert refused.value.code == 2


def test_a_zip_shipped_with_another_gas_keeps_its_weights_and_names_its_env(tmp_path, capsys):
    """`expert ship --gas` records the gas for every reader (PPOExpert, plain SB3's JSON);
    DAgger and the quickstart accept such an expert as the oracle of a student of that gas
    only; `expert eval --gas` does not override a zip's; a continuous zip has no gas."""
    from nac_drive.cli import main
    from nac_drive.pipeline.dagger import make_oracle
    from nac_drive.pipeline.evaluate import ExpertEvalArgs, evaluate_expert
    from nac_drive.pipeline.quickstart import QuickstartArgs, _check_recipe

    shipped, path = str(shipped_expert_path()), tmp_path / "gas.zip"
    assert main(["expert", "ship", shipped, str(path), "--gas", "0.5"]) == 0
    capsys.readouterr()
    reshipped = PPOExpert(path)
    assert reshipped.gas == 0.5 and PPOExpert(shipped).gas != 0.5 and read_data(path)["preprocessing"]["gas"] == 0.5
    for name, tensor in load_expert_zip(shipped).policy.state_dict().items():
        assert torch.equal(tensor, reshipped.policy.state_dict()[name]), name
    with pytest.raises(ValueError, match="gas.zip: the expert's GAS presses 0.5, the student's 0.2"):
        make_oracle(str(path), False)
    assert make_oracle(str(path), False, gas=0.5).gas == 0.5
    _check_recipe(QuickstartArgs(full=True, expert=str(path)))   # its own gas goes to its oracle check
    with pytest.raises(ValueError, match=r"--gas: ppo:gas's zip sets gas 0.5 \('expert compare ZIP --gas 0.3'"):
        evaluate_expert(ExpertEvalArgs(expert=str(path), episodes=1, gas=0.3))
    no_gas = {name: value for name, value in read_data(shipped)["preprocessing"].items() if name != "gas"}
    box = shipped_with_data(tmp_path / "box.zip", action_space={":type:": "Box"}, preprocessing=no_gas)
    with pytest.raises(ValueError, match="gas 0.5: .*box.zip is a continuous expert"):
        load_expert_zip(box, gas=0.5)


def test_shipping_several_checkpoints_ships_the_mean_of_their_weights(tmp_path, capsys):
    """`expert ship A B OUT` writes one zip whose every tensor is the mean of A's and B's,
    records both checkpoints' agent steps, and refuses zips of another preprocessing."""
    from nac_drive.cli import main

    shipped = shipped_expert_path()
    weights = load_expert_zip(shipped).policy.state_dict()
    buffer = io.BytesIO()
    torch.save({name: tensor + 1.0 for name, tensor in weights.items()}, buffer)
    later = shipped_with_data(tmp_path / "later.zip", num_timesteps=read_data(shipped)["num_timesteps"] + 50_000)
    later = rewrite_zip(later, tmp_path / "later_moved.zip", policy__pth=buffer.getvalue())
    out = tmp_path / "mean.zip"
    assert main(["expert", "ship", str(shipped), str(later), str(out)]) == 0
    averaged = PPOExpert(out).policy.state_dict()
    for name, tensor in weights.items():
        assert torch.allclose(averaged[name], tensor + 0.5, atol=1e-5), name
    steps = read_data(shipped)["num_timesteps"]
    assert read_data(out)["averaged_checkpoints"] == [steps, steps + 50_000]
    single = tmp_path / "single.zip"
    assert main(["expert", "ship", str(shipped), str(single)]) == 0 and "averaged_checkpoints" not in read_data(single)
    capsys.readouterr()
    other_gas = tmp_path / "gas.zip"
    assert main(["expert", "ship", str(shipped), str(other_gas), "--gas", "0.5"]) == 0
    assert main(["expert", "ship", str(shipped), str(other_gas), str(tmp_path / "bad.zip")]) == 2
    assert "gas.zip cannot be averaged with" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "bad.zip").exists()


def test_negative_reward_streak_truncates_the_episode():
    """A car standing still earns -0.1 a frame: after ``patience`` agent steps the
    episode ends as a truncation, which PPO bootstraps with the last state's value."""
    from nac_drive.agents.ppo_lab.env import make_vec_env

    venv = make_vec_env(continuous=False, patience=3)
    venv.seed(5)
    venv.reset()
    try:
        rewards, done = [], [False]
        while not done[0] and len(rewards) < 30:
            _, reward, done, info = venv.step(np.array([NOOP]))
            rewards.append(float(reward[0]))
    finally:
        venv.close()
    # the start tile pays first; then it ends at exactly the third negative step
    assert done[0] and rewards[0] > 0 and all(r < 0 for r in rewards[1:]) and len(rewards) == 4
    assert info[0]["negative_reward_streak"]
    # SB3's rollout collection adds gamma * V(terminal obs) exactly when this is True
    assert info[0]["TimeLimit.truncated"] is True


def test_load_policy_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.zip"
    bad.write_text("not a zip")
    with pytest.raises(ValueError, match="bad.zip"):
        load_expert_zip(bad)
    with pytest.raises(FileNotFoundError, match="missing.zip"):
        load_expert_zip(tmp_path / "missing.zip")
    # the preprocessing record: checked, consistent with the observation space; zips
    # from before it existed fall back to their 'action_repeat' (4 if absent)
    def with_data(name, **changes):
        return shipped_with_data(tmp_path / name, **changes)

    record = read_data(shipped_expert_path())["preprocessing"]
    assert record == {"frame_size": 64, "frame_stack": 4, "action_repeat": 1,
                      "grayscale": "cv2.COLOR_RGB2GRAY", "interpolation": "cv2.INTER_AREA", "gas": 0.4}
    no_gas = {name: value for name, value in record.items() if name != "gas"}
    assert load_expert_zip(with_data("nogas.zip", preprocessing=no_gas)).preprocessing.gas == 0.2   # gymnasium's
    for name, change, message in (
            ("rep.zip", {"action_repeat": 0}, "rep.zip: field 'preprocessing': action_repeat is 0"),
            ("lin.zip", {"interpolation": "cv2.INTER_LINEAR"}, "lin.zip: .*applies only 'cv2.INTER_AREA'"),
            ("extra.zip", {"crop": [0, 84]}, "extra.zip: field 'preprocessing' is"),
            ("gas.zip", {"gas": 0}, r"gas.zip: field 'preprocessing': gas is 0, expected a number in \(0, 1\]"),
            ("gasb.zip", {"gas": True}, "gasb.zip: field 'preprocessing': gas is True"),
            ("stack.zip", {"frame_stack": 3}, r"stack.zip: field 'observation_space' has shape \[4, 64, 64\], its "
                                              r"preprocessing makes \[3, 64, 64\]")):
        with pytest.raises(ValueError, match=message):
            load_expert_zip(with_data(name, preprocessing={**record, **change}))
    with pytest.raises(ValueError, match="box.zip: field 'preprocessing' has gas 0.5; only a discrete expert"):
        load_expert_zip(with_data("box.zip", preprocessing={**record, "gas": 0.5}, action_space={":type:": "Box"}))
    old = load_expert_zip(with_data("old.zip", preprocessing=None, action_repeat=2))
    assert old.preprocessing == Preprocessing(action_repeat=2, frame_stack=4)   # the observation space's stack
    assert load_expert_zip(with_data("older.zip", preprocessing=None)).action_repeat == 4
    with pytest.raises(ValueError, match="old0.zip: field 'preprocessing': action_repeat is 0"):
        load_expert_zip(with_data("old0.zip", preprocessing=None, action_repeat=0))


@pytest.mark.slow
def test_shipped_expert_is_small_and_drives(expert):
    assert shipped_expert_path().stat().st_size < 6_000_000
    assert not expert.continuous and expert.name == "ppo:ppo_carracing_discrete"
    res = run_episodes(expert, [EVAL_SEED_BASE], max_steps=400)
    # Constant gas scores about -66 here (it leaves the road at the first bend); a driver
    # that follows the road collects ~3.3 reward per tile, ~40% of the lap in 400 frames.
    assert res.returns[0] > 200


# --- privileged teacher ---------------------------------------------------------------

def test_teacher_needs_env_and_oracle_equals_actor():
    teacher = PurePursuitTeacher(continuous=True)
    with pytest.raises(RuntimeError, match="reset_env"):
        teacher.act(None)
    env = make_carracing(continuous=True)
    try:
        env.reset(seed=COLLECT_SEED_BASE)
        teacher.reset()
        teacher.reset_env(env)
        for _ in range(30):
            a = teacher.act(None)
            assert a.shape == (3,) and a.dtype == np.float32
            assert np.array_equal(a, teacher.action_for(env))
            assert -1 <= a[0] <= 1 and 0 <= a[1] <= 1 and 0 <= a[2] <= 1
            env.step(a)
    finally:
        env.close()


def test_teacher_discretisation():
    t = PurePursuitTeacher(continuous=False)
    assert t.discretise(0.0, 0.5, 0.6) == 4          # braking wins
    assert t.discretise(0.9, 0.5, 0.0, wheel_angle=0.0) == 1    # + = right
    assert t.discretise(0.9, 0.5, 0.0, wheel_angle=-0.4) == GAS  # wheels already at lock
    assert t.discretise(-0.9, 0.5, 0.0) == 2
    assert t.discretise(0.1, 0.5, 0.0, wheel_angle=0.0) == GAS   # small error: drive on
    assert t.discretise(0.0, 0.5, 0.0) == GAS
    assert t.discretise(0.0, 0.0, 0.0) == NOOP


@pytest.mark.slow
@pytest.mark.parametrize("continuous", [True, False])
def test_teacher_beats_constant_policies(continuous):
    seeds, steps = [COLLECT_SEED_BASE + 1], 300
    teacher = run_episodes(PurePursuitTeacher(continuous=continuous), seeds,
                           continuous=continuous, max_steps=steps)
    gas = np.array([0.0, 1.0, 0.0], np.float32) if continuous else GAS
    noop = np.zeros(3, np.float32) if continuous else NOOP
    for const in (gas, noop):
        baseline = run_episodes(_ConstantActor(const), seeds, continuous=continuous,
                                max_steps=steps)
        assert teacher.returns[0] > baseline.returns[0] + 50


# --- CLI ------------------------------------------------------------------------------

def test_cli_eval_json_last_line(capsys):
    from nac_drive.cli import main

    assert main(["expert", "eval", "--expert", "teacher", "--episodes", "2",
                 "--max-steps", "40", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["episodes"] == 2 and summary["seeds"] == [EVAL_SEED_BASE, EVAL_SEED_BASE + 1]
    assert summary["laps_finished"] == 0 and summary["expert"] == "teacher"
    assert summary["mean_return"] == pytest.approx(np.mean(summary["returns"]), abs=0.01)
    assert summary["latency_ms_p50"] > 0


def test_cli_eval_bad_expert_path_names_it(tmp_path, capsys):
    from nac_drive.cli import main

    assert main(["expert", "eval", "--expert", str(tmp_path / "nope.zip"), "--episodes", "1"]) == 2
    assert "nope.zip" in capsys.readouterr().err.strip().splitlines()[-1]


def test_expert_training_starts_from_init_from(tmp_path):
    import torch

    from nac_drive.agents.ppo_lab.training import train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs

    tiny = dict(out=str(tmp_path), n_envs=1, n_steps=8, batch_size=8, n_epochs=1, total_frames=32,
                eval_every_frames=10**9, progress_bar=False)
    # learning rate 0: the run's weights stay exactly those it started from
    final = train_expert(ExpertTrainArgs(run_name="ft", init_from=str(shipped_expert_path()), learning_rate=0.0, **tiny))
    trained = load_expert_zip(final).policy
    shipped = load_expert_zip(shipped_expert_path()).policy
    for name, tensor in shipped.state_dict().items():
        assert torch.equal(trained.state_dict()[name], tensor), name
    # evaluated every 16 frames (8 agent steps at repeat 2): both checkpoints are kept
    fresh_zip = train_expert(ExpertTrainArgs(run_name="fresh", learning_rate=0.0, action_repeat=2, gamma=0.97,
                                             gas=0.5, frame_stack=3, **{**tiny, "eval_every_frames": 16, "eval_episodes": 1}))
    kept = sorted(p.name for p in (tmp_path / "fresh" / "evaluated").glob("*.zip"))
    assert kept == ["frames_16.zip", "frames_32.zip"] and fresh_zip.name == "best_model.zip"
    assert torch.equal(load_expert_zip(tmp_path / "fresh" / "evaluated" / "frames_32.zip")[0].action_net.weight,
                       load_expert_zip(fresh_zip)[0].action_net.weight)  # learning rate 0: all the same
    assert not (tmp_path / "ft" / "evaluated").exists()   # never evaluated
    fresh, _, fresh_preprocessing = load_expert_zip(fresh_zip)
    assert not torch.equal(fresh.state_dict()["action_net.weight"], shipped.state_dict()["action_net.weight"])
    # the zip carries the rate it was trained at, and the adapter acts at it
    assert fresh_preprocessing == Preprocessing(frame_stack=3, action_repeat=2, gas=0.5)
    assert PPOExpert(fresh_zip).action_repeat == 2
    # without --action-repeat a fine-tune acts at its start's rate (the shipped expert's 1, not 4),
    # and its args.json records the rate (what `expert resume` reads); --action-repeat overrides it
    assert PPOExpert(final).action_repeat == PPOExpert().action_repeat == 1
    assert json.loads((tmp_path / "ft" / "args.json").read_text())["action_repeat"] == 1
    at_two = train_expert(ExpertTrainArgs(run_name="ft2", init_from=str(shipped_expert_path()), action_repeat=2,
                                          gamma=0.9, learning_rate=0.0, **tiny))
    assert PPOExpert(at_two).action_repeat == 2
    assert json.loads((tmp_path / "ft2" / "args.json").read_text())["gamma"] == 0.9
    # ... and it trains with its start's discount, gas and frame stack (the fresh run's 0.97, 0.5 and 3,
    # not 0.99, 0.2 and 2)
    ft3 = train_expert(ExpertTrainArgs(run_name="ft3", init_from=str(fresh_zip), learning_rate=0.0, **tiny))
    saved = json.loads((tmp_path / "ft3" / "args.json").read_text())
    assert saved["gamma"] == 0.97 and saved["gas"] == 0.5 and PPOExpert(ft3).gas == 0.5
    assert saved["frame_stack"] == 3 and PPOExpert(ft3).preprocessing.frame_stack == 3
    assert PPOExpert(final).gas == PPOExpert().gas == 0.4   # the shipped expert's
    with pytest.raises(ValueError, match="init_from"):
        train_expert(ExpertTrainArgs(run_name="bad", init_from=str(shipped_expert_path()), head_units=32, **tiny))


def test_expert_training_updates_on_more_threads_and_drives_on_one(tmp_path, monkeypatch):
    """The workers drive while the main process waits on them with one thread; the PPO
    update, when the workers wait, gets ``update_threads`` (default: every core), and the
    caller's thread count is back afterwards."""
    from stable_baselines3 import PPO

    from nac_drive.agents.ppo_lab.training import UpdateThreads, train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs
    from nac_drive.torch_threads import available_cores

    seen = {"update": [], "rollout": []}   # threads at each update, and at each rollout step
    ppo_train = PPO.train

    def train(self):
        seen["update"].append(torch.get_num_threads())
        return ppo_train(self)

    monkeypatch.setattr(PPO, "train", train)
    monkeypatch.setattr(UpdateThreads, "_on_step", lambda self: seen["rollout"].append(torch.get_num_threads()) or True)
    threads = torch.get_num_threads()
    try:
        train_expert(ExpertTrainArgs(out=str(tmp_path), run_name="t", n_envs=1, n_steps=8, batch_size=8, n_epochs=1,
                                     action_repeat=1, total_frames=32, eval_every_frames=10**9, update_threads=3,
                                     progress_bar=False))
        assert torch.get_num_threads() == 1   # what train_expert set before training (not the update's 3)
    finally:
        torch.set_num_threads(threads)
    assert seen["update"] == [3] * 4   # 32 frames at repeat 1: 4 rollouts of 8
    assert set(seen["rollout"]) == {1} and len(seen["rollout"]) == 32
    assert UpdateThreads().threads == available_cores() >= 1


def test_expert_training_resumes_from_its_last_kept_checkpoint(tmp_path, monkeypatch):
    import torch
    from stable_baselines3 import PPO

    from nac_drive.agents.ppo_lab.training import resume_expert, train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs
    from nac_drive.cli import main

    # 32 agent steps (repeat 2) in rollouts of 8; evaluated and kept at 16 and 32 steps
    train_expert(ExpertTrainArgs(out=str(tmp_path), run_name="r", n_envs=1, n_steps=8, batch_size=8, n_epochs=1,
                    total_frames=64, action_repeat=2, eval_every_frames=32, eval_episodes=1,
                    progress_bar=False))
    run, kept = tmp_path / "r", tmp_path / "r" / "evaluated"
    assert sorted(p.name for p in kept.glob("*.zip")) == ["frames_32.zip", "frames_64.zip"]

    def optimizer_state(zip_path):
        with zipfile.ZipFile(zip_path) as zf:
            return torch.load(io.BytesIO(zf.read("policy.optimizer.pth")), weights_only=True)["state"]

    def state(frames):
        return json.loads((kept / f"frames_{frames}.json").read_text())

    at_32 = state(32)
    assert {int(s["step"]) for s in optimizer_state(kept / "frames_32.zip").values()} == {1}  # one update
    assert at_32["evaluations_timesteps"] == [16] and at_32["best_mean_reward"] == np.mean(at_32["evaluations_results"][0])
    for late in kept.glob("frames_64*"):   # as if killed after the first evaluation
        late.unlink()

    # What training goes on from: the kept weights, Adam state, step count and statistics.
    started = {}

    def record_start(model, total_timesteps, **kwargs):
        started.update(weights=model.policy.state_dict(), steps=model.num_timesteps, todo=total_timesteps,
                       adam=model.policy.optimizer.state_dict()["state"], count=model.get_vec_normalize_env().ret_rms.count,
                       best=kwargs["callback"][0].best_mean_reward)   # [evaluation, UpdateThreads]
        return model

    with monkeypatch.context() as patch:
        patch.setattr(PPO, "learn", record_start)
        # kept before evaluations drove consecutive tracks: its best score is not carried over
        (kept / "frames_32.json").write_text(json.dumps({k: v for k, v in at_32.items() if k != "eval_tracks"}))
        resume_expert(run)
        assert started["best"] == -np.inf
        (kept / "frames_32.json").write_text(json.dumps(at_32))
        resume_expert(run)
        assert started["best"] == at_32["best_mean_reward"] and at_32["eval_tracks"] == "consecutive"
    kept_policy = load_expert_zip(kept / "frames_32.zip").policy   # one Adam step from the fresh weights
    for name, tensor in kept_policy.state_dict().items():
        assert torch.equal(started["weights"][name], tensor), name
    for key, value in optimizer_state(kept / "frames_32.zip").items():
        assert torch.equal(started["adam"][key]["exp_avg"], value["exp_avg"])
    assert started["steps"] == 16 and started["todo"] == 16 and started["count"] == at_32["reward_norm"]["count"]

    assert main(["expert", "resume", str(run)]) == 0
    # the optimizer and the statistics went on; the evaluation history holds each evaluation once
    assert {int(s["step"]) for s in optimizer_state(run / "final_model.zip").values()} == {3}  # fresh: 2
    assert state(64)["reward_norm"]["count"] == pytest.approx(at_32["reward_norm"]["count"] + 16)
    assert state(64)["evaluations_timesteps"] == [16, 32]
    with zipfile.ZipFile(run / "final_model.zip") as zf:
        assert json.loads(zf.read("data"))["num_timesteps"] == 32
    with pytest.raises(ValueError, match="--total-frames"):
        resume_expert(run)                                              # the target is reached
    assert json.loads((run / "args.json").read_text())["total_frames"] == 64
    # args.json of a run from before the retired options left: read without them if unused
    saved = json.loads((run / "args.json").read_text())
    (run / "args.json").write_text(json.dumps({**saved, "combined_actions": False, "released_brake": -1.0}))
    with pytest.raises(ValueError, match="--total-frames"):
        resume_expert(run)
    (run / "args.json").write_text(json.dumps({**saved, "negative_streak_terminates": True}))
    with pytest.raises(ValueError, match="negative_streak_terminates=True, an option removed after commit 9f5ea65"):
        resume_expert(run, total_frames=128)
    (run / "args.json").write_text(json.dumps(saved))
    with pytest.raises(FileNotFoundError, match="args.json"):
        resume_expert(tmp_path / "nowhere")
    (kept / "frames_64.json").unlink()
    with pytest.raises(FileNotFoundError, match="frames_64.json"):
        resume_expert(run, total_frames=128)


def test_a_resumed_run_gets_new_training_tracks_clear_of_validation():
    from nac_drive.agents.ppo_lab.training import resume_seed
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs

    args = ExpertTrainArgs(seed=20, n_envs=2, action_repeat=4, eval_every_frames=200_000, eval_seed=62_000)
    per_eval = 200_000 // 4   # agent steps of both workers between evaluations
    seeds = [resume_seed(args, k * per_eval) for k in range(1, 200)]
    assert seeds[:2] == [22, 24] and len(set(seeds)) == len(seeds)   # each interval its own tracks
    # workers 62000, 62001 would start on validation tracks (62000..62007): moved past them
    near_validation = resume_seed(ExpertTrainArgs(seed=61_998, n_envs=2, eval_seed=62_000, eval_episodes=8), 12_500)
    assert near_validation == 62_008
    inside = resume_seed(ExpertTrainArgs(seed=62_003, n_envs=2, eval_seed=62_000, eval_episodes=8), 12_500)
    assert inside == 62_008                                          # would have been 62005, 62006
    assert resume_seed(ExpertTrainArgs(seed=61_996, n_envs=2, eval_seed=62_000), 12_500) == 61_998
    with pytest.raises(ValueError, match="training seed range"):
        resume_seed(ExpertTrainArgs(seed=99_999, n_envs=2), 12_500)


def test_a_run_starts_only_from_an_expert_with_its_kind_of_actions(tmp_path):
    import torch

    from nac_drive.agents.ppo_lab.training import train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs

    tiny = dict(out=str(tmp_path), n_envs=1, n_steps=8, batch_size=8, n_epochs=1, total_frames=32,
                eval_every_frames=10**9, progress_bar=False, continuous=True)
    fresh = load_expert_zip(train_expert(ExpertTrainArgs(run_name="c", log_std_init=-1.5, **tiny)))
    assert fresh.continuous and torch.allclose(fresh.policy.log_std, torch.full((3,), -1.5), atol=0.01)
    with pytest.raises(ValueError, match="init_from: .* has discrete actions; a continuous run"):
        train_expert(ExpertTrainArgs(run_name="from-discrete", init_from=str(shipped_expert_path()), **tiny))
    assert not (tmp_path / "from-discrete" / "final_model.zip").exists()


def test_cli_dagger_refuses_a_bad_disturb_rate_before_driving(tmp_path, capsys):
    from nac_drive.policy.loading import shipped_policy_path
    from nac_drive.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["dagger", "--policy", str(shipped_policy_path()), "--data", str(tmp_path / "demos"),
              "--out", str(tmp_path / "train"), "--disturb-rate", "1.5", "--no-progress"])
    assert refused.value.code == 2 and "--disturb-rate: must be <= 1, got 1.5" in capsys.readouterr().err
    assert not (tmp_path / "demos").exists() and not (tmp_path / "train").exists()   # nothing written
