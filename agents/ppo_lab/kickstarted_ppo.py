"""PPO that keeps imitating the teacher while it learns from the reward (kickstarting).

A network taught by DAgger (:mod:`~nac_drive.agents.ppo_lab.kickstart`) and then trained by
plain PPO learns to spread probability over actions: its sampled policy improves while the
most likely action, the one every command drives and ships, gets worse (BENCHMARKS.md §3,
docs/findings.md). Kickstarting (Schmitt et al. 2018) adds the teacher to the RL
loss. Here the imitation is a phase of its own after each PPO update, as in Phasic Policy
Gradient's auxiliary phase (Cobbe et al. 2021): the rollout's states, which the policy
itself reached, were each labelled by the discrete teacher as the rollout ran
(:class:`TeacherLabels`), and the policy's action logits are fitted to those labels by
cross-entropy, ``teacher_fit_epochs`` passes with an Adam of their own at
``teacher_fit_lr``. PPO's optimizer and loss are SB3's, untouched.

    nac-drive expert train --init-from <kickstart zip> --teacher-fit-lr 1e-4 ...
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback

LABEL_KEY = "teacher_action"


def imitation_step(policy, optimizer, stacks: np.ndarray, labels: np.ndarray,
                   max_grad_norm: float = 0.5) -> tuple[float, float]:
    """One ``optimizer`` step of the policy's action logits towards ``labels`` (``int64 [B]``)
    on ``stacks`` (``uint8 [B, stack, 64, 64]``) by cross-entropy, gradients clipped to
    ``max_grad_norm``. Returns (loss, share of the batch whose label was the most likely action).
    The DAgger kickstart (:func:`~nac_drive.agents.ppo_lab.kickstart.fit_policy`) takes the same step."""
    logits = policy.get_distribution(torch.as_tensor(stacks, device=policy.device)).distribution.logits
    target = torch.as_tensor(labels, device=policy.device)
    loss = torch.nn.functional.cross_entropy(logits, target)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item(), (logits.argmax(1) == target).float().mean().item()


class TeacherLabels(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """``info["teacher_action"]``: the discrete teacher's action for the state the agent
    chose its action in (read before the step; one label per agent decision when this
    wraps :class:`~nac_drive.simulators.carracing.ActionRepeat`)."""

    def __init__(self, env: gym.Env, teacher=None):
        from nac_drive.agents.teacher import PurePursuitTeacher

        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self.teacher = teacher or PurePursuitTeacher(continuous=False)

    def reset(self, **kwargs):
        self.teacher.reset()
        return self.env.reset(**kwargs)

    def step(self, action):
        label = int(self.teacher.action_for(self.env))
        obs, reward, terminated, truncated, info = self.env.step(action)
        info[LABEL_KEY] = label
        return obs, reward, terminated, truncated, info


class RecordTeacherLabels(BaseCallback):
    """Keeps each rollout step's teacher labels where the rollout buffer keeps its states:
    ``labels int64 [n_steps, n_envs]``. SB3 calls it after each env step and before the
    buffer stores the state the action was chosen in, at ``rollout_buffer.pos``."""

    def __init__(self, n_steps: int, n_envs: int):
        super().__init__()
        self.labels = np.zeros((n_steps, n_envs), np.int64)

    def _on_step(self) -> bool:
        infos = self.locals["infos"]
        if any(LABEL_KEY not in info for info in infos):
            raise RuntimeError("KickstartedPPO: the training env gives no teacher labels "
                               "(wrap it in TeacherLabels)")
        self.labels[self.model.rollout_buffer.pos] = [info[LABEL_KEY] for info in infos]
        return True


class KickstartedPPO(PPO):
    """SB3's PPO (discrete actions) followed, after each update, by a cross-entropy fit of
    the policy's logits to the teacher's labels of the rollout's states; see the module
    docstring. Its zips are plain PPO zips (``PPO.load`` reads them)."""

    def __init__(self, *args, teacher_fit_lr: float = 1e-4, teacher_fit_epochs: int = 2, **kwargs):
        self.teacher_fit_lr, self.teacher_fit_epochs = teacher_fit_lr, teacher_fit_epochs
        super().__init__(*args, **kwargs)
        if not isinstance(self.action_space, gym.spaces.Discrete):
            raise ValueError("KickstartedPPO: the teacher labels discrete actions only")
        self.label_recorder = RecordTeacherLabels(self.n_steps, self.n_envs)
        self.teacher_optimizer = torch.optim.Adam(self.policy.parameters(), lr=teacher_fit_lr)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "label_recorder", "teacher_optimizer"]

    def learn(self, total_timesteps: int, callback=None, **kwargs):
        callbacks = callback if isinstance(callback, list) else [callback] if callback else []
        return super().learn(total_timesteps, callback=[self.label_recorder, *callbacks], **kwargs)

    def train(self) -> None:
        super().train()
        self.fit_teacher()

    def fit_teacher(self) -> None:
        """Fit the logits to the labels of the rollout just used (its states are flattened
        env by env after PPO's update: index ``env * n_steps + step``)."""
        observations = self.rollout_buffer.observations
        labels = self.label_recorder.labels.swapaxes(0, 1).reshape(-1)
        if len(observations) != len(labels):
            raise RuntimeError("KickstartedPPO: the rollout buffer was not flattened by the PPO update")
        self.policy.set_training_mode(True)
        losses, agreed = [], []
        for _ in range(self.teacher_fit_epochs):
            for idx in np.array_split(np.random.permutation(len(labels)), max(1, len(labels) // self.batch_size)):
                loss, agreement = imitation_step(self.policy, self.teacher_optimizer, observations[idx], labels[idx],
                                                 self.max_grad_norm)
                losses.append(loss)
                agreed.append(agreement)
        self.logger.record("teacher/cross_entropy", float(np.mean(losses)))
        self.logger.record("teacher/agreement", float(np.mean(agreed)))
