"""Reading members of ZIP files that may be hostile (expert zips, run archives).

A small ZIP can declare a member that inflates to gigabytes. Every member is checked
against a size limit, first by the size the ZIP's directory declares, then by what
inflating it actually gives (Python's ``zipfile`` stops at the declared size and checks
the CRC), so nothing larger than the limit is ever held in memory.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import IO


class ZipMemberError(ValueError):
    """A ZIP file, or one of its members, is missing, unreadable or too large."""


def open_zip(source: str | Path | IO[bytes], name: str | Path | None = None) -> zipfile.ZipFile:
    """Open a ZIP for reading; ``name`` (default ``source``) is what errors call it."""
    name = name if name is not None else source
    try:
        return zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ZipMemberError(f"{name}: not a readable ZIP file ({exc})") from None


def member_size(zf: zipfile.ZipFile, member: str, limit: int) -> int:
    """The declared (inflated) size of ``member``, refused above ``limit`` bytes."""
    try:
        info = zf.getinfo(member)
    except KeyError:
        raise ZipMemberError(f"{zf.filename}: no member {member!r}") from None
    if info.file_size > limit:
        raise ZipMemberError(f"{zf.filename}: member {member!r} would inflate to {info.file_size} bytes, "
                             f"more than the {limit} allowed")
    return info.file_size


def read_member(zf: zipfile.ZipFile, member: str, limit: int) -> bytes:
    """The bytes of ``member``, at most ``limit`` of them (see the module docstring)."""
    member_size(zf, member, limit)
    try:
        with zf.open(member) as f:
            data = f.read(limit + 1)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as exc:
        raise ZipMemberError(f"{zf.filename}: member {member!r} is unreadable ({type(exc).__name__}: {exc})") \
            from None
    if len(data) > limit:
        raise ZipMemberError(f"{zf.filename}: member {member!r} inflates to more than the {limit} bytes allowed")
    return data
