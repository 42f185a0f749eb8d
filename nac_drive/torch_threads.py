"""How many threads torch may use, per job.

A control loop's forward on one frame is fastest on one thread (more only adds
hand-off cost); a training step on a batch of 512 frames runs 1.3-1.4x faster here on
two (BENCHMARKS.md §2). Processes that share the cores (collection workers, ranks
under torchrun) each keep one.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
