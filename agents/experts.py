"""Pick a CarRacing expert by name: the shipped PPO expert, a PPO zip, the teacher, or random actions."""

from __future__ import annotations

from typing import Any


def load_expert(spec: str | None = None, seed: int = 0, stock_env: bool = True) -> tuple[Any, bool]:
    """Return ``(actor, continuous)`` for ``spec``.

    ``spec``: ``None`` or ``"ppo"`` (the shipped PPO expert), a path to an SB3 zip,
    ``"teacher"`` (privileged pure pursuit, continuous actions), ``"teacher-discrete"``
    (the same, mapped to the 5 discrete actions), ``"random"`` or ``"random-discrete"``
    (uniform actions: the reference scores' random policy, each track's stream seeded by
    ``seed`` and the track). For a PPO zip, ``continuous`` comes from the zip; with
    ``stock_env`` a zip whose GAS presses more than gymnasium's (``PPOExpert.gas``) is
    refused, for callers that drive gymnasium's own envs.
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
    if stock_env:
        require_stock_env(actor)
    return actor, actor.continuous


def require_stock_env(expert) -> None:
    """``ValueError`` unless the PPO ``expert`` drives one of gymnasium's own CarRacing envs.
    Demonstrations, DAgger and the CNN+NAC policy drive only those so far; ``expert eval``
    and ``expert compare`` drive any."""
    from nac_drive.simulators.carracing import DISCRETE_GAS

    if expert.gas != DISCRETE_GAS:
        raise ValueError(f"{expert.path}: this expert's GAS presses {expert.gas} (gymnasium's discrete env: "
                         f"{DISCRETE_GAS}); only 'expert eval' and 'expert compare' drive it so far")
