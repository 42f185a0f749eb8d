"""Reading a file whose size is capped: a regular file only, and never more than the cap.

``Path.stat().st_size`` says nothing of a FIFO or a device (``/dev/zero`` has size 0 and no
end: a size check passes and the read never ends), and a file can grow between a check and
the read. So the file is opened without blocking, its type is checked on the open
descriptor, and the read itself stops one byte past the cap.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# Without it, opening a FIFO would block; Windows has no such flag (nor FIFOs among its files).
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class FileRefused(ValueError):
    """The file is missing, is not a regular file, or is larger than allowed."""


def read_capped(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them; otherwise
    :class:`FileRefused` naming the file and why."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK)
    except FileNotFoundError:
        raise FileRefused(f"{path}: missing") from None
    try:   # checked on the bare descriptor: os.fdopen of a folder's raises "Is a directory: <fd>"
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            mode = st.st_mode
            kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
            raise FileRefused(f"{path}: not a regular file ({kind})")
        if st.st_size > max_bytes:
            raise FileRefused(f"{path}: {st.st_size} bytes, more than the {max_bytes} allowed")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileRefused(f"{path}: grew past the {max_bytes} bytes allowed while it was read")
    return data
