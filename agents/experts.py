"""Pick a CarRacing expert by name: the shipped PPO expert, a PPO zip, the teacher, or random actions."""

from __future__ import annotations

from typing import Any


def load_expert(spec: str | None = None, seed: int = 0) -> tuple[Any, bool]:
    """Return ``(actor, continuous)`` for ``spec``.

    ``spec``: ``None`` or ``"ppo"`` (the shipped PPO expert), a path to an SB3 zip,
    ``"teacher"`` (privileged pure pursuit, continuous actions), ``"teacher-discrete"``
    (the same, mapped to the 5 discrete actions), ``"random"`` or ``"random-discrete"``
    (uniform actions: the reference scores' random policy, each track's stream seeded by
    ``seed`` and the track). For a PPO zip, ``continuous`` comes from the zip, and so does
    the gas of the env it drives (``PPOExpert.gas``, see
    :func:`~nac_drive.simulators.carracing.actor_gas`).
    """
    if spec in ("teacher", "teacher-discrete"):
        from nac_drive.agents.teacher import PurePursuitTeacher

        cont = spec == "teacher"
        return PurePursuitTeacher(continuous=cont), cont
    if spec in ("random", "random-discrete"):
        from nac_drive.agents.random_actor import RandomActor

        cont = spec == "random"
        return RandomActor(continuous=cont, seed=seed), cont
    from nac_drive.agents.ppo_expert import PPOExpert

    actor = PPOExpert(None if spec in (None, "ppo") else spec)
    return actor, actor.continuous
