"""Kickstarting a PPO expert from the teacher (agents/ppo_lab/kickstart.py) and DAgger with a
PPO expert as the oracle (nac_drive/pipeline/dagger.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nac_drive.agents.ppo_lab.kickstart import (
    KickstartArgs, agreement, drive_and_label, fit_value_head, kickstart, new_model, track_seed, value_targets)
from nac_drive.agents.ppo_lab.expert_zip import load_expert_zip
from nac_drive.agents.ppo_expert import PPOExpert, shipped_expert_path
from nac_drive.simulators.carracing import COLLECT_SEED_BASE, GAS, NOOP


def test_value_targets_are_returns_to_go_scaled_as_vecnormalize_scales_rewards():
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    rng = np.random.default_rng(0)
    rewards, ends, gamma = rng.normal(size=30), [12, 30], 0.9
    targets = value_targets(rewards, ends, gamma)
    # SB3's VecNormalize: ret = ret * gamma + r (reset at each episode end), ret_rms tracks ret
    rms, running = RunningMeanStd(shape=()), 0.0
    for t, r in enumerate(rewards):
        running = running * gamma + r
        rms.update(np.array([running]))
        if t + 1 in ends:
            running = 0.0
    scale = np.sqrt(rms.var + 1e-8)
    second_episode = [sum(gamma ** k * r for k, r in enumerate(rewards[t:30])) for t in range(12, 30)]
    np.testing.assert_allclose(targets[12:] * scale, second_episode, rtol=1e-3)
    assert targets[11] * scale == pytest.approx(rewards[11], rel=1e-3)   # the first episode's last step


def test_value_warm_up_fits_the_value_head_and_nothing_else():
    model = new_model(KickstartArgs(head_units=32))
    policy = model.policy
    before = {name: t.clone() for name, t in policy.state_dict().items()}
    rng = np.random.default_rng(0)
    stacks = rng.integers(0, 256, (64, 2, 64, 64), dtype=np.uint8)
    targets = stacks[:, -1, :32, :32].mean(axis=(1, 2)).astype(np.float32) / 64.0 - 2.0   # a function of the frame
    with torch.no_grad():
        start = float(((policy.predict_values(torch.as_tensor(stacks))[:, 0] - torch.as_tensor(targets)) ** 2).mean())
    mse = fit_value_head(policy, stacks, targets, epochs=200, batch_size=64, learning_rate=1e-3, rng=rng)
    assert mse < start / 4
    changed = {name for name, t in policy.state_dict().items() if not torch.equal(t, before[name])}
    assert changed and all(name.startswith(("mlp_extractor.value_net", "value_net")) for name in changed)


def test_labelling_driver_records_what_the_student_saw_and_the_teachers_labels(tmp_path):
    from nac_drive.agents.teacher import PurePursuitTeacher
    from nac_drive.simulators.carracing import make_carracing, run_episodes

    args = KickstartArgs(action_repeat=2, head_units=32, eval_episodes=0)
    model = new_model(args)
    model.save(tmp_path / "start.zip")
    # beta 1: the teacher drives; every 2nd frame is a decision, labelled by the teacher
    data, driven = drive_and_label(tmp_path / "start.zip", [track_seed(0, 0)], beta=1.0,
                                   rng=np.random.default_rng(0), max_frames=40)
    assert len(data) == 20 and data.episode_ends == [20] and data.stacks.shape == (20, 2, 64, 64)
    assert data.rewards.sum() == pytest.approx(driven.returns[0])
    # the same frames seen by the expert adapter and labelled by a teacher driving alone
    expert, teacher = PPOExpert(tmp_path / "start.zip"), PurePursuitTeacher(continuous=False)
    stacks, labels = [], []

    class Alone:
        def reset(self):
            expert.reset()

        def reset_env(self, env):
            self.env = env
            teacher.reset_env(env)

        def act(self, obs):
            if len(labels) * 2 == self.frames:
                stacks.append(expert.observe(obs).copy())
                labels.append(teacher.action_for(self.env))
            self.frames += 1
            return labels[-1]

    alone = Alone()
    alone.frames = 0
    run_episodes(alone, [track_seed(0, 0)], max_steps=40, env=make_carracing())
    np.testing.assert_array_equal(data.stacks, np.stack(stacks))
    assert data.labels.tolist() == labels and GAS in labels


def test_a_kickstart_with_a_stronger_gas_drives_and_records_that_env(tmp_path):
    from nac_drive.agents.teacher import PurePursuitTeacher
    from nac_drive.simulators.carracing import run_episodes

    new_model(KickstartArgs(gas=0.4, head_units=32, eval_episodes=0)).save(tmp_path / "start.zip")
    assert PPOExpert(tmp_path / "start.zip").gas == 0.4   # the zip records the gas
    data, driven = drive_and_label(tmp_path / "start.zip", [track_seed(0, 0)], beta=1.0,
                                   rng=np.random.default_rng(0), max_frames=120)
    teacher = PurePursuitTeacher(continuous=False)   # labels alone: what it drives depends on the gas
    returns = {gas: run_episodes(teacher, [track_seed(0, 0)], max_steps=120, gas=gas).returns[0]
               for gas in (0.2, 0.4)}
    assert driven.returns[0] == pytest.approx(returns[0.4]) and returns[0.4] != pytest.approx(returns[0.2])
    assert data.rewards.sum() == pytest.approx(driven.returns[0])


@pytest.mark.slow
def test_a_small_kickstart_agrees_with_the_teacher_more_than_an_untrained_policy(tmp_path):
    args = KickstartArgs(out=str(tmp_path), run_name="kick", rounds=2, episodes=1, max_frames=250, updates=150,
                         head_units=64, eval_episodes=0, value_episodes=1, progress_bar=False)
    result = kickstart(args)
    run = tmp_path / "kick"
    assert result == run / "kickstart.zip"
    history = json.loads((run / "history.json").read_text())
    assert [h["beta"] for h in history] == [1.0, 0.5] and history[-1]["decisions"] == 500
    # the teacher drives a track none of the run used; both policies are asked what to do
    data, _ = drive_and_label(run / "round_start.zip", [track_seed(1, 0)], beta=1.0,
                              rng=np.random.default_rng(1), max_frames=250)
    untrained = agreement(load_expert_zip(run / "round_start.zip").policy, data.stacks, data.labels)
    kicked = agreement(load_expert_zip(result).policy, data.stacks, data.labels)
    assert kicked[0] > untrained[0] and kicked[1] > untrained[1] + 0.2, (kicked, untrained)
    # the zip is an expert zip acting every frame; its value head was warmed up
    loaded = load_expert_zip(result)
    assert loaded.action_repeat == 1 and not loaded.continuous
    best = load_expert_zip(run / "round_1.zip").policy.state_dict()
    changed = {n for n, t in loaded.policy.state_dict().items() if not torch.equal(t, best[n])}
    assert changed and all(n.startswith(("mlp_extractor.value_net", "value_net")) for n in changed)
    # a second run never writes into the first one's folder
    assert kickstart(args) == tmp_path / "kick-2" / "kickstart.zip"


@pytest.mark.slow
def test_ppo_training_continues_from_a_kickstart_zip(tmp_path):
    from nac_drive.agents.ppo_lab.training import train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs

    start = tmp_path / "start.zip"
    new_model(KickstartArgs(eval_episodes=0)).save(start)
    final = train_expert(ExpertTrainArgs(out=str(tmp_path), run_name="ppo", init_from=str(start), action_repeat=1,
                            learning_rate=0.0, n_envs=1, n_steps=8, batch_size=8, n_epochs=1, total_frames=16,
                            eval_every_frames=10**9, progress_bar=False))
    continued, started = load_expert_zip(final).policy.state_dict(), load_expert_zip(start).policy.state_dict()
    assert all(torch.equal(continued[n], t) for n, t in started.items())   # learning rate 0: the same weights


def test_kickstart_cli_refuses_bad_values_in_one_line(tmp_path, capsys):
    from nac_drive.cli import main

    def exit_code(argv) -> int:
        try:
            return main(argv)
        except SystemExit as stop:   # argparse refuses a flag's value itself
            return stop.code

    for flags, message in ((["--beta0", "1.5"], "--beta0: must be <= 1, got 1.5"),
                           (["--action-repeat", "0"], "--action-repeat: must be >= 1, got 0"),
                           (["--eval-seed", str(track_seed(0, 0))], "--eval-seed: validation tracks"),
                           (["--rounds", "300"], "at most 1000 tracks per seed")):
        assert exit_code(["expert", "kickstart", "--out", str(tmp_path / "runs"), *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "error" in err[-1] and message in err[-1], (flags, err)
    assert not (tmp_path / "runs").exists()   # nothing written


# --- DAgger with a PPO expert as the oracle ------------------------------------------------

def test_ppo_oracle_labels_are_the_ppo_experts_actions_on_the_students_frames():
    from nac_drive.pipeline.dagger import make_oracle, student_env

    gas = PPOExpert().gas   # the student drives the env the expert was trained in
    oracle = make_oracle("ppo", continuous=False, gas=gas)
    assert isinstance(oracle, PPOExpert) and oracle.path == shipped_expert_path()
    env = student_env(oracle, continuous=False, gas=gas, seed=0)
    reference = PPOExpert()   # the same expert, fed the frames the student sees
    try:
        obs, _ = env.reset(seed=COLLECT_SEED_BASE + 7)
        reference.reset()
        expected = []
        for _ in range(30):
            expected.append(reference.act(obs))
            obs = env.step(NOOP)[0]           # the student only coasts
        (episode,) = env.take_episodes()
    finally:
        env.close()
    assert episode["actions"].tolist() == expected
    assert set(expected) != {NOOP}            # labels are the expert's, not what the car did


def test_dagger_oracle_choices_and_refusals(tmp_path, capsys):
    from nac_drive.policy.loading import shipped_policy_path
    from nac_drive.agents.teacher import PurePursuitTeacher
    from nac_drive.cli import main
    from nac_drive.pipeline.dagger import make_oracle

    assert isinstance(make_oracle("teacher", continuous=True), PurePursuitTeacher)
    assert make_oracle(str(shipped_expert_path()), continuous=False, gas=PPOExpert().gas).path == shipped_expert_path()
    with pytest.raises(ValueError, match="discrete actions, the student continuous"):
        make_oracle("ppo", continuous=True)
    assert main(["dagger", "--policy", str(shipped_policy_path()), "--data", str(tmp_path / "demos"),
                 "--out", str(tmp_path / "train"), "--oracle", str(tmp_path / "nope.zip"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("nac-drive dagger: error:") and "nope.zip" in err[-1]
    assert not (tmp_path / "demos").exists() and not (tmp_path / "train").exists()   # nothing written
