"""Append-only folders of run archives: a long recording written one chunk at a time.

A chunked archive is a folder of ``chunk-000000.npz``, ``chunk-000001.npz``, ... Each chunk
is an ordinary run archive (:mod:`nac_drive.interpret.archive`), written once, atomically
(:func:`~nac_drive.interpret.archive.write_archive`: a temporary ``.chunk-*.tmp`` file, then
a rename), and never rewritten. So a writer's cost per chunk does not grow with the run, and
a kill at any moment leaves every chunk written before it whole: the chunk being written is
at most a hidden ``.tmp`` file, which readers ignore. Readers take the chunks in order and
refuse a gap (a chunk missing before the last).

Identity: :func:`chunks_sha256`, the SHA-256 of the chunks' own SHA-256 digests (32 bytes
each) concatenated in chunk order. It changes when any chunk changes or a chunk is added.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from nac_drive.interpret.archive import ArchiveError

CHUNK = re.compile(r"chunk-(\d{6,})\.npz")


def chunk_path(folder: str | Path, index: int) -> Path:
    """The path of chunk ``index`` (from 0) in ``folder``."""
    return Path(folder) / f"chunk-{index:06d}.npz"


def chunk_indices(folder: str | Path) -> list[int]:
    """The indices of the chunks in ``folder``, sorted, gaps included (anything else ignored)."""
    found = (CHUNK.fullmatch(p.name) for p in Path(folder).iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def chunk_paths(folder: str | Path) -> list[Path]:
    """The chunks of ``folder`` in order; an :class:`ArchiveError` in one line when it is no
    folder, holds no chunk, or a chunk is missing before the last (indices run 0, 1, ...)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ArchiveError(folder, None, "no such folder")
    indices = chunk_indices(folder)
    if not indices:
        raise ArchiveError(folder, None, "holds no chunk-*.npz (the run stopped before its first chunk was written)")
    missing = sorted(set(range(indices[-1] + 1)) - set(indices))
    if missing:
        raise ArchiveError(folder, None, f"{chunk_path(folder, missing[0]).name} is missing ({len(missing)} of "
                                         f"chunks 0-{indices[-1]} are): the trace is incomplete, record the run again")
    return [chunk_path(folder, i) for i in indices]


def chunks_sha256(digests: list[str]) -> str:
    """Hex SHA-256 of the chunks' hex SHA-256 ``digests``, taken as 32 bytes each, in order."""
    return hashlib.sha256(b"".join(bytes.fromhex(d) for d in digests)).hexdigest()
