"""Pick a CarRacing expert by name: the shipped PPO expert, a PPO zip, the teacher, the planner, or random actions."""

from __future__ import annotations

from typing import Any


def _teacher(**kwargs):
    from nac_drive.agents.teacher import PurePursuitTeacher

    return PurePursuitTeacher(**kwargs)


def _planner(**kwargs):
    from nac_drive.agents.planner import MinimumTimePlanner

    return MinimumTimePlanner(**kwargs)


# The privileged experts (they read the env's track), by name: each drives the continuous env,
# and its "-discrete" twin the 5 discrete actions.
PRIVILEGED = {"teacher": _teacher, "teacher-discrete": _teacher, "planner": _planner, "planner-discrete": _planner}
NAMED = ("ppo", *PRIVILEGED, "random", "random-discrete")   # load_expert's names; any other spec is a zip's path


def load_expert(spec: str | None = None, seed: int = 0, gas: float | None = None,
                device: str = "cpu") -> tuple[Any, bool]:
    """Return ``(actor, continuous)`` for ``spec``.

    ``spec``: ``None`` or ``"ppo"`` (the shipped PPO expert), a path to an SB3 zip,
    ``"teacher"`` (privileged pure pursuit, continuous actions), ``"teacher-discrete"``
    (the same, mapped to the 5 discrete actions), ``"planner"`` or ``"planner-discrete"``
    (privileged minimum-time speed profile), ``"random"`` or ``"random-discrete"``
    (uniform actions: the reference scores' random policy, each track's stream seeded by
    ``seed`` and the track). For a PPO zip, ``continuous`` comes from the zip, and so does
    the gas of the env it drives (``PPOExpert.gas``, see
    :func:`~nac_drive.simulators.carracing.actor_gas`). ``gas``: what the discrete teacher's,
    planner's or random actions' GAS presses (default: gymnasium's); a zip's own cannot be changed here
    (``expert ship --gas`` writes a copy with another). ``device``: where a PPO expert's network
    runs (the others run none: :func:`runs_network`).
    """
    from nac_drive.simulators.carracing import DISCRETE_GAS

    if spec in PRIVILEGED or spec in ("random", "random-discrete"):
        cont = not spec.endswith("-discrete")
        if cont and gas not in (None, DISCRETE_GAS):
            raise ValueError(f"--gas: {spec} drives the continuous env, whose gas is the action's")
        gas = DISCRETE_GAS if gas is None else gas
        if spec in PRIVILEGED:
            return PRIVILEGED[spec](continuous=cont, gas=gas), cont
        from nac_drive.agents.random_actor import RandomActor

        return RandomActor(continuous=cont, seed=seed, gas=gas), cont
    from nac_drive.agents.ppo_expert import PPOExpert

    actor = PPOExpert(None if spec in (None, "ppo") else spec, device=device)
    if gas is not None and gas != actor.gas:
        raise ValueError(f"--gas: {actor.name}'s zip sets gas {actor.gas} ('expert compare ZIP --gas {gas}' "
                         f"drives it with another, 'expert ship ZIP OUT --gas {gas}' records one)")
    return actor, actor.continuous


def runs_network(spec: str | None) -> bool:
    """Whether the expert ``spec`` names (as :func:`load_expert` takes it) runs a network: a PPO
    zip does; the privileged experts and random actions compute theirs."""
    return not (spec in PRIVILEGED or spec in ("random", "random-discrete"))
