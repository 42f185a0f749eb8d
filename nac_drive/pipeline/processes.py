"""Worker processes for stages that drive CarRacing side by side (one env per core).

Each worker keeps one torch thread: the processes share the cores. A stage that drives
many tracks splits them into consecutive runs (:func:`split_runs`; a dataset's shard holds
consecutive tracks) and drives each run in its own process (:func:`drive_in_processes`).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any


def process_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes, one torch thread each."""
    # fork, as torch's DataLoader workers do: spawn would re-run the parent's main script
    # (an unguarded launcher runs everything again) and re-import torch in each worker
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_one_thread)


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def split_runs(seeds: list[int], parts: int) -> list[list[int]]:
    """At most ``parts`` consecutive runs of ``seeds``, sizes differing by at most one (no empty run)."""
    size, extra = divmod(len(seeds), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [seeds[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def drive_in_processes(drive: Callable[..., Any], runs: list[list[int]], progress: bool, **kwargs) -> list:
    """``drive(seeds, progress=..., **kwargs)`` for every run of seeds, one process each (a
    single run: in this process, with its own progress bar); returns the results in the
    order of ``runs``. With ``progress``, one bar counts the episodes of all runs."""
    if len(runs) == 1:
        return [drive(runs[0], progress=progress, **kwargs)]
    bar, results = None, [None] * len(runs)
    try:
        with process_pool(len(runs)) as pool:
            futures = {pool.submit(drive, run, progress=False, **kwargs): i for i, run in enumerate(runs)}
            if progress:   # after the workers exist: no progress-bar thread is forked
                from tqdm import tqdm
                bar = tqdm(total=sum(map(len, runs)), desc="episodes", unit="ep")
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if bar:
                    bar.update(len(runs[futures[future]]))
    finally:
        if bar:
            bar.close()
    return results
