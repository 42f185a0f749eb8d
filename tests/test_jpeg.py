"""Reading a JPEG's size from its header, without decoding it."""

import struct

import pytest

from support.hostile_jpegs import claiming, encode, giant

from nac_drive.io.jpeg import jpeg_size


@pytest.mark.parametrize("h,w", [(160, 320), (1, 1), (37, 901)])
def test_size_of_encoded_jpegs(h, w):
    assert jpeg_size(encode(h, w)) == (h, w)
    assert jpeg_size(encode(h, w, progressive=True)) == (h, w)   # SOF2, after its own tables


def test_the_claimed_size_is_read_not_decoded():
    data = giant()
    assert len(data) < 1000 and jpeg_size(data) == (30000, 30000)


def test_fill_bytes_and_segments_before_the_frame_header():
    data = encode()
    comment = b"\xff\xfe" + struct.pack(">H", 2 + 5) + b"hello"
    padded = data[:2] + b"\xff\xff" + comment + data[2:]   # fill bytes before a marker are legal
    assert jpeg_size(padded) == (160, 320)


@pytest.mark.parametrize("data", [
    b"",
    b"\x89PNG\r\n\x1a\n" + bytes(40),
    b"GIF89a" + bytes(40),
    b"\xff\xd8",                               # nothing after the start marker
    b"\xff\xd8\xff\xe0\x00\x10JFIF",           # ends inside a segment, before the frame header
    b"\xff\xd8\xff\xda\x00\x08" + bytes(10),   # image data before any frame header
    b"\xff\xd8\x00\x00\x00\x00",               # no marker where one must be
    b"\xff\xd8\xff\xe0\x00\x01",               # a segment length below its own two bytes
    b"\xff\xd8\xff\xc0\x00\x11\x08\x00",       # frame header cut short
    claiming(encode(), 0, 320),                # a height left for a later DNL marker
    claiming(encode(), 160, 0),                # no width
])
def test_not_a_jpeg_or_cut_before_its_size_raises(data):
    with pytest.raises(ValueError, match="not a readable JPEG header"):
        jpeg_size(data)


def test_cut_after_the_frame_header_still_has_a_size():
    data = encode()
    assert jpeg_size(data[: data.index(b"\xff\xda")]) == (160, 320)
