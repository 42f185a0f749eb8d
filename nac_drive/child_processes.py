"""Child processes that die with the process that started them, however it ends (``kill -9``
included), so none lives on holding a core, a file or a port after the user stopped the run.

On Linux the kernel sends the child SIGKILL when its parent dies (``PR_SET_PDEATHSIG``);
elsewhere a Python worker watches its parent from a thread, and a started program
(which no thread of ours survives into) has no such guard.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


def _prctl() -> Callable | None:
    """libc's ``prctl`` on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).prctl


def die_with_parent(parent: int) -> None:
    """End this process (a forked worker) as soon as ``parent`` (the process that started it) is gone."""
    prctl = _prctl()
    if prctl is not None and prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
        if os.getppid() != parent:   # it died before the request took effect
            os._exit(1)
        return

    def watch() -> None:
        import psutil

        # Windows keeps a dead parent's id as the parent id: ask whether that process still runs
        while os.getppid() == parent and psutil.pid_exists(parent):
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def program_dies_with_us() -> Callable[[], None] | None:
    """A ``subprocess.Popen`` ``preexec_fn`` that makes the program it starts die with this
    process (the request survives ``exec``); None where the platform has no such request.

    The kernel ties the request to the thread that starts the program: start it from a
    thread that lives as long as the process (the main thread)."""
    prctl, parent = _prctl(), os.getpid()
    if prctl is None:
        return None

    def request() -> None:   # runs in the child between fork and exec: libc calls only
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:   # we died before the request took effect
            os._exit(1)

    return request
