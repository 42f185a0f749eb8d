"""Evaluation of CarRacing experts: the shipped PPO expert, any PPO zip, the privileged
teacher or a random actor, scored on a run of consecutive track seeds (by default the
held-out tracks 900000, 900001, ...)."""

from __future__ import annotations

from nac_drive.simulators.carracing import EVAL_SEED_BASE


def evaluate_expert(expert: str | None, episodes: int, seed_base: int = EVAL_SEED_BASE, max_steps: int | None = None,
                    video: str | None = None, progress: bool = True, gas: float | None = None):
    """Drive ``expert`` (see :func:`~nac_drive.agents.experts.load_expert`; None: the shipped
    PPO expert) on ``episodes`` tracks; returns (its name, EpisodeResults). ``gas``: what a
    discrete teacher's or random actor's GAS presses (default ``DISCRETE_GAS``); a PPO zip
    drives with its own."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.simulators.carracing import eval_seeds, run_episodes

    actor, continuous = load_expert(expert, gas=gas)
    seeds = eval_seeds(episodes, base=seed_base)
    results = run_episodes(actor, seeds, continuous=continuous, max_steps=max_steps, video_path=video,
                           progress=progress)
    return actor.name, results


def compare_experts(zips: list[str], episodes: int, seed_base: int, progress: bool = True,
                    gas: float | None = None) -> dict:
    """Score PPO zips on the same tracks in the training's evaluation env (only the frames
    the expert sees are drawn; same returns as :func:`evaluate_expert`). Every zip is
    checked before any drives; one line per zip as it finishes, and with ``progress`` a bar.
    ``gas``: every zip drives with GAS pressing it instead of its own. Returns
    {path: EpisodeResults}."""
    from tqdm import tqdm

    from nac_drive.agents.ppo_lab.training import score_checkpoint
    from nac_drive.agents.ppo_lab.expert_zip import load_expert_zip

    for path in zips:
        load_expert_zip(path, gas)   # a bad zip fails before any other is driven
    scored = {}
    for path in tqdm(zips, desc="zips", unit="zip", disable=not progress):
        scored[path] = score_checkpoint(path, episodes, seed_base, gas)
        tqdm.write(f"{path}: {scored[path].format()}")
    return scored
