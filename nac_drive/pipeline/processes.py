"""Worker processes for stages that drive CarRacing side by side (one env per core).

Each worker keeps one torch thread: the processes share the cores. A stage that drives
many tracks splits them into consecutive runs (:func:`split_runs`; a dataset's shard holds
consecutive tracks) and drives each run in its own process (:func:`drive_in_processes`);
``compare --workers`` trains several runs at once the same way (:func:`map_in_processes`).

A worker dies with the run that started it: killed (``kill -9``, ``kill -TERM``) or
interrupted, the parent takes its workers down at once (:func:`nac_drive.child_processes.die_with_parent`:
on Linux the kernel sends them SIGKILL; elsewhere a watchdog thread notices within a second), so
no orphan drives on, or writes, after the user stopped the run.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from functools import partial
from itertools import islice
from typing import Any

from nac_drive.child_processes import die_with_parent


def process_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes, one torch thread each."""
    # fork, as torch's DataLoader workers do: spawn would re-run the parent's main script
    # (an unguarded launcher runs everything again) and re-import torch in each worker
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_start_worker,
                               initargs=(os.getpid(),))


def _start_worker(parent: int) -> None:
    import torch

    die_with_parent(parent)
    torch.set_num_threads(1)


def split_runs(seeds: list[int], parts: int) -> list[list[int]]:
    """At most ``parts`` consecutive runs of ``seeds``, sizes differing by at most one (no empty run)."""
    size, extra = divmod(len(seeds), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [seeds[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def map_in_processes(call: Callable[[Any], Any], jobs: list, workers: int, *, desc: str | None = None,
                     unit: str = "job", size: Callable[[Any], int] = lambda job: 1,
                     name: Callable[[Any], str] | None = None) -> list:
    """``call(job)`` for every job, ``workers`` processes at a time (:func:`process_pool`);
    the results in the order of ``jobs``. With ``desc``, one bar counts ``size(job)`` for each
    finished job (and shows ``name(job)`` of the last). A job is handed to the pool only when a
    worker is free, so after a failed job no other starts: its error is raised once the jobs
    under way end."""
    if not jobs:
        return []
    bar, results, waiting = None, [None] * len(jobs), iter(enumerate(jobs))
    with process_pool(min(workers, len(jobs))) as pool:
        running = {pool.submit(call, job): i for i, job in islice(waiting, workers)}
        if desc:   # after the workers exist: no progress-bar thread is forked
            from tqdm import tqdm
            bar = tqdm(total=sum(map(size, jobs)), desc=desc, unit=unit)
        try:
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    i = running.pop(future)
                    results[i] = future.result()
                    if bar:
                        bar.update(size(jobs[i]))
                        if name:
                            bar.set_postfix_str(name(jobs[i]))
                    running.update({pool.submit(call, job): j for j, job in islice(waiting, 1)})
        finally:
            if bar:
                bar.close()
    return results


def drive_in_processes(drive: Callable[..., Any], runs: list[list[int]], progress: bool, **kwargs) -> list:
    """``drive(seeds, progress=..., **kwargs)`` for every run of seeds, one process each (a
    single run: in this process, with its own progress bar); returns the results in the
    order of ``runs``. With ``progress``, one bar counts the episodes of all runs."""
    if len(runs) == 1:
        return [drive(runs[0], progress=progress, **kwargs)]
    return map_in_processes(partial(drive, progress=False, **kwargs), runs, len(runs),
                            desc="episodes" if progress else None, unit="ep", size=len)


def record_in_processes(record: Callable[..., Any], runs: list[list[int]], progress: bool, *, root: str,
                        **kwargs) -> list:
    """:func:`drive_in_processes` for runs that each record a dataset shard under ``root``:
    ``record(seeds, progress=..., root=root, owner=..., **kwargs)`` returns (its result, the
    :class:`~nac_drive.data_collection.carracing_dataset.StagedShard` it wrote). The shards
    are committed together once every run has succeeded; if one fails none is, and if this
    process is killed its workers die with it and the next write removes what they staged."""
    from nac_drive.data_collection.carracing_dataset import commit_shards, remove_staged_by

    owner = os.getpid()
    try:
        parts = drive_in_processes(record, runs, progress, root=root, owner=owner, **kwargs)
    except BaseException:
        remove_staged_by(root, owner)
        raise
    commit_shards([shard for _, shard in parts])
    return [result for result, _ in parts]
