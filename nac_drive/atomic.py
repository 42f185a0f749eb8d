"""Atomic file writes: a reader, or a process killed mid-write, never sees half a file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(tmp_path)``, then move the finished file over ``path`` in one step:
    a reader (or a kill) never sees half a file. The file gets the usual permissions."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:        # on disk before it takes the final name
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())   # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
