"""glibc's allocator, told to keep a training step's large buffers for the next step.

A training step on the CPU allocates and frees the same large tensors every step (one
convolution's activations for a batch of 32 windows x 16 frames are ~43 MB). glibc serves an
allocation above its mmap threshold (32 MB at most, by its own dynamic rule) with a fresh
``mmap`` and gives it back to the system on ``free``, so every step faults in and zeroes those
pages again; memory freed at the top of the heap above the trim threshold goes back too.
Raising both thresholds keeps that memory in the heap, where the next step finds it: CPU
training ran 1.55x the frames a second here (BENCHMARKS.md §2). The price: the process keeps
its peak memory between steps instead of handing it back, which a training run reaches every
step anyway. PyTorch's CPU performance guide suggests another allocator (jemalloc, tcmalloc
through ``LD_PRELOAD``) for the same reason; this needs nothing installed.

Linux with glibc only (``mallopt``); elsewhere, and with ``NAC_DRIVE_KEEP_BUFFERS=0`` in the
environment, nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3   # mallopt's parameters (<malloc.h>)
_KEEP_BYTES = 2**31 - 1                          # the largest value mallopt takes (an int)


def keep_large_buffers() -> bool:
    """Raise glibc's mmap and trim thresholds for the rest of this process; returns whether
    they were raised (False off Linux, without glibc's ``mallopt``, or when turned off)."""
    if not sys.platform.startswith("linux") or os.environ.get("NAC_DRIVE_KEEP_BUFFERS") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt   # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # musl's mallopt is a stub that returns 0: nothing changed
    return mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES) == 1
