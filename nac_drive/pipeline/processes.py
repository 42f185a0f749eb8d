"""Worker processes for stages that drive CarRacing side by side (one env per core).

Each worker keeps one torch thread: the processes share the cores.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def process_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes, one torch thread each."""
    # fork, as torch's DataLoader workers do: spawn would re-run the parent's main script
    # (an unguarded launcher runs everything again) and re-import torch in each worker
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_one_thread)


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)
