"""A bridge (or `nac-drive drive udacity`) in its own process, for the benchmarks that drive
the headless emulator against it."""

from __future__ import annotations

import os
import socket
import subprocess
import time

from support_path import SUPPORT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_listening(argv: list[str], port: int, stdout=subprocess.PIPE, timeout: float = 120) -> subprocess.Popen:
    """Start ``argv`` (one torch thread, unbuffered, the test policies of ``tests/support``
    importable) and return once it accepts connections on 127.0.0.1:``port``; exits with its
    stderr if it dies or does not listen in time."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(SUPPORT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise SystemExit(f"{' '.join(argv[:5])} did not start:\n{proc.stderr.read()}")
            time.sleep(0.1)
