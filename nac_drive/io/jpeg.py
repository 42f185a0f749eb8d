"""The size a JPEG claims, read from its frame header without decoding it.

A decoder allocates what the header claims before it looks at the data: a few hundred
bytes claiming 30000 x 30000 pixels cost libjpeg ~15 s and ~5 GB. Callers that take
JPEGs from outside check :func:`jpeg_size` first and decode only what they expect.
"""

from __future__ import annotations

# SOF0..SOF15 carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but are not frames
_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# markers without a length field: TEM and the restart markers RST0..RST7
_STANDALONE_MARKERS = frozenset([0x01, *range(0xD0, 0xD8)])
_START_OF_SCAN, _END_OF_IMAGE = 0xDA, 0xD9


def jpeg_size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` from the first frame header (SOFn) of a JPEG file.

    Walks the marker segments from the start of the file up to the frame header, so the
    cost is one step per segment, never the image's size. Raises ``ValueError`` when
    ``data`` is not a JPEG or ends (or reaches its image data) before a frame header.
    A height of 0 means the file defines it later (a DNL marker), which decoders rarely
    support; callers comparing with an expected size refuse it like any other.
    """
    data = bytes(data)
    if not data.startswith(b"\xff\xd8"):
        raise ValueError("not a JPEG (no start-of-image marker)")
    i = 2
    while True:
        if i >= len(data) or data[i] != 0xFF:
            raise ValueError(f"not a JPEG (no marker at byte {i})")
        while i < len(data) and data[i] == 0xFF:  # a marker may be preceded by fill bytes
            i += 1
        if i >= len(data):
            raise ValueError("the JPEG ends before its frame header")
        marker = data[i]
        i += 1
        if marker in _STANDALONE_MARKERS:
            continue
        if marker in (_START_OF_SCAN, _END_OF_IMAGE):
            raise ValueError("the JPEG has no frame header before its image data")
        if i + 2 > len(data):
            raise ValueError("the JPEG ends before its frame header")
        length = int.from_bytes(data[i:i + 2], "big")  # counts its own two bytes
        if length < 2:
            raise ValueError(f"not a JPEG (segment length {length} at byte {i})")
        if marker in _FRAME_MARKERS:
            if length < 8 or i + 7 > len(data):
                raise ValueError("the JPEG's frame header is cut short")
            # segment: length (2), sample precision (1), height (2), width (2), components ...
            return int.from_bytes(data[i + 3:i + 5], "big"), int.from_bytes(data[i + 5:i + 7], "big")
        i += length
