"""Kickstarted PPO: teacher labels recorded beside the rollout's states, and the fit to them."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.vec_env import DummyVecEnv

from nac_drive.agents.ppo_lab.kickstarted_ppo import KickstartedPPO, TeacherLabels


class Counter(gym.Env):
    """Observations ``uint8 [1, 64, 64]`` all equal to ``offset + t`` (t: step of the
    episode, which ends after ``length`` steps), or, with ``rng``, to a random 20 or 230."""

    observation_space = gym.spaces.Box(0, 255, (1, 64, 64), np.uint8)
    action_space = gym.spaces.Discrete(5)

    def __init__(self, offset: int = 0, length: int = 10, rng: np.random.Generator | None = None):
        self.offset, self.length, self.rng = offset, length, rng
        self.t, self.value = 0, 0

    def _obs(self):
        self.value = int(self.rng.choice([20, 230])) if self.rng is not None else self.offset + self.t
        return np.full((1, 64, 64), self.value, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, self.t >= self.length, False, {}


class ValueTeacher:
    """Labels a Counter state by what its observation shows: ``value % 5``, or, for the
    random observations, GAS (3) when bright and LEFT (2) when dark."""

    def __init__(self, by_brightness: bool = False):
        self.by_brightness = by_brightness

    def reset(self):
        pass

    def action_for(self, env):
        value = env.unwrapped.value
        return (3 if value > 128 else 2) if self.by_brightness else value % 5


def _ppo(envs, **kwargs) -> KickstartedPPO:
    venv = DummyVecEnv([lambda env=env: TeacherLabels(env, teacher=ValueTeacher(env.rng is not None))
                        for env in envs])
    return KickstartedPPO("CnnPolicy", venv, seed=0, device="cpu", **kwargs)


def test_each_label_is_the_teachers_for_the_state_the_action_was_chosen_in(monkeypatch):
    # two workers whose observations differ (offset 101: another label for the same step),
    # episodes ending inside the rollout: a label one step late, or of the other worker, fails
    model = _ppo([Counter(0, 7), Counter(101, 5)], n_steps=16, batch_size=8, n_epochs=1, learning_rate=0.0)
    seen = []
    monkeypatch.setattr(KickstartedPPO, "fit_teacher", lambda self: seen.append(
        (self.rollout_buffer.observations[:, 0, 0, 0].copy(), self.label_recorder.labels.swapaxes(0, 1).reshape(-1))))
    model.learn(64)   # two rollouts of 16 steps x 2 workers
    assert len(seen) == 2
    for values, labels in seen:
        assert len(values) == 32 and set(values) & set(range(101, 106)) and 0 in values
        assert np.array_equal(labels, values.astype(np.int64) % 5)


def test_the_teacher_fit_moves_the_most_likely_action_to_the_labels():
    torch.manual_seed(0)
    probe = torch.as_tensor(np.stack([np.full((1, 64, 64), v, np.uint8) for v in (20, 230)]))
    wanted = torch.tensor([2, 3])

    def agreement(model) -> float:
        with torch.no_grad():
            logits = model.policy.get_distribution(probe).distribution.logits
        return float((logits.argmax(1) == wanted).float().mean())

    # PPO's own step is 0: whatever the policy learns comes from the teacher fit
    kwargs = dict(n_steps=64, batch_size=32, n_epochs=1, learning_rate=0.0, teacher_fit_epochs=8)
    model = _ppo([Counter(rng=np.random.default_rng(0))], teacher_fit_lr=3e-3, **kwargs)
    frozen = _ppo([Counter(rng=np.random.default_rng(0))], teacher_fit_lr=0.0, **kwargs)
    before = {k: v.clone() for k, v in frozen.policy.state_dict().items()}
    model.learn(512)
    frozen.learn(64)
    assert agreement(model) == 1.0
    assert model.logger.name_to_value["teacher/agreement"] > 0.9
    assert all(torch.equal(before[k], v) for k, v in frozen.policy.state_dict().items())


def test_kickstarted_ppo_refuses_what_the_teacher_cannot_label():
    class Steering(Counter):
        action_space = gym.spaces.Box(-1, 1, (3,), np.float32)

    with pytest.raises(ValueError, match="discrete"):
        _ppo([Steering()], n_steps=8, batch_size=8)
    plain = DummyVecEnv([Counter])   # no TeacherLabels around it
    with pytest.raises(RuntimeError, match="TeacherLabels"):
        KickstartedPPO("CnnPolicy", plain, n_steps=8, batch_size=8, device="cpu").learn(8)


def test_expert_training_with_a_teacher_fit_writes_a_plain_ppo_zip(tmp_path):
    from stable_baselines3 import PPO

    from nac_drive.agents.ppo_lab.training import train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs
    from nac_drive.agents.ppo_lab.expert_zip import load_expert_zip, read_data
    from nac_drive.agents.ppo_expert import shipped_expert_path

    with pytest.raises(ValueError, match="--teacher-fit-lr"):
        ExpertTrainArgs(teacher_fit_lr=1e-4, continuous=True)
    # PPO's step 0: only the teacher fit on the CarRacing rollout (labelled by the real teacher) moves the weights
    final = train_expert(ExpertTrainArgs(out=str(tmp_path), run_name="kick", init_from=str(shipped_expert_path()),
                                         learning_rate=0.0, teacher_fit_lr=1e-3, n_envs=1, n_steps=8, batch_size=8,
                                         n_epochs=1, total_frames=16, eval_every_frames=10**9, progress_bar=False))
    start = load_expert_zip(shipped_expert_path()).policy.state_dict()
    trained = load_expert_zip(final).policy.state_dict()
    assert not torch.equal(trained["action_net.weight"], start["action_net.weight"])
    assert not {"teacher_optimizer", "label_recorder"} & set(read_data(final))
    assert isinstance(PPO.load(final, device="cpu"), PPO)
