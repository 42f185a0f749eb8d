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
    from nac_drive.agents.experts import NAMED, load_expert
    from nac_drive.data_collection.carracing_dataset import (claim_tracks, dataset_folder, ensure_namespace,
                                                             refuse_existing, refuse_other_gas)
    from nac_drive.pipeline.processes import split_runs
    from nac_drive.pipeline.ray_tasks import everywhere, ray_jobs
    from nac_drive.pipeline.shards import record_shards
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
        expert = args.expert if args.expert in NAMED else everywhere(args.expert)   # as a Ray worker names it
        drive = partial(_drive_shard, expert=expert, max_steps=args.max_steps, gas=args.gas)
        with ray_jobs(args.ray) as ray:
            for part in record_shards(drive, runs, root=args.out, name=name, progress=progress, ray=ray):
                results.extend(part)
    return dataset_folder(args.out, name), results


def _drive_shard(seeds: list[int], *, expert: str, max_steps: int | None, gas: float | None,
                 progress: bool = False):
    """Drive ``expert`` on ``seeds``, recording every frame: a :class:`~nac_drive.pipeline.shards.DrivenShard`."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.data_collection.episode_recorder import RecordEpisodes
    from nac_drive.pipeline.shards import DrivenShard
    from nac_drive.simulators.carracing import FPS, actor_gas, make_carracing, run_episodes

    actor, continuous = load_expert(expert, gas=gas)
    env = RecordEpisodes(make_carracing(continuous=continuous, gas=actor_gas(actor)), fps=FPS)
    try:
        results = run_episodes(actor, seeds, continuous=continuous, max_steps=max_steps, env=env, progress=progress)
        description = f"CarRacing-v3 demonstrations by {actor.name}, tracks {seeds[0]}..{seeds[-1]}"
        return DrivenShard(results, env.take_episodes(), env.env.spec, actor.name, description)
    finally:
        env.close()
