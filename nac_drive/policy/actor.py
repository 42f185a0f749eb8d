"""The one contract of everything that drives: the PPO expert, the privileged teacher,
random actions, a trained :class:`~nac_drive.policy.DrivingPolicy` (through the episode
runner's :class:`~nac_drive.agents.driver.PolicyDriver`) and the scripted Udacity drivers.

    actor.reset()                  # a new episode begins
    action = actor.act(observation)

``observation`` is what the simulator gives: CarRacing's raw RGB frame ``uint8
[96, 96, 3]``, or the Udacity bridge's dict ``{"image": uint8 RGB [160, 320, 3],
"timestamp": seconds, "speed": mph}`` (the timestamps an actor may read). ``act``
returns the simulator's action: an int of CarRacing's 5, ``float32 [3]`` (steer, gas,
brake), or the Udacity steering angle in [-1, 1] as a float.

Optional: ``reset_env(env)``, called after each gymnasium env reset, gives privileged
actors (the teacher) the env's state; ``name`` says what drove in summaries.
"""

from __future__ import annotations

from typing import Any, Protocol


class Actor(Protocol):
    def reset(self) -> None: ...

    def act(self, observation: Any) -> Any: ...
