"""Discrete actions that can steer and press gas at once.

gymnasium's discrete CarRacing has 5 exclusive actions: a discrete car that steers
cannot accelerate. At an action repeat of 4 every steering decision then coasts for 4
frames, and most of the discrete expert's episodes end at frame 1000 just short of the
lap. A continuous expert could steer and accelerate together, but Gaussian exploration
made PPO lose ground every time it was started from the discrete expert (BENCHMARKS §3).

This module keeps a categorical policy (its most likely action is a real choice, no
clipping of noise) and adds the two missing combinations, played through the continuous
env: the 5 discrete actions as their exact continuous rows, then steer right + gas and
steer left + gas (:data:`COMBINED_ACTIONS`). A 5-action expert is widened to them without
changing what it does (:func:`widen_action_head`), so PPO starts from its behaviour.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from nac_drive.agents.discrete_to_continuous import DISCRETE_AS_CONTINUOUS
from nac_drive.simulators.carracing import BRAKE, GAS, LEFT, NOOP, RIGHT

RIGHT_GAS, LEFT_GAS = 5, 6
# Row i is the continuous action (steer, gas, brake) of combined action i.
COMBINED_ACTIONS = np.concatenate([
    DISCRETE_AS_CONTINUOUS,
    DISCRETE_AS_CONTINUOUS[[RIGHT]] + DISCRETE_AS_CONTINUOUS[GAS],  # 5 steer right + gas
    DISCRETE_AS_CONTINUOUS[[LEFT]] + DISCRETE_AS_CONTINUOUS[GAS],   # 6 steer left + gas
])
# Combined action -> the discrete action whose head row it starts from.
WIDENED_FROM = (NOOP, RIGHT, LEFT, GAS, BRAKE, RIGHT, LEFT)


class CombinedActions(gym.ActionWrapper):
    """A continuous CarRacing driven by ``Discrete(len(table))``: action i is ``table[i]``."""

    def __init__(self, env: gym.Env, table: np.ndarray = COMBINED_ACTIONS):
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, gym.spaces.Box) or space.shape != (3,):
            raise ValueError(f"CombinedActions needs a continuous CarRacing (Box(3)), got {space}")
        self.table = check_action_table(table, space)
        self.action_space = gym.spaces.Discrete(len(self.table))

    def action(self, action) -> np.ndarray:
        return self.table[int(action)].copy()


def check_action_table(table, space: gym.spaces.Box) -> np.ndarray:
    """``table`` as ``float32 [n, 3]``; ``ValueError`` if it has another shape, a
    non-finite value or a row outside ``space``."""
    try:
        table = np.asarray(table, np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"action table is not a list of numbers: {exc}") from exc
    if table.ndim != 2 or table.shape[1] != 3 or len(table) < 2:
        raise ValueError(f"action table must be [n >= 2, 3] (steer, gas, brake), got shape {table.shape}")
    if not np.isfinite(table).all() or not ((table >= space.low) & (table <= space.high)).all():
        raise ValueError(f"action table has values outside the action space {space}: {table.tolist()}")
    return table


def widen_action_head(discrete, combined, new_action_offset: float = 3.0) -> None:
    """Start the combined-action policy ``combined`` from the 5-action policy ``discrete``.

    Every tensor is copied; the action head's row (and bias) of combined action i is that
    of discrete action ``WIDENED_FROM[i]``, with the bias of the new actions lowered by
    ``new_action_offset``. So each new action starts ``exp(-offset)`` as likely as the
    steering it adds gas to (5% at 3): the most likely action is unchanged, and PPO
    samples the new ones often enough to learn where they pay.
    """
    if not new_action_offset > 0:  # NaN too
        raise ValueError(f"new_action_offset must be > 0 (the new actions start less likely), "
                         f"got {new_action_offset}")
    state = discrete.state_dict()
    rows = torch.as_tensor(WIDENED_FROM)
    offset = torch.zeros(len(WIDENED_FROM))
    offset[len(DISCRETE_AS_CONTINUOUS):] = new_action_offset
    state["action_net.weight"] = state["action_net.weight"][rows]
    state["action_net.bias"] = state["action_net.bias"][rows] - offset
    combined.load_state_dict(state)
