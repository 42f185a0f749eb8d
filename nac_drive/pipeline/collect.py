"""Collection: experts drive CarRacing tracks, their episodes become a Minari dataset.

Track seeds are ``seed_base + i``, from ``COLLECT_SEED_BASE`` (100000) by default: the collection
range, never used by expert training; validation (800000-) and held-out (900000-) tracks are
refused. Every frame stores the raw RGB observation the student will see and the expert's
action, in the env the expert drives (a PPO zip's gas, which the dataset's env spec keeps). ``workers`` processes drive
consecutive runs of the tracks, one shard each (``nac_drive/<name>/seeds-<first>-<last>-v1``);
with ``ray``, the same runs are Ray tasks (:mod:`~nac_drive.pipeline.ray_tasks`), on this
machine or a cluster, and this process writes the shards they drove.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from nac_drive.fields import MAX_EPISODES, MAX_SEED, arg, check_fields
from nac_drive.pipeline.ray_tasks import ray_arg
from nac_drive.simulators.carracing import COLLECT_SEED_BASE, VALIDATION_SEED_BASE
from nac_drive.torch_threads import check_workers


@dataclass
class CollectArgs:
    """Arguments of ``nac-drive collect carracing``."""

    expert: str = arg("ppo", "'ppo' (the shipped PPO expert), a PPO zip path, 'teacher', 'teacher-discrete', "
                             "'planner' or 'planner-discrete'")
    episodes: int = arg(20, "episodes (one track each)", min=1, max=MAX_EPISODES)
    seed_base: int = arg(COLLECT_SEED_BASE, f"seed of the first track (below {VALIDATION_SEED_BASE}: the validation and "
                                            "held-out tracks are never recorded)", min=0, max=MAX_SEED)
    max_steps: int | None = arg(None, "cap each episode (env frames; default 1000)", min=1)
    gas: float | None = arg(None, "teacher-, planner- and random-discrete: what the GAS action presses (default 0.2, "
                                  "gymnasium's discrete env); a PPO zip records its own", above=0, max=1)
    out: str = arg("runs/demos", "dataset root folder (Minari's MINARI_DATASETS_PATH)")
    name: str | None = arg(None, "dataset name (default: carracing-<expert>)")
    workers: int = arg(1, "processes driving episodes in parallel (one per core, at most the cores), one shard each",
                       min=1)
    ray: str | None = ray_arg()   # with it, --workers counts the shards (Ray tasks), not this machine's processes

    def __post_init__(self):
        check_fields(self)
        last = self.seed_base + self.episodes - 1
        if last >= VALIDATION_SEED_BASE:
            raise ValueError(f"--seed-base: tracks {self.seed_base}..{last} reach the validation and held-out tracks "
                             f"({VALIDATION_SEED_BASE}-); demonstrations end below {VALIDATION_SEED_BASE}")
        if self.ray is None:
            check_workers(self.workers)


def collect_carracing(args: CollectArgs, progress: bool = True):
    """Record ``args.episodes`` expert episodes in ``args.workers`` processes (or as many Ray
    tasks, ``args.ray``); returns
    (dataset folder, EpisodeResults over all tracks in seed order). ``gas``: the teacher's or
    random actions' (see :func:`~nac_drive.agents.experts.load_expert`)."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.data_collection.carracing_dataset import (claim_tracks, dataset_folder, ensure_namespace,
                                                             refuse_existing, refuse_other_gas)
    from nac_drive.pipeline.processes import record_in_processes, split_runs
    from nac_drive.simulators.carracing import EpisodeResults, actor_gas

    actor, _ = load_expert(args.expert, gas=args.gas)   # a bad expert or gas fails here, before any process
    name = args.name or f"carracing-{actor.name.replace(':', '-').replace('/', '-')}"
    runs = split_runs([args.seed_base + i for i in range(args.episodes)], args.workers)
    for run in runs:   # before driving: a shard that is taken would waste the collection
        refuse_existing(args.out, name, run)
    refuse_other_gas(dataset_folder(args.out, name), actor_gas(actor), "--name")
    results = EpisodeResults()
    with claim_tracks(args.out, name, [seed for run in runs for seed in run]):   # a concurrent collect: refused
        ensure_namespace(args.out, name)
        drive = partial(_drive_shard, expert=args.expert, max_steps=args.max_steps, gas=args.gas)
        parts = (_record_on_ray(drive, runs, args.ray, args.out, name, progress) if args.ray else
                 record_in_processes(_collect_shard, runs, progress, root=args.out, driver=drive, name=name))
        for part in parts:
            results.extend(part)
    return dataset_folder(args.out, name), results


@dataclass
class DrivenShard:
    """A run of tracks driven and recorded, not yet written: what a Ray task hands back."""

    results: Any            # EpisodeResults
    episodes: list[dict]    # RecordEpisodes' episodes
    env_spec: Any           # the recorded env's gymnasium EnvSpec
    expert: str             # the actor's name

    def stage(self, root: str, name: str, owner: int | None = None):
        """Write it as one shard, staged for ``owner`` to commit (:func:`stage_shard`)."""
        from nac_drive.data_collection.carracing_dataset import stage_shard

        seeds = [ep["seed"] for ep in self.episodes]
        return stage_shard(root, name, self.episodes, self.env_spec, expert=self.expert, owner=owner,
                           description=f"CarRacing-v3 demonstrations by {self.expert}, tracks {seeds[0]}..{seeds[-1]}")


def _drive_shard(seeds: list[int], *, expert: str, max_steps: int | None, gas: float | None,
                 progress: bool = False) -> DrivenShard:
    """Drive ``expert`` on ``seeds``, recording every frame."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.data_collection.episode_recorder import RecordEpisodes
    from nac_drive.simulators.carracing import FPS, actor_gas, make_carracing, run_episodes

    actor, continuous = load_expert(expert, gas=gas)
    env = RecordEpisodes(make_carracing(continuous=continuous, gas=actor_gas(actor)), fps=FPS)
    try:
        results = run_episodes(actor, seeds, continuous=continuous, max_steps=max_steps, env=env, progress=progress)
        return DrivenShard(results, env.take_episodes(), env.env.spec, actor.name)
    finally:
        env.close()


def _collect_shard(seeds: list[int], *, driver, root: str, name: str, owner: int, progress: bool):
    """A process's run: ``driver(seeds)`` staged as one shard for ``owner`` to commit;
    returns (EpisodeResults, the staged shard)."""
    shard = driver(seeds, progress=progress)
    return shard.results, shard.stage(root, name, owner)


def _record_on_ray(drive, runs: list[list[int]], address: str, root: str, name: str, progress: bool) -> list:
    """Every run driven as a Ray task; each staged here as it comes back, all committed once
    every run has succeeded (none if one fails). The EpisodeResults in the order of ``runs``."""
    from nac_drive.data_collection.carracing_dataset import commit_shards, discard_shards
    from nac_drive.pipeline.ray_tasks import tasks_on_ray

    results, staged = [None] * len(runs), []
    try:
        for i, shard in tasks_on_ray(drive, runs, address, desc="episodes" if progress else None, unit="ep",
                                     size=len):
            results[i] = shard.results
            staged.append(shard.stage(root, name))
    except BaseException:
        discard_shards(staged)
        raise
    commit_shards(staged)
    return results
