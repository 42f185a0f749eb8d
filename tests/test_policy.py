"""DrivingPolicy: every core streams what it was trained on; checkpoints; SB3 protocol."""

import json
import re

import numpy as np
import pytest
import torch

from nac_drive.io.checkpoint import CheckpointError
from nac_drive.policy.cores import CORES, CoreConfig
from nac_drive.policy.encoders import ENCODERS
from nac_drive.policy.driving_policy import DrivingPolicy, PolicyConfig

torch.set_num_threads(1)


def policy_for(core="nac", window=6, **kw):
    return DrivingPolicy(PolicyConfig(core=CoreConfig(core=core, window=window, d_model=16, num_heads=2,
                                                      topk=3), **kw)).eval()


def frames(T=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (1, T, 3, 96, 96), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("core", CORES)
def test_closed_loop_stream_matches_the_windowed_forward(core):
    window, T = 6, 9
    policy = policy_for(core, window)
    x = frames(T)
    t = torch.arange(T, dtype=torch.float32)[None] * policy.config.frame_dt
    policy.reset()
    streamed = torch.stack([policy.step_output(x[0, i].permute(1, 2, 0).numpy()) for i in range(T)])
    with torch.no_grad():
        for i in range(T):
            lo = max(0, i - window + 1)   # step i sees the last `window` frames, like a training window
            expected = policy(x[:, lo:i + 1], t[:, lo:i + 1] - t[0, lo])[0, -1]
            torch.testing.assert_close(streamed[i], expected, atol=2e-5, rtol=1e-4)


def test_reset_forgets_the_window():
    policy = policy_for()
    x = frames(4)
    obs = [x[0, i].permute(1, 2, 0).numpy() for i in range(4)]
    first = policy.step_output(obs[0]).clone()
    policy.step_output(obs[1])
    assert not torch.allclose(policy.step_output(obs[0]), first)  # context changed the answer
    policy.reset()
    torch.testing.assert_close(policy.step_output(obs[0]), first)


def test_select_action_gives_env_actions():
    discrete = policy_for()
    obs = frames(1)[0, 0].permute(1, 2, 0).numpy()
    action = discrete.select_action(obs)
    assert isinstance(action, int) and 0 <= action < 5
    continuous = policy_for(action="continuous", num_outputs=3)
    a = continuous.select_action(obs)
    assert a.shape == (3,) and -1 <= a[0] <= 1 and 0 <= a[1] <= 1 and 0 <= a[2] <= 1
    with pytest.raises(ValueError, match="obs"):
        discrete.select_action(np.zeros((64, 64, 3), np.uint8))


CONTINUOUS = {"action": "continuous", "num_outputs": 3}


@pytest.mark.parametrize("continuous", [False, True])
def test_sb3_evaluate_policy_scores_the_policy(continuous):
    gym = pytest.importorskip("gymnasium")
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import DummyVecEnv

    policy = policy_for(**(CONTINUOUS if continuous else {}))
    make = lambda: gym.make("CarRacing-v3", continuous=continuous, max_episode_steps=25)  # noqa: E731
    venv = DummyVecEnv([make])
    venv.seed(900_000)
    returns, lengths = evaluate_policy(policy, venv, n_eval_episodes=1, return_episode_rewards=True)
    # the same episode driven by hand through select_action
    env = make()
    obs, _ = env.reset(seed=900_000)
    policy.reset()
    total, done, n = 0.0, False, 0
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy.select_action(obs))
        total, done, n = total + reward, terminated or truncated, n + 1
    assert lengths == [n] == [25]
    assert returns[0] == pytest.approx(total, abs=1e-4)
    # predict keeps one stream per env and restarts it on episode_start
    obs = np.stack([frames(1, s)[0, 0].permute(1, 2, 0).numpy() for s in (1, 2)])
    a1, state = policy.predict(obs, episode_start=np.array([True, True]))
    a2, state2 = policy.predict(obs, state=state, episode_start=np.array([False, True]))
    assert a1.shape == ((2, 3) if continuous else (2,)) and state2[0][1] == 2 and state2[1][1] == 1


@pytest.mark.parametrize("continuous", [False, True])
def test_policy_spaces_are_the_envs_and_a_mismatch_is_named(continuous):
    gym = pytest.importorskip("gymnasium")
    from stable_baselines3.common.utils import check_for_correct_spaces

    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.simulators.carracing import run_episodes

    policy = policy_for(**(CONTINUOUS if continuous else {}))
    env, other = (gym.make("CarRacing-v3", continuous=c) for c in (continuous, not continuous))
    check_for_correct_spaces(env, policy.observation_space, policy.action_space)   # SB3's own check
    policy.check_env(env)
    obs, _ = env.reset(seed=3)
    assert policy.observation_space.contains(obs)
    assert policy.action_space.contains(policy.predict(obs)[0])
    with pytest.raises(ValueError, match="Action spaces do not match"):
        check_for_correct_spaces(other, policy.observation_space, policy.action_space)
    message = (rf"env and policy disagree on the action space: the env's is {re.escape(str(other.action_space))}, "
               rf"this {policy.config.action} carracing policy's is .*continuous={continuous}")
    with pytest.raises(ValueError, match=message):
        policy.check_env(other)
    # the project's runner stops on the same line before a wrong-kind action reaches env.step
    # (a discrete action in a continuous CarRacing used to end in a bare IndexError)
    with pytest.raises(ValueError, match=message):
        run_episodes(PolicyDriver(policy), [3], env=other, max_steps=2)


def test_drivers_sharing_a_policy_each_drive_it_traced_or_not(tmp_path):
    """A traced driver records NAC traces even when a plain driver of the same policy was made
    after it, and the plain one's drives stay untraced (each sets the policy up per episode)."""
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.interpret.trace import RunRecorder, load_trace
    from nac_drive.simulators.carracing import run_episodes

    policy = policy_for()
    recorder = RunRecorder(tmp_path)
    traced = PolicyDriver(policy, recorder=recorder)
    plain = PolicyDriver(policy)                                 # made second: it used to switch traces off
    run_episodes(traced, [3], max_steps=4, on_step=traced.on_step)
    assert policy.last_trace is not None
    policy.last_trace = None
    run_episodes(plain, [3], max_steps=4)
    assert policy.last_trace is None                             # the plain drive computed no trace
    recorder.save()
    assert load_trace(tmp_path).has_nac.tolist() == [True] * 4


def test_a_policy_of_a_stronger_gas_names_its_env_and_refuses_another(tmp_path):
    """A policy learned in an env whose GAS presses 0.4 keeps that in config.json and its
    card, and refuses gymnasium's discrete env (same spaces, other meaning of GAS)."""
    from huggingface_hub import ModelCard

    from nac_drive.simulators.carracing import make_carracing

    policy = policy_for(gas=0.4)
    policy.check_env(make_carracing(gas=0.4))
    with pytest.raises(ValueError, match=r"the env's GAS presses 0.2, this policy learned 0.4 \(make_carracing"):
        policy.check_env(make_carracing())
    with pytest.raises(ValueError, match="the env's GAS presses 0.4, this policy learned 0.2"):
        policy_for().check_env(make_carracing(gas=0.4))
    folder = policy.save_pretrained(tmp_path / "gas")
    assert json.loads((folder / "config.json").read_text())["gas"] == 0.4
    assert DrivingPolicy.from_pretrained(folder).config.gas == 0.4
    assert "its GAS action pressing 0.4" in ModelCard.load(folder / "README.md").text
    assert "GAS" not in ModelCard.load(policy_for().save_pretrained(tmp_path / "stock") / "README.md").text
    odd = policy_for(gas=0.123456789)   # the card names the exact env, which check_env accepts
    card = ModelCard.load(odd.save_pretrained(tmp_path / "odd", model_card_kwargs={"held_out_score": 1.0})
                          / "README.md")
    assert "make_carracing(gas=0.123456789)" in card.text
    assert card.data.eval_results[0].dataset_config == "gas-0.123456789"
    odd.check_env(make_carracing(gas=0.123456789))
    for bad in ({"gas": 0.0}, {"gas": float("nan")}, {"gas": True}, {"gas": 0.4, **CONTINUOUS}):
        with pytest.raises(ValueError, match="gas"):
            policy_for(**bad)
    config = json.loads((folder / "config.json").read_text())
    for bad in (float("nan"), -0.5, "0.4", None):
        (folder / "config.json").write_text(json.dumps({**config, "gas": bad}))
        with pytest.raises(CheckpointError, match="config.json.*gas"):
            DrivingPolicy.from_pretrained(folder)


def test_udacity_policy_spaces():
    policy = DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1)).eval()
    assert policy.observation_space.shape == (160, 320, 3) and policy.action_space.shape == (1,)
    frames_ = np.random.default_rng(0).integers(0, 256, (2, 160, 320, 3), dtype=np.uint8)
    actions, _ = policy.predict(frames_)
    assert actions.shape == (2, 1) and all(policy.action_space.contains(a) for a in actions)
    carracing = policy_for()
    with pytest.raises(ValueError, match=r"observation space: the env's is Box\(0, 255, \(96, 96, 3\), uint8\), "
                                         r"this continuous udacity policy's is Box\(0, 255, \(160, 320, 3\)"):
        policy.check_env(carracing)   # anything with the two spaces: here a CarRacing policy


@pytest.mark.parametrize("frame", [
    np.full((96, 96, 3), 200.0, np.float32),      # 0-255 floats: once taken for [0, 1] and clipped white
    np.full((96, 96, 3), 0.8, np.float32),        # [0, 1] floats
    np.zeros((96, 96, 3), np.float64), np.zeros((96, 96, 3), np.int64), np.zeros((96, 96, 3), bool),
    torch.zeros(96, 96, 3)])
def test_a_frame_that_is_not_uint8_is_refused_in_one_line(frame):
    policy = policy_for()
    with pytest.raises(ValueError, match=r"^obs: expected a uint8 RGB image .*, got (float|int|bool)") as e:
        policy.select_action(frame)
    assert "\n" not in str(e.value) and policy._frames_seen == 0


def test_a_batch_dict_or_a_bad_timestamp_is_refused_in_one_line():
    image = np.zeros((160, 320, 3), np.uint8)
    policy = DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1,
                                        core=CoreConfig(window=4)))
    with pytest.raises(ValueError, match=r"^obs: expected a frame, or a dict with 'image'.*'observation.image'"):
        policy.select_action({"observation.image": image, "observation.state": np.zeros(2)})   # a LeRobot batch
    for bad in (float("nan"), float("inf"), "12:00", [1, 2]):
        with pytest.raises(ValueError, match=r"^obs\['timestamp'\]: expected"):
            policy.select_action({"image": image, "timestamp": bad})
    assert policy._frames_seen == 0
    assert -1 <= policy.select_action({"image": image, "timestamp": 12.5}) <= 1


def test_checkpoint_round_trip_and_errors(tmp_path):
    policy = policy_for(core="nac")
    path = policy.save_pretrained(tmp_path / "ckpt")
    assert sorted(p.name for p in path.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    loaded = DrivingPolicy.from_pretrained(path)
    x = frames(5)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), policy(x))

    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "surprise": 1}))
    with pytest.raises(CheckpointError, match="surprise"):
        DrivingPolicy.from_pretrained(path)
    (path / "config.json").write_text(json.dumps({**config, "core": {**config["core"], "d_model": 32}}))
    with pytest.raises(CheckpointError, match="model.safetensors.*shape"):
        DrivingPolicy.from_pretrained(path)
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        DrivingPolicy.from_pretrained(path)
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        DrivingPolicy.from_pretrained(tmp_path / "missing")


@pytest.mark.parametrize("change,message", [
    ({"frame_dt": 1e308}, r"config.frame_dt: 1e\+308 is out of range \(0, 1\] s"),   # once drove on NaN timestamps
    ({"core": None}, r"config.core: expected a JSON object, got None"),              # these three: exit 1, a bug
    ({"core": []}, r"config.core: expected a JSON object, got \[\]"),
    ({"core": "nac"}, r"config.core: expected a JSON object, got 'nac'")])
def test_a_config_value_of_the_wrong_kind_or_range_is_refused(tmp_path, change, message):
    path = policy_for().save_pretrained(tmp_path / "ckpt")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message):
        DrivingPolicy.from_pretrained(path)


def test_checkpoint_with_nan_weights_is_refused(tmp_path):
    policy = policy_for(core="gru")
    with torch.no_grad():
        policy.head[1].weight[0, 0] = float("nan")
    path = policy.save_pretrained(tmp_path / "nan")
    with pytest.raises(CheckpointError, match="head.1.weight.*NaN"):
        DrivingPolicy.from_pretrained(path)


def test_frame_model_answers_like_the_next_step():
    policy = policy_for()
    x = frames(4)
    for i in range(3):
        policy.step_output(x[0, i].permute(1, 2, 0).numpy())
    model = policy.frame_model()
    with torch.no_grad():
        out = model(x[:, 3].float() / 255).clone()
        # a batch of the same frame gives the same answer for each item
        twice = model(torch.cat([x[:, 3], x[:, 3]]).float() / 255)
    expected = policy.step_output(x[0, 3].permute(1, 2, 0).numpy())
    torch.testing.assert_close(out[0], expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(twice[1], expected, atol=1e-5, rtol=1e-4)


def test_frame_model_at_an_irregular_time_answers_like_the_next_step_at_that_time():
    """Frames dropped (or a simulator's own clock): the frame model must be asked at the next
    frame's real time, which the observation carries, not one frame period later."""
    policy = policy_for()
    x = frames(4)
    times = [100.0, 100.02, 100.08, 104.0]   # absolute, irregular: the last after a long gap
    for i in range(3):
        policy.step_output({"image": x[0, i].permute(1, 2, 0).numpy(), "timestamp": times[i]})
    with torch.no_grad():
        at_time = policy.frame_model(times[3])(x[:, 3].float() / 255)[0].clone()
        one_period_on = policy.frame_model()(x[:, 3].float() / 255)[0].clone()   # 100.06: regular frames
    expected = policy.step_output({"image": x[0, 3].permute(1, 2, 0).numpy(), "timestamp": times[3]})
    torch.testing.assert_close(at_time, expected, atol=1e-5, rtol=1e-4)
    assert (one_period_on - expected).abs().max() > 1e-4   # the time reaches the output


def test_a_core_shift_reaches_the_head_alone_while_streaming_and_in_the_forward():
    """core_shifted moves what the head reads by the shift, in step_output and forward alike; the
    core's streaming state is untouched, and the policy is intact after the block."""
    policy = policy_for()
    x = frames(5)
    obs = [x[0, i].permute(1, 2, 0).numpy() for i in range(5)]
    shift = torch.linspace(-1, 1, policy.core.out_dim)
    intact = torch.stack([policy.step_output(o) for o in obs])
    policy.reset()
    with policy.core_shifted(shift.numpy()):
        shifted = torch.stack([policy.step_output(o) for o in obs])
        with torch.no_grad():
            forward = policy(x)[0]
    with torch.no_grad():
        moved = policy.head[-1].weight @ shift                     # the head is linear: a constant move
        plain = policy(x)[0]
    torch.testing.assert_close(shifted, intact + moved, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(forward, plain + moved, atol=1e-5, rtol=1e-4)
    assert moved.abs().max() > 0.01
    policy.reset()
    torch.testing.assert_close(torch.stack([policy.step_output(o) for o in obs]), intact)
    with pytest.raises(ValueError, match=f"shift: expected {policy.core.out_dim} finite numbers"):
        with policy.core_shifted(np.zeros(3)):
            pass


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_encoders_convolve_channels_last_whatever_the_input_layout(encoder):
    """NCHW and HWC-permuted frames give the same features, both through channels-last convs
    (the fast layout on CPU: BENCHMARKS.md section 2)."""
    torch.manual_seed(0)
    model = ENCODERS[encoder]()
    layouts = []
    model.convs[0].register_forward_pre_hook(
        lambda _, args: layouts.append(args[0].is_contiguous(memory_format=torch.channels_last)))
    c, h, w = model.frame_shape
    hwc = torch.randint(0, 256, (4, h, w, c), dtype=torch.uint8)
    from_hwc = model(hwc.permute(0, 3, 1, 2))
    from_nchw = model(hwc.permute(0, 3, 1, 2).contiguous())
    torch.testing.assert_close(from_nchw, from_hwc)
    torch.testing.assert_close(model(hwc.permute(0, 3, 1, 2).float() / 255), from_hwc)
    assert layouts == [True, True, True]


def test_a_training_run_folder_given_as_the_policy_means_its_best_checkpoint(tmp_path, capsys):
    from nac_drive.policy.loading import load_driving_policy

    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(core="gru", d_model=8), feature_dim=8)).eval()
    policy.save_pretrained(tmp_path / "run" / "best")
    loaded = load_driving_policy(tmp_path / "run")
    assert loaded.config == policy.config
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), policy.state_dict().values()))
    assert f"using its best/ checkpoint ({tmp_path / 'run' / 'best'})" in capsys.readouterr().err
    with pytest.raises(ValueError, match="config.json"):   # a folder that is neither still fails in one line
        load_driving_policy(tmp_path)


def test_a_policy_drives_under_bfloat16_autocast_and_moved_to_bfloat16():
    # once: autocast failed at output.numpy() (no bfloat16 in numpy), and .to(bfloat16) on the
    # encoder's float32 cast of the frame
    from nac_drive.policy.loading import shipped_policy_path

    policy = DrivingPolicy.from_pretrained(shipped_policy_path("carracing"))
    frames = np.random.default_rng(0).integers(0, 256, (20, 96, 96, 3), dtype=np.uint8)
    reference = [policy.select_action(f) for f in frames]
    policy.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = [policy.select_action(f) for f in frames]
    policy.reset()
    policy.to(torch.bfloat16)
    moved = [policy.select_action(f) for f in frames]
    assert policy.last_output.dtype == torch.bfloat16
    for actions in (autocast, moved):   # bfloat16 keeps 8 bits of mantissa: nearly every choice is the same
        assert all(policy.action_space.contains(a) for a in actions)
        assert sum(a == r for a, r in zip(actions, reference)) >= 18
    udacity = DrivingPolicy(PolicyConfig(task="udacity", encoder="pilotnet", action="continuous", num_outputs=1,
                                         core=CoreConfig(window=4))).to(torch.bfloat16)
    assert -1 <= udacity.select_action({"image": np.zeros((160, 320, 3), np.uint8), "timestamp": 0.0}) <= 1


@pytest.mark.parametrize("core", ["cfc", "ltc"])
def test_cfc_and_ltc_read_the_timestamps_per_sample(core):
    """CfC and LTC step their ODE by each frame's elapsed time (in frame periods), batched:
    regular frames are the unit steps they take without timestamps, a late frame is a longer
    step, and each sample of a batch keeps its own clock (ncps' loop fails for batch > 1)."""
    from nac_drive.policy.cores import build_core, elapsed_periods

    torch.manual_seed(0)
    dt = 0.05
    net = build_core(8, CoreConfig(core=core, window=6, d_model=16), frame_dt=dt).eval()
    x = torch.randn(2, 6, 8)
    regular = torch.arange(6.0)[None].repeat(2, 1) * dt
    late = regular.clone()
    late[1, 3:] += 4 * dt                               # sample 1: frame 3 arrives 4 periods late
    with torch.no_grad():
        untimed, timed, skewed = net(x), net(x, regular), net(x, late)
        alone = net(x[1:], late[1:])
    torch.testing.assert_close(timed, untimed, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(skewed[0], timed[0])     # sample 0's clock is unchanged
    torch.testing.assert_close(skewed[1:], alone)       # batched = alone
    torch.testing.assert_close(skewed[1, :3], timed[1, :3])   # before the late frame: the same
    assert (skewed[1, 3:] - timed[1, 3:]).abs().max() > 1e-3  # from it on: a longer step
    assert elapsed_periods(late, dt)[1].tolist() == pytest.approx([1, 1, 1, 5, 1, 1])
    # a repeated timestamp is a short step, never a zero one LTC would divide by
    assert elapsed_periods(torch.zeros(1, 3), dt).min() > 0


@pytest.mark.parametrize("core", ["cfc", "ltc"])
def test_a_cfc_or_ltc_policy_streams_irregular_frames_as_its_window_forward(core):
    window, T = 4, 7
    policy = policy_for(core, window)
    x = frames(T)
    t = torch.tensor([[0.0, 0.02, 0.07, 0.09, 0.2, 0.22, 0.25]])
    policy.reset()
    for i in range(T):
        streamed = policy.step_output({"image": x[0, i].permute(1, 2, 0).numpy(), "timestamp": float(t[0, i])})
        lo = max(0, i - window + 1)
        with torch.no_grad():
            expected = policy(x[:, lo:i + 1], t[:, lo:i + 1] - t[0, lo])[0, -1]
        torch.testing.assert_close(streamed, expected, atol=2e-5, rtol=1e-4)
