"""Atomic writes of files and folders (a reader, or a process killed mid-write, never sees
half of one), and fresh run folders that never reuse an existing one."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
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
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        raise _disk_full(path.parent, e) or e


def check_writable(path: str | Path) -> Path:
    """Refuse, before any work, a file :func:`atomic_write` could not write at the end: its
    folder not writable (read-only, no permission; a temporary file is made and removed, since
    permission bits do not bind root) or ``path`` a folder. OSError naming it, in one line."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: is a folder; the output is a file of that name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as e:
        raise OSError(e.errno, f"{path.parent}: cannot write there ({e.strerror}); nothing was computed") from None
    return path


FULL_DISK_BYTES = 2**20   # less free than this after a failed write: the disk filled


def _disk_full(folder: Path, error: BaseException) -> OSError | None:
    """A one-line ``OSError`` (ENOSPC) for a write that failed because the disk of ``folder`` is
    full, whatever the writing library raised (safetensors and h5py raise their own errors); None
    when the disk is not full, the error already says so (ENOSPC) or was no error (an interrupt)."""
    if not isinstance(error, Exception) or (isinstance(error, OSError) and error.errno == errno.ENOSPC):
        return None   # no error, or one that says so already
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free >= FULL_DISK_BYTES:
        return None
    return OSError(errno.ENOSPC, f"{folder}: the disk is full ({free} bytes free); the write failed and "
                                 "what was there before is whole: free some space and run it again")


def fsync_dir(path: str | Path) -> None:
    """Make the entries of folder ``path`` (new names, renames) durable."""
    if os.name == "nt":   # Windows cannot open a folder as a file; NTFS journals its entries itself
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _aside(path: Path, kind: str) -> Path:
    """The hidden sibling ``.<name>.<kind>`` that :func:`atomic_write_dir` writes or parks a folder in."""
    return path.with_name(f".{path.name}.{kind}")


def recover_dir(path: str | Path) -> Path:
    """Undo what a kill in the middle of :func:`atomic_write_dir` left behind; returns ``path``.

    Killed after the previous folder was moved aside and before the new one took its
    name: the previous one comes back. Killed earlier: the unfinished new folder is
    removed. Killed later: the parked previous folder is removed. Only the writer calls
    this (a reader could pull a folder away from a writer at work); readers use
    :func:`readable_dir`.
    """
    path = Path(path)
    new, old = _aside(path, "new"), _aside(path, "old")
    if old.is_dir() and not path.exists():
        os.rename(old, path)
    for leftover in (new, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    return path


def readable_dir(path: str | Path) -> Path:
    """The folder to read for ``path``: ``path`` itself, or, when a kill (or a writer at
    work) has just parked the previous folder aside, that whole previous folder. Never
    the unfinished new one."""
    path = Path(path)
    old = _aside(path, "old")
    return old if not path.exists() and old.is_dir() else path


def atomic_write_dir(path: str | Path, write) -> Path:
    """Call ``write(tmp_dir)`` to fill a new folder, then put it in place of folder ``path``:
    a reader (or a kill at any moment) finds either the previous folder or the new one,
    both whole, never a mixture.

    The folder is written as the hidden sibling ``.<name>.new``; the previous one is
    renamed to ``.<name>.old``, the new one to ``<name>``, then the old one is removed.
    :func:`recover_dir`, which runs first here and in checkpoint loaders, repairs a kill
    between two of these steps.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(path)
    new, old = _aside(path, "new"), _aside(path, "old")
    new.mkdir()
    try:
        write(new)
        fsync_dir(new)
    except BaseException as e:
        shutil.rmtree(new, ignore_errors=True)
        raise _disk_full(path.parent, e) or e
    if path.exists():
        os.rename(path, old)
    os.rename(new, path)
    fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)
    return path


def fresh_dir(path: str | Path) -> Path:
    """Create a new, empty run folder at ``path``, or, if that name is taken, at the first
    free ``<path>-2``, ``<path>-3``, ...; returns the folder created. Creation is atomic
    (``mkdir``), so two runs started at once never share a folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


@contextlib.contextmanager
def one_writer(folder: str | Path, what: str):
    """Hold ``folder``'s writer lock for the block, so two processes never write one run at
    once. Another holder: ``ValueError`` naming ``what`` and its pid (``folder/.writer.pid``).
    The lock (filelock's on ``folder/.writer.lock``: ``flock`` on POSIX, ``msvcrt.locking`` on
    Windows) goes with the process however it ends; both files, on a clean exit."""
    from filelock import FileLock, Timeout

    folder = Path(folder)
    lock, holder = FileLock(folder / ".writer.lock"), folder / ".writer.pid"
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            with open(holder, "rb") as f:
                pid = f.read(32).decode(errors="replace").strip() or "?"
        except OSError:   # it has not written it yet
            pid = "?"
        raise ValueError(f"{folder}: another {what} (pid {pid}) is writing it; wait for it to end") from None
    try:
        holder.write_text(str(os.getpid()))
        yield
        holder.unlink(missing_ok=True)
        with contextlib.suppress(OSError):   # Windows refuses while it is held; its release removes it
            Path(lock.lock_file).unlink()
    finally:
        lock.release()
