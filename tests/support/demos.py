"""Small synthetic CarRacing demonstrations for tests that need a dataset."""

import numpy as np


def synthetic_episodes(n_episodes=4, length=40, seed=0):
    """Frames whose brightness band tells the action: a learnable, deterministic mapping."""
    rng = np.random.default_rng(seed)
    episodes = []
    for e in range(n_episodes):
        actions = rng.integers(0, 5, size=length)
        obs = rng.integers(0, 40, size=(length + 1, 96, 96, 3), dtype=np.uint8)
        for i, a in enumerate(actions):
            obs[i, :, 16 * a:16 * a + 16] = 255     # a bright vertical band at column block `a`
        episodes.append({"observations": obs, "actions": actions, "rewards": rng.normal(size=length),
                         "terminations": np.zeros(length, bool), "truncations": np.r_[np.zeros(length - 1, bool), True],
                         "timestamps": np.arange(length + 1) * 0.02, "seed": 100_000 + e})
    return episodes
