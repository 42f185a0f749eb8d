"""Pick a CarRacing expert by name: the shipped PPO expert, a PPO zip, or the teacher."""

from __future__ import annotations

from typing import Any


def load_expert(spec: str | None = None) -> tuple[Any, bool]:
    """Return ``(actor, continuous)`` for ``spec``.

    ``spec``: ``None`` or ``"ppo"`` (the shipped PPO expert), a path to an SB3 zip,
    ``"teacher"`` (privileged pure pursuit, continuous actions) or ``"teacher-discrete"``
    (the same, mapped to the 5 discrete actions). For a PPO zip, ``continuous`` comes
    from the zip.
    """
    if spec in ("teacher", "teacher-discrete"):
        from nac_drive.agents.teacher import PurePursuitTeacher

        cont = spec == "teacher"
        return PurePursuitTeacher(continuous=cont), cont
    from nac_drive.agents.ppo_expert import PPOExpert

    actor = PPOExpert(None if spec in (None, "ppo") else spec)
    return actor, actor.continuous
