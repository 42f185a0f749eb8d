"""A gymnasium wrapper that keeps every episode the env plays, for writing a dataset.

Whoever drives (an expert, or a student under DAgger) steps the wrapped env as usual;
the wrapper stores observations, actions, rewards and end flags per episode. With an
``oracle`` (DAgger) the stored action is the oracle's answer for the state the driver
acted in, while the env executes the driver's action.

It does what ``minari.DataCollector`` does and hands :func:`write_dataset` the fields of
Minari's ``EpisodeBuffer``. DataCollector cannot serve here: every step it stores goes
through ``jax.tree_util`` (minari's ``[create]`` extra: jax and jaxlib, which nac-drive does
not install). It would also need a wrapper and a step callback for DAgger's labels and
the timestamps, and a hidden ``MINARI_DATASETS_PATH`` for the temporary folder it stages
data in, which a loader would otherwise find after a kill.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class RecordEpisodes(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Records episodes as dicts ready for :func:`write_dataset`.

    Each finished episode: ``observations`` ``[N+1, ...]``, ``actions``, ``rewards``,
    ``terminations``, ``truncations`` ``[N]``, ``timestamps`` ``[N+1]`` (env time,
    ``frame / fps``), ``seed``. An episode cut short by the driver (not terminated or
    truncated by the env) is marked truncated at its last step.

    ``oracle``: an actor as :func:`~nac_drive.simulators.carracing.run_episodes` drives
    (``reset()``, ``act(obs)``, optionally ``reset_env(env)``, called after each env reset
    with the wrapped env); it sees every frame the driver sees, and its ``act`` is the label.
    """

    def __init__(self, env: gym.Env, fps: float, oracle: Any = None):
        # the oracle (an actor holding a network or the env's state) is not part of the env:
        # a spec rebuilds the recorder without it, recording the actions the env plays
        gym.utils.RecordConstructorArgs.__init__(self, fps=fps)
        gym.Wrapper.__init__(self, env)
        self.fps, self.oracle = fps, oracle
        self.episodes: list[dict[str, Any]] = []
        self._current: dict[str, list] | None = None
        self._obs: Any = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._finish()
        obs, info = self.env.reset(seed=seed, options=options)
        self._obs = obs
        if self.oracle is not None:
            self.oracle.reset()
            if hasattr(self.oracle, "reset_env"):
                self.oracle.reset_env(self.env)
        self._current = {"observations": [obs], "actions": [], "rewards": [], "terminations": [],
                         "truncations": [], "seed": seed}
        return obs, info

    def step(self, action):
        if self.oracle is not None and self._obs is None:
            raise RuntimeError("RecordEpisodes: reset the env before stepping it (the oracle must see the frame)")
        label = self.oracle.act(self._obs) if self.oracle is not None else action
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._obs = obs
        if self._current is not None:
            self._current["observations"].append(obs)
            self._current["actions"].append(label)
            self._current["rewards"].append(float(reward))
            self._current["terminations"].append(bool(terminated))
            self._current["truncations"].append(bool(truncated))
        return obs, reward, terminated, truncated, info

    def close(self):
        self._finish()
        return super().close()

    def take_episodes(self) -> list[dict[str, Any]]:
        """Finished episodes so far (the current one included), emptying the store."""
        self._finish()
        episodes, self.episodes = self.episodes, []
        return episodes

    def _finish(self) -> None:
        ep, self._current = self._current, None
        if not ep or not ep["actions"]:
            return
        if not (ep["terminations"][-1] or ep["truncations"][-1]):
            ep["truncations"][-1] = True
        n = len(ep["actions"])
        self.episodes.append({
            "observations": np.stack(ep["observations"]),
            "actions": np.asarray(ep["actions"]),
            "rewards": np.asarray(ep["rewards"], np.float32),
            "terminations": np.asarray(ep["terminations"]),
            "truncations": np.asarray(ep["truncations"]),
            "timestamps": np.arange(n + 1, dtype=np.float64) / self.fps,
            "seed": ep["seed"],
        })
