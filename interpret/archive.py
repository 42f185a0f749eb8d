"""Run archives: ``.npz`` files with a JSON metadata member, written atomically.

A run archive is an ordinary NumPy ``.npz`` (a ZIP of ``.npy`` members, deflate
compressed, as ``np.savez_compressed`` writes it) with one extra member,
``metadata.json`` (UTF-8 JSON). Anything that reads ZIP and ``.npy`` reads it:
``np.load(path, allow_pickle=False)`` returns the arrays by name and
``metadata.json`` as raw bytes. No member is ever a pickled object array.

Writes go to a temporary file in the same directory, are flushed to disk, and then
``os.replace`` the target: a process killed mid-write leaves the previous file (or
none) intact, never half a file. Reads check every member and raise
:class:`ArchiveError` naming the file and the field that is wrong; sizes first: an
array's header must describe exactly the bytes its member declares, and all members
together may inflate to at most :data:`ARCHIVE_LIMIT` bytes, so nothing is allocated
for a size a crafted file merely claims. A reader also gives the SHA-256 of the file it
read (:attr:`ArchiveReader.sha256`); a trace's chunks' digests name the trace a saliency file
was computed from (:func:`~nac_drive.interpret.chunks.chunks_sha256`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from nac_drive.io import bounded_json
from nac_drive.io.atomic import atomic_write
from nac_drive.io.jpeg import jpeg_size
from nac_drive.io.untrusted_zip import ZipMemberError, open_zip, read_member

METADATA_MEMBER = "metadata.json"
METADATA_LIMIT = 16 * 2**20
ARCHIVE_LIMIT = 8 * 2**30   # all members of one archive, inflated (a long run's trace is a few hundred MB)


class ArchiveError(ValueError):
    """A run archive is missing, unreadable or does not match its schema."""

    def __init__(self, path: str | os.PathLike, field: str | None, why: str):
        self.path, self.field = Path(path), field
        where = f"{path}: field {field!r}" if field else f"{path}"
        super().__init__(f"{where}: {why}")


def write_archive(path: str | os.PathLike, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> Path:
    """Atomically write ``arrays`` and ``metadata`` to ``path`` (an ``.npz``)."""
    path = Path(path)
    text = json.dumps(metadata, indent=1, sort_keys=True, allow_nan=False)
    for name, array in arrays.items():
        if np.asarray(array).dtype.hasobject:
            raise TypeError(f"{name}: object arrays are not allowed in a run archive")

    def write(tmp: str) -> None:
        with zipfile.ZipFile(tmp, mode="w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as zf:
            for name, array in arrays.items():
                with zf.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
            zf.writestr(METADATA_MEMBER, text)

    atomic_write(path, write)
    return path


class ArchiveReader:
    """Checked access to the members of one archive.

    ``reader.array(name, dtype_kind, ndim)`` returns a member after checking its
    dtype kind ("f", "i", "u", "b") and number of dimensions; ``reader.metadata``
    is the parsed JSON; ``reader.sha256`` the hex digest of the file read, ``reader.inflated``
    the bytes all its members inflate to. Every
    failure is an :class:`ArchiveError` naming the field.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise ArchiveError(self.path, None, "no such file")
        # One open file for the digest and the members: a writer replacing the file
        # meanwhile (os.replace) cannot make them disagree.
        self._file = open(self.path, "rb")
        try:
            self.sha256 = _sha256(self._file)
            try:
                self._zip = open_zip(self._file, self.path)
            except ZipMemberError as e:
                raise ArchiveError(self.path, None, f"not a readable .npz archive ({e})") from None
            self.inflated = total = sum(info.file_size for info in self._zip.infolist())
            if total > ARCHIVE_LIMIT:
                raise ArchiveError(self.path, None, f"its members would inflate to {total} bytes, more than the "
                                                    f"{ARCHIVE_LIMIT} allowed")
            self.files = [n[:-len(".npy")] if n.endswith(".npy") else n for n in self._zip.namelist()]
            self.metadata = self._read_metadata()
        except BaseException:
            self.close()
            raise

    def _read_metadata(self) -> dict[str, Any]:
        raw = self._member(METADATA_MEMBER)
        if not isinstance(raw, bytes):
            raise ArchiveError(self.path, METADATA_MEMBER, "expected a JSON text member, found an array")
        try:
            meta = bounded_json.loads(raw)
        except ValueError as e:   # json.JSONDecodeError and UnicodeDecodeError among them
            raise ArchiveError(self.path, METADATA_MEMBER, f"invalid JSON ({e})") from e
        if not isinstance(meta, dict):
            raise ArchiveError(self.path, METADATA_MEMBER, "expected a JSON object")
        return meta

    def _member(self, name: str):
        """An ``.npy`` member as an array, any other member as bytes."""
        if name not in self.files:
            raise ArchiveError(self.path, name, "missing")
        member = f"{name}.npy" if f"{name}.npy" in self._zip.namelist() else name
        try:
            if member == name:
                return read_member(self._zip, member, METADATA_LIMIT)
            self._check_array_size(member)
            with self._zip.open(member) as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        except ArchiveError:
            raise
        except Exception as e:  # bad CRC, truncated member, pickled object array, bad header
            raise ArchiveError(self.path, name, f"unreadable ({type(e).__name__}: {e})") from e

    def _check_array_size(self, member: str) -> None:
        """The ``.npy`` header's shape and dtype must account for exactly the bytes the
        member declares (so a small member cannot ask for a huge array)."""
        declared = self._zip.getinfo(member).file_size
        with self._zip.open(member) as f:
            version = np.lib.format.read_magic(f)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f".npy format version {version} is not supported")
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                else np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(f)
            if dtype.hasobject:
                raise ArchiveError(self.path, member[:-len(".npy")], "object arrays (pickles) are not allowed")
            data_bytes = math.prod(shape) * dtype.itemsize
            if f.tell() + data_bytes != declared:
                raise ArchiveError(self.path, member[:-len(".npy")],
                                   f"its header asks for {list(shape)} x {dtype} ({data_bytes} bytes), the member "
                                   f"holds {declared - f.tell()}")

    def has(self, name: str) -> bool:
        return name in self.files

    def array(self, name: str, kinds: str, ndim: int) -> np.ndarray:
        value = self._member(name)
        if not isinstance(value, np.ndarray):
            raise ArchiveError(self.path, name, "expected an array member")
        if value.dtype.kind not in kinds:
            raise ArchiveError(self.path, name, f"dtype {value.dtype} is not one of the kinds {kinds!r}")
        if value.ndim != ndim:
            raise ArchiveError(self.path, name, f"expected {ndim} dimensions, got shape {list(value.shape)}")
        return value

    def require(self, ok: bool, field: str, why: str) -> None:
        if not ok:
            raise ArchiveError(self.path, field, why)

    def require_trace(self, trace, num_steps: int, remedy: str) -> None:
        """The file was computed from ``trace`` (a loaded RunTrace: the SHA-256 its metadata's
        ``trace_sha256`` names, and as many steps); ``remedy`` says how to make a new one."""
        recorded = self.metadata.get("trace_sha256")
        self.require(recorded == trace.sha256, METADATA_MEMBER,
                     f"computed from another trace (sha256 {str(recorded)[:12]}..., {trace.path} is "
                     f"{trace.sha256[:12]}...): {remedy}" if recorded else
                     f"names no trace it was computed from (an older file): {remedy}")
        self.require(num_steps == trace.num_steps, METADATA_MEMBER,
                     f"num_steps is {num_steps} but the run's trace has {trace.num_steps} steps: {remedy}")

    def header(self, fmt: str, version: int) -> int:
        """Check the metadata's format and version; returns its ``num_steps``."""
        meta = self.metadata
        self.require(meta.get("format") == fmt, METADATA_MEMBER, f"format is {meta.get('format')!r}, not {fmt!r}")
        self.require(meta.get("version") == version, METADATA_MEMBER,
                     f"version {meta.get('version')!r} is not supported (this reader reads {version})")
        n = meta.get("num_steps")
        self.require(isinstance(n, int) and n >= 0, METADATA_MEMBER, f"num_steps must be an integer >= 0, got {n!r}")
        return n

    def close(self) -> None:
        if getattr(self, "_zip", None) is not None:
            self._zip.close()
        self._file.close()

    def __enter__(self) -> "ArchiveReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _sha256(f) -> str:
    digest = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    f.seek(0)
    return digest.hexdigest()


def pack_jpegs(images: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """JPEG byte strings -> (concatenated bytes uint8 ``[total]``, offsets int64 ``[N+1]``)."""
    offsets = np.zeros(len(images) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in images])
    data = np.frombuffer(b"".join(images), dtype=np.uint8).copy()
    return data, offsets


def check_jpeg_pack(reader: ArchiveReader, data_field: str, offsets_field: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Read and validate a (bytes, offsets) pair written by :func:`pack_jpegs`."""
    data = reader.array(data_field, "u", 1)
    offsets = reader.array(offsets_field, "i", 1)
    reader.require(data.dtype == np.uint8, data_field, f"expected uint8, got {data.dtype}")
    reader.require(len(offsets) == count + 1, offsets_field, f"expected {count + 1} offsets, got {len(offsets)}")
    reader.require(count == 0 or (offsets[0] == 0 and offsets[-1] == len(data)), offsets_field,
                   f"offsets must run from 0 to len({data_field})={len(data)}")
    reader.require(bool(np.all(np.diff(offsets) > 0)), offsets_field, "offsets must be strictly increasing")
    return data, offsets


def encode_jpeg(rgb: np.ndarray, quality: int) -> bytes:
    """uint8 RGB ``[H, W, 3]`` -> JPEG bytes."""
    import cv2

    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise ValueError("frame: JPEG encoding failed")
    return buf.tobytes()


MAX_FRAME_PIXELS = 4096 * 4096   # a run's frames are camera-sized; a header may claim anything


def decode_jpeg(data: bytes | np.ndarray) -> np.ndarray:
    """JPEG bytes -> uint8 RGB ``[H, W, 3]``. The size the header claims is checked
    before decoding (:func:`~nac_drive.io.jpeg.jpeg_size`): at most :data:`MAX_FRAME_PIXELS`."""
    import cv2

    height, width = jpeg_size(bytes(data))
    if not 0 < height * width <= MAX_FRAME_PIXELS:
        raise ValueError(f"a JPEG claiming {width}x{height} pixels (at most {MAX_FRAME_PIXELS} are decoded)")
    bgr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError("not a decodable JPEG")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
