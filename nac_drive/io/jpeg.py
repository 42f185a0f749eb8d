"""The size a JPEG claims, read from its frame header without decoding it.

A decoder allocates what the header claims before it looks at the data: a few hundred
bytes claiming 30000 x 30000 pixels cost libjpeg ~15 s and ~5 GB. Callers that take
JPEGs from outside check :func:`jpeg_size` first and decode only what they expect.
"""

from __future__ import annotations

import io


def jpeg_size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` from the frame header (SOFn) of a JPEG file, read by Pillow's JPEG
    reader, which walks the marker segments up to the image data and decodes nothing.

    Raises ``ValueError`` when ``data`` is not a JPEG, ends before its frame header or claims
    a side of 0. Pillow's own cap on pixels (``Image.MAX_IMAGE_PIXELS``, for ``Image.open``)
    is not applied: the claimed size is returned, and callers compare it with what they take.
    """
    from PIL import JpegImagePlugin

    try:
        with JpegImagePlugin.JpegImageFile(io.BytesIO(bytes(data))) as image:
            width, height = image.size
    except (OSError, SyntaxError) as e:   # Pillow's errors for a file it cannot identify or that ends early
        raise ValueError(f"not a readable JPEG header ({e})") from None
    return height, width
