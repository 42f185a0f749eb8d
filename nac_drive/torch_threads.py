"""How many threads torch may use, per job.

A control loop's forward on one frame is fastest on one thread (more only adds
hand-off cost); a training step on a batch of 512 frames runs ~1.8x faster here on
two (BENCHMARKS.md §2). Processes that share the cores (collection workers, ranks
under torchrun) each keep one.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


def allowed_cores() -> list[int]:
    """The CPUs this process may run on, in order (all of them where the OS does not say: macOS,
    Windows); the recipes pin their lanes to these (``benchmarks/recipes/lib.bash``)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def available_cores() -> int:
    """The cores this process may run on."""
    return len(allowed_cores())


def check_workers(workers: int) -> None:
    """Refuse more worker processes than cores, in one line: each worker is one single-threaded
    process of ~400 MB (a CarRacing env and a policy), so more only slow each other down
    while their memory adds up (8 workers on 2 cores once took 3.1 GB)."""
    cores = available_cores()
    if workers > cores:
        raise ValueError(f"--workers: {workers} is more than the {cores} cores this process may use; each worker is "
                         f"one single-threaded process of ~400 MB, so more than {cores} only slows them down")


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``threads`` torch threads; the count of before is restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
