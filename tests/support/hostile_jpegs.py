"""JPEGs whose headers lie: for the tests of the code that takes JPEGs from outside."""

from __future__ import annotations

import struct

import cv2
import numpy as np


def encode(h: int = 160, w: int = 320, progressive: bool = False) -> bytes:
    flags = [cv2.IMWRITE_JPEG_PROGRESSIVE, 1] if progressive else []
    return cv2.imencode(".jpg", np.full((h, w, 3), 90, np.uint8), flags)[1].tobytes()


def claiming(data: bytes, height: int, width: int) -> bytes:
    """``data`` with the size in its baseline frame header (SOF0) replaced."""
    i = data.index(b"\xff\xc0")
    return data[:i + 5] + struct.pack(">HH", height, width) + data[i + 9:]


def giant() -> bytes:
    """~630 bytes claiming 30000 x 30000 pixels (libjpeg: ~15 s and ~5 GB to decode)."""
    return claiming(encode(8, 8), 30000, 30000)


def rotated(h: int = 160, w: int = 320) -> bytes:
    """An h x w JPEG whose EXIF orientation (6: rotate 90) makes decoders return w x h."""
    tiff = (b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1)
            + struct.pack(">HHIHH", 0x0112, 3, 1, 6, 0) + struct.pack(">I", 0))
    app1 = b"\xff\xe1" + struct.pack(">H", 2 + 6 + len(tiff)) + b"Exif\x00\x00" + tiff
    data = encode(h, w)
    return data[:2] + app1 + data[2:]
