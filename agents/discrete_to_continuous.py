"""Start a continuous-action PPO expert from a discrete one.

The discrete CarRacing car can only press gas at 0.2 and cannot steer and accelerate at
once, so a discrete expert runs out of frames before the lap on many tracks. A
continuous one can do better, but learning it from scratch costs far more frames than
fine-tuning. This module gives a continuous policy the discrete expert's behaviour:

1. every weight the two networks share (the CNN, the policy and value MLPs, the value
   head) is copied;
2. the Gaussian mean head, the only new layer, is fitted by least squares so that on
   states the discrete expert visits, its mean is the expected continuous action of the
   discrete policy, ``sum_i p_i(obs) * fit_targets(released_brake)[i]``.

PPO then fine-tunes the result as usual. Its rollouts add Gaussian noise to the mean, SB3
clips the result to the action space (brake in [0, 1]), and the env brakes at any value
above 0: with the brake's mean at 0, half of all steps would brake. So the fit can put
"brake released" at a negative value (``released_brake``), far enough below 0 that the
noise does not reach it; the mean then brakes only where the discrete expert mostly would.
"""

from __future__ import annotations

import numpy as np
import torch

# gymnasium's CarRacing: discrete actions call steer(-0.6 | +0.6), gas(0.2), brake(0.8);
# continuous ones call steer(-a[0]), gas(a[1]), brake(a[2]). So discrete action i is the
# continuous action in row i.
DISCRETE_AS_CONTINUOUS = np.array([
    [0.0, 0.0, 0.0],   # 0 no-op
    [0.6, 0.0, 0.0],   # 1 steer right
    [-0.6, 0.0, 0.0],  # 2 steer left
    [0.0, 0.2, 0.0],   # 3 gas
    [0.0, 0.0, 0.8],   # 4 brake
], np.float32)


def fit_targets(released_brake: float) -> np.ndarray:
    """:data:`DISCRETE_AS_CONTINUOUS` with brake ``released_brake`` (<= 0) in the rows that
    do not brake; clipped to the action space it is 0, so each row still drives as its
    discrete action."""
    if not released_brake <= 0:  # NaN too
        raise ValueError(f"released_brake must be <= 0 (the env brakes above 0), got {released_brake}")
    targets = DISCRETE_AS_CONTINUOUS.copy()
    targets[targets[:, 2] == 0, 2] = released_brake
    return targets


# The tensors of SB3's continuous actor-critic that a discrete one lacks or shapes otherwise.
ACTION_HEAD = ("action_net.weight", "action_net.bias", "log_std")


def copy_shared_weights(discrete, continuous) -> None:
    """Copy every tensor of ``discrete`` into ``continuous`` except the :data:`ACTION_HEAD`.

    Raises torch's ``RuntimeError`` (naming the tensors) if the networks differ elsewhere."""
    shared = {name: t for name, t in discrete.state_dict().items() if name not in ACTION_HEAD}
    continuous.load_state_dict({**continuous.state_dict(), **shared})


def collect_states(discrete, venv, steps_per_env: int) -> np.ndarray:
    """Drive ``venv`` (continuous actions) with the discrete policy's deterministic choices.

    Returns the observations it saw, ``uint8 [steps_per_env * n_envs, stack, 64, 64]``."""
    obs = venv.reset()
    seen = []
    for _ in range(steps_per_env):
        seen.append(obs)
        with torch.no_grad():
            choice = discrete.get_distribution(torch.as_tensor(obs)).get_actions(deterministic=True)
        obs, _, _, _ = venv.step(DISCRETE_AS_CONTINUOUS[choice.numpy()])
    return np.concatenate(seen)


def fit_mean_head(discrete, continuous, states: np.ndarray, *, released_brake: float,
                  ridge: float = 1e-3) -> float:
    """Fit ``continuous.action_net`` to the discrete policy's expected continuous action,
    ``probs @ fit_targets(released_brake)``.

    ``states``: ``uint8 [N, stack, 64, 64]``. Both policies must share their feature
    extractor and policy MLP (see :func:`copy_shared_weights`). Returns the fit's R^2.
    """
    with torch.no_grad():
        x = torch.as_tensor(states)
        probs = discrete.get_distribution(x).distribution.probs              # [N, 5]
        target = probs @ torch.as_tensor(fit_targets(released_brake))         # [N, 3]
        latent = continuous.mlp_extractor.forward_actor(continuous.extract_features(x))
        design = torch.cat([latent, torch.ones(len(latent), 1)], dim=1).double()  # [N, 257]
        gram = design.T @ design + ridge * len(design) * torch.eye(design.shape[1], dtype=torch.float64)
        solution = torch.linalg.solve(gram, design.T @ target.double())         # [257, 3]
        head = continuous.action_net
        head.weight.copy_(solution[:-1].T.float())
        head.bias.copy_(solution[-1].float())
        residual = target - head(latent)
        return float(1.0 - residual.pow(2).sum() / (target - target.mean(0)).pow(2).sum())
