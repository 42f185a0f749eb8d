"""Browser-playable video: VP8 in WebM, encoded by libvpx in its realtime mode through PyAV
(``ENCODER_OPTIONS``: 0.6 ms of CPU a 192x192 frame on the 2-core test machine, against 2.2 ms
for the encoder inside the cv2 wheel, whose speed cannot be set, at a smaller file and error).

    with WebmWriter("drive.webm", fps=50, scale=2) as video:
        video.write(rgb)                    # uint8 RGB [H, W, 3], upscaled 2x (nearest), encoded in a thread
    info = read_webm_info("drive.webm")     # codec, size, fps and frame count, from the container

:func:`read_webm_info` reads the Matroska (EBML) structure itself and decodes nothing,
so a file from elsewhere (the dashboard embeds ``RUN_DIR/video.webm``) never reaches a
video decoder in this process; every size it reads is checked against the file.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from nac_drive.io.capped_read import read_capped

SUFFIX = ".webm"
MAX_SIDE = 4096     # as for JPEG frames: a larger claimed picture is refused
MAX_WEBM_BYTES = 2**30   # read_webm_info's cap unless told another
ENCODER_OPTIONS = {"deadline": "realtime", "cpu-used": "8", "crf": "10", "b": "2M"}   # libvpx: fast, near-lossless
QUEUE_FRAMES = 64   # frames waiting for the encoder thread at most (27 KB each at 96x96)
MAX_DEPTH = 8       # EBML nesting read (Segment > Cluster > BlockGroup > Block is 4)

# Matroska element ids (with their length marker bits, as they appear in the file)
EBML, DOC_TYPE = 0x1A45DFA3, 0x4282
SEGMENT, TRACKS, TRACK_ENTRY, TRACK_NUMBER, TRACK_TYPE, CODEC_ID = 0x18538067, 0x1654AE6B, 0xAE, 0xD7, 0x83, 0x86
DEFAULT_DURATION, VIDEO, PIXEL_WIDTH, PIXEL_HEIGHT = 0x23E383, 0xE0, 0xB0, 0xBA
CLUSTER, SIMPLE_BLOCK, BLOCK_GROUP, BLOCK = 0x1F43B675, 0xA3, 0xA0, 0xA1
MASTERS = {SEGMENT, TRACKS, TRACK_ENTRY, VIDEO, CLUSTER, BLOCK_GROUP}
VIDEO_TRACK = 1


def check_video_path(path: str | os.PathLike) -> Path:
    """The path a video will be written to: it must end in ``.webm`` (the container browsers
    play VP8 in)."""
    path = Path(path)
    if path.suffix.lower() != SUFFIX:
        raise ValueError(f"video: {path}: videos are written as WebM (VP8), name the file *{SUFFIX}")
    return path


class WebmWriter:
    """A VP8 WebM writer for uint8 RGB frames ``[H, W, 3]``, opened at the first frame (which
    fixes the size); each frame is upscaled ``scale`` times (nearest neighbour).

    Frames are encoded in a thread of their own (PyAV lets go of the GIL while it encodes,
    so a second core takes the encoder off the caller's loop); at most ``QUEUE_FRAMES`` wait
    for it, so a slow encoder slows :meth:`write` rather than filling memory. An error in the
    encoder thread is raised in the caller by the next :meth:`write` or by :meth:`close`,
    which waits for every frame written to be encoded. ``options``: libvpx settings over
    ``ENCODER_OPTIONS`` (the dashboard's frame stream trades quality for size with ``crf``)."""

    def __init__(self, path: str | os.PathLike, fps: float, scale: int = 1, options: dict[str, str] | None = None):
        self.path = check_video_path(path)
        self.fps, self.scale = fps, scale
        self.options = {**ENCODER_OPTIONS, **(options or {})}   # libvpx's, over ENCODER_OPTIONS
        self.frames = 0            # frames written so far
        self._shape = None         # [H, W, 3] of the first frame, which every frame must have
        self._writer = None
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_FRAMES)
        self._thread = None
        self._error: BaseException | None = None   # the encoder thread's, until raised here
        self._failed = False                       # the encoder thread skips what is left

    def write(self, rgb: np.ndarray) -> None:
        """Queue one frame (copied: the caller may reuse its array)."""
        self._raise_encoder_error()
        rgb = np.asarray(rgb)
        if self._shape is None:
            if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
                raise ValueError(f"video: {self.path}: frames are uint8 RGB [H, W, 3], got {rgb.dtype} "
                                 f"{list(rgb.shape)}")
            self._open(*rgb.shape[:2])
            self._shape = rgb.shape
        elif rgb.shape != self._shape or rgb.dtype != np.uint8:
            raise ValueError(f"video: {self.path}: frame {self.frames} is {rgb.dtype} {list(rgb.shape)}, "
                             f"the video's frames are uint8 {list(self._shape)}")
        self._queue.put(rgb.copy())
        self.frames += 1

    def close(self) -> None:
        """Encode what is queued, finish the file and stop the encoder thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._raise_encoder_error()

    def _open(self, height: int, width: int) -> None:
        import av

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = av.open(str(self.path), "w", format="webm")
        self._stream = self._writer.add_stream("libvpx", rate=Fraction(self.fps).limit_denominator(1001),
                                               options=self.options)
        self._stream.width, self._stream.height = width * self.scale, height * self.scale
        self._stream.pix_fmt = "yuv420p"
        self._stream.codec_context.thread_count = 1   # the encoder thread is the one core it takes
        self._thread = threading.Thread(target=self._encode_queued, name="webm-writer", daemon=True)
        self._thread.start()

    def _encode_queued(self) -> None:
        """The encoder thread: encode queued frames in order until ``None``, then flush."""
        while (rgb := self._queue.get()) is not None:
            if self._failed:
                continue                       # drained, so that write() and close() never wait on a full queue
            try:
                self._encode(rgb)
            except BaseException as e:         # raised in the caller's thread
                self._error, self._failed = e, True
        if not self._failed:
            try:
                self._encode(None)
            except BaseException as e:
                self._error = e

    def _encode(self, rgb: np.ndarray | None) -> None:
        """Encode one frame ``[H, W, 3]`` upscaled ``scale`` times (``None``: flush the encoder)."""
        import av
        import cv2

        frame = None
        if rgb is not None:
            if self.scale != 1:
                rgb = cv2.resize(rgb, None, fx=self.scale, fy=self.scale, interpolation=cv2.INTER_NEAREST)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        for packet in self._stream.encode(frame):
            self._writer.mux(packet)

    def _raise_encoder_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def __enter__(self) -> "WebmWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class WebmInfo:
    codec: str          # Matroska codec id of the video track, e.g. "V_VP8"
    width: int
    height: int
    fps: float | None   # from the track's DefaultDuration, if the file gives it
    frames: int         # frames of the video track (blocks, lacing counted)


def read_webm_info(path: str | os.PathLike, max_bytes: int | None = None) -> WebmInfo:
    """The video track of a WebM file, read from its EBML structure (nothing is decoded).

    Raises ``ValueError`` naming the file if it is not a WebM with one video track, a size
    runs past its parent or the file, or the picture is larger than ``MAX_SIDE``; a file over
    ``max_bytes`` (default :data:`MAX_WEBM_BYTES`), a FIFO or a device is refused
    (:func:`~nac_drive.io.capped_read.read_capped`).
    """
    return webm_info(read_capped(path, MAX_WEBM_BYTES if max_bytes is None else max_bytes), path)


def webm_info(data: bytes, source: str | os.PathLike = "video") -> WebmInfo:
    """:func:`read_webm_info` of a WebM already read (``source`` names it in errors)."""
    try:
        return _parse(data)
    except ValueError as e:
        raise ValueError(f"{source}: not a readable WebM video ({e})") from None


def _vint(data: bytes, pos: int, end: int, keep_marker: bool) -> tuple[int, int, bool]:
    """An EBML variable-length integer at ``pos`` -> (value, next position, all value bits set)."""
    if pos >= end:
        raise ValueError(f"truncated at byte {pos}")
    first = data[pos]
    length = 9 - first.bit_length() if first else 9
    if length > 8 or pos + length > end:
        raise ValueError(f"bad length field at byte {pos}")
    value = first if keep_marker else first & (0xFF >> length)
    for b in data[pos + 1:pos + length]:
        value = (value << 8) | b
    unknown = not keep_marker and value == (1 << (7 * length)) - 1
    return value, pos + length, unknown


def _elements(data: bytes, pos: int, end: int):
    """(id, payload start, payload end) of each element in ``data[pos:end]``; an element of
    unknown size (live-written Segment or Cluster) runs to ``end``."""
    while pos < end:
        element, pos, _ = _vint(data, pos, end, keep_marker=True)
        size, pos, unknown = _vint(data, pos, end, keep_marker=False)
        stop = end if unknown else pos + size
        if stop > end:
            raise ValueError(f"element 0x{element:X} at byte {pos} claims {size} bytes past its parent")
        yield element, pos, stop
        pos = stop


def _uint(data: bytes, pos: int, end: int) -> int:
    if end - pos > 8:
        raise ValueError(f"integer of {end - pos} bytes at byte {pos}")
    return int.from_bytes(data[pos:end], "big")


def _parse(data: bytes) -> WebmInfo:
    top = list(_elements(data, 0, len(data)))
    if not top or top[0][0] != EBML:
        raise ValueError("no EBML header")
    doc = [data[s:e] for i, s, e in _elements(data, top[0][1], top[0][2]) if i == DOC_TYPE]
    if doc != [b"webm"]:
        raise ValueError(f"document type {doc[0][:16] if doc else None!r}, not webm")
    tracks: dict[int, dict] = {}
    frames: dict[int, int] = {}

    def walk(pos: int, end: int, depth: int, track: dict | None) -> None:
        if depth > MAX_DEPTH:
            raise ValueError("elements nested too deep")
        for element, start, stop in _elements(data, pos, end):
            if element == TRACK_ENTRY:
                entry: dict = {}
                walk(start, stop, depth + 1, entry)
                tracks[entry.get("number", -1)] = entry
            elif element in MASTERS:
                walk(start, stop, depth + 1, track)
            elif element in (SIMPLE_BLOCK, BLOCK):
                number, at, _ = _vint(data, start, stop, keep_marker=False)
                if at + 3 > stop:
                    raise ValueError(f"block at byte {start} is truncated")
                lacing = (data[at + 2] >> 1) & 3
                count = 1 if lacing == 0 else (data[at + 3] + 1 if at + 3 < stop else 0)
                frames[number] = frames.get(number, 0) + count
            elif track is not None:
                key = {TRACK_NUMBER: "number", TRACK_TYPE: "type", DEFAULT_DURATION: "duration",
                       PIXEL_WIDTH: "width", PIXEL_HEIGHT: "height"}.get(element)
                if key:
                    track[key] = _uint(data, start, stop)
                elif element == CODEC_ID:
                    track["codec"] = data[start:stop].decode("ascii", "replace")

    segments = [(s, e) for i, s, e in top if i == SEGMENT]
    if len(segments) != 1:
        raise ValueError(f"{len(segments)} segments, expected 1")
    walk(*segments[0], 1, None)
    video = [t for t in tracks.values() if t.get("type") == VIDEO_TRACK]
    if len(video) != 1:
        raise ValueError(f"{len(video)} video tracks, expected 1")
    track = video[0]
    width, height = track.get("width", 0), track.get("height", 0)
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ValueError(f"picture {width}x{height}, expected 1..{MAX_SIDE} a side")
    duration = track.get("duration")
    return WebmInfo(codec=track.get("codec", "")[:32], width=width, height=height,
                    fps=1e9 / duration if duration else None, frames=frames.get(track.get("number"), 0))
