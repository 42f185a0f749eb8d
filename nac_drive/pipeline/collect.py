"""Collection: experts drive CarRacing tracks, their episodes become a Minari dataset.

Track seeds are ``COLLECT_SEED_BASE + seed + i`` (the collection range: never used by
expert training, nor by evaluation, which starts at 900000). Every frame stores the raw RGB
observation the student will see and the expert's action, in the env the expert drives (a
PPO zip's gas, which the dataset's env spec keeps). ``workers`` processes drive
consecutive runs of the tracks, one shard each (``nac_drive/<name>/seeds-<first>-<last>-v1``).
"""

from __future__ import annotations


def collect_carracing(expert: str, episodes: int, seed: int, out: str, max_steps: int | None = None,
                      name: str | None = None, progress: bool = True, workers: int = 1, gas: float | None = None):
    """Record ``episodes`` expert episodes in ``workers`` processes; returns (dataset folder,
    EpisodeResults over all tracks in seed order). ``gas``: the teacher's or random actions'
    (see :func:`~nac_drive.agents.experts.load_expert`)."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.data_collection.carracing_dataset import (dataset_folder, ensure_namespace, refuse_existing,
                                                             refuse_other_gas)
    from nac_drive.simulators.carracing import COLLECT_SEED_BASE, actor_gas

    if episodes < 1 or workers < 1:
        raise ValueError(f"episodes and workers must be >= 1, got {episodes} and {workers}")
    actor, _ = load_expert(expert, gas=gas)   # a bad expert or gas fails here, before any process
    name = name or f"carracing-{actor.name.replace(':', '-').replace('/', '-')}"
    seeds = [COLLECT_SEED_BASE + seed + i for i in range(episodes)]
    chunks = [c for c in _split(seeds, workers) if c]
    for chunk in chunks:   # before driving: a shard that is taken would waste the collection
        refuse_existing(out, name, chunk)
    refuse_other_gas(dataset_folder(out, name), actor_gas(actor), "--name")
    ensure_namespace(out, name)
    jobs = [(expert, chunk, out, name, max_steps, gas) for chunk in chunks]
    if len(jobs) == 1:
        results = [_collect_shard(*jobs[0], progress=progress)]
    else:
        results = _in_processes(jobs, progress)
    return dataset_folder(out, name), _merge(results)


def _split(seeds: list[int], parts: int) -> list[list[int]]:
    """``parts`` consecutive runs of ``seeds``, sizes differing by at most one."""
    size, extra = divmod(len(seeds), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [seeds[a:b] for a, b in zip(bounds, bounds[1:])]


def _collect_shard(expert: str, seeds: list[int], out: str, name: str, max_steps: int | None,
                   gas: float | None = None, progress: bool = False):
    """Drive ``expert`` on ``seeds`` and write them as one shard; returns EpisodeResults."""
    from nac_drive.agents.experts import load_expert
    from nac_drive.data_collection.carracing_dataset import write_dataset
    from nac_drive.data_collection.episode_recorder import RecordEpisodes
    from nac_drive.simulators.carracing import FPS, actor_gas, make_carracing, run_episodes

    actor, continuous = load_expert(expert, gas=gas)
    env = RecordEpisodes(make_carracing(continuous=continuous, gas=actor_gas(actor)), fps=FPS)
    try:
        results = run_episodes(actor, seeds, continuous=continuous, max_steps=max_steps, env=env, progress=progress)
        write_dataset(out, name, env.take_episodes(), env.env, expert=actor.name,
                      description=f"CarRacing-v3 demonstrations by {actor.name}, tracks {seeds[0]}..{seeds[-1]}")
    finally:
        env.close()
    return results


def _in_processes(jobs: list[tuple], progress: bool):
    """Run :func:`_collect_shard` for every job, one process each."""
    from concurrent.futures import as_completed

    from nac_drive.pipeline.processes import process_pool

    with process_pool(len(jobs)) as pool:
        futures = {pool.submit(_collect_shard, *job): i for i, job in enumerate(jobs)}
        bar = None
        if progress:   # after the workers exist: no progress-bar thread is forked
            from tqdm import tqdm
            bar = tqdm(total=sum(len(job[1]) for job in jobs), desc="episodes", unit="ep")
        results = [None] * len(jobs)
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            if bar:
                bar.update(len(jobs[futures[future]][1]))
    if bar:
        bar.close()
    return results


def _merge(parts):
    """One EpisodeResults from the shards' (in seed order)."""
    from nac_drive.simulators.carracing import EpisodeResults

    merged = EpisodeResults()
    for part in parts:
        for field in ("seeds", "returns", "lengths", "laps", "latencies_ms"):
            getattr(merged, field).extend(getattr(part, field))
    return merged
