"""Runs of consecutive tracks driven and recorded, one dataset shard each: the collection's
expert demonstrations and each DAgger round's labelled drives.

A run is driven by ``drive(seeds, progress=...)``, which returns a :class:`DrivenShard` (the
episodes, not yet written). :func:`record_shards` drives every run in a worker process of
this machine, which writes its shard (staged, :func:`~nac_drive.pipeline.processes.record_in_processes`),
or as a Ray task (:class:`~nac_drive.pipeline.ray_tasks.RayJobs`), whose episodes come back to
this process, which writes them. Either way the shards are committed together once every run
has succeeded, and none if one fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DrivenShard:
    """A run of tracks driven and recorded, not yet written: what a Ray task hands back."""

    results: Any            # EpisodeResults
    episodes: list[dict]    # RecordEpisodes' episodes
    env_spec: Any           # the recorded env's gymnasium EnvSpec
    expert: str             # who chose (collection) or labelled (DAgger) the recorded actions
    description: str        # the dataset's description

    def stage(self, root: str, name: str, owner: int | None = None):
        """Write it as one shard, staged for ``owner`` to commit (:func:`stage_shard`)."""
        from nac_drive.data_collection.carracing_dataset import stage_shard

        return stage_shard(root, name, self.episodes, self.env_spec, expert=self.expert, owner=owner,
                           description=self.description)


def record_shards(drive, runs: list[list[int]], *, root: str, name: str, progress: bool, ray=None) -> list:
    """``drive`` every run of track seeds, each run one shard of dataset ``name`` under ``root``:
    one worker process per run, or with ``ray`` (an open
    :class:`~nac_drive.pipeline.ray_tasks.RayJobs`) one Ray task per run. Returns the
    EpisodeResults in the order of ``runs``."""
    from nac_drive.pipeline.processes import record_in_processes

    if ray is not None:
        return _record_on_ray(drive, runs, ray, root, name, progress)
    return record_in_processes(_staged, runs, progress, root=root, driver=drive, name=name)


def _staged(seeds: list[int], *, driver, root: str, name: str, owner: int, progress: bool):
    """A worker process's run: ``driver(seeds)`` staged as one shard for ``owner`` to commit;
    returns (EpisodeResults, the staged shard)."""
    shard = driver(seeds, progress=progress)
    return shard.results, shard.stage(root, name, owner)


def _record_on_ray(drive, runs: list[list[int]], ray, root: str, name: str, progress: bool) -> list:
    """Every run driven as a Ray task; each staged here as it comes back, all committed once
    every run has succeeded (none if one fails). The EpisodeResults in the order of ``runs``."""
    from nac_drive.data_collection.carracing_dataset import commit_shards, discard_shards

    results, staged = [None] * len(runs), []
    try:
        for i, shard in ray.run(drive, runs, desc="episodes" if progress else None, unit="ep", size=len):
            results[i] = shard.results
            staged.append(shard.stage(root, name))
    except BaseException:
        discard_shards(staged)
        raise
    commit_shards(staged)
    return results
