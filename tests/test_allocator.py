"""The allocator keeps a training step's large buffers in the heap instead of a fresh mmap each."""

import os
import subprocess
import sys

import pytest

# Where a 64 MB tensor (larger than any mmap threshold glibc picks itself) lives: in the heap
# (the brk segment, "[heap]" in /proc/self/maps) or a mapping of its own.
_WHERE = """
import sys
import torch
from nac_drive.allocator import keep_large_buffers
kept = keep_large_buffers() if sys.argv[1] == "keep" else False
buffer = torch.ones(16 * 2**20)
address = buffer.data_ptr()
for line in open("/proc/self/maps"):
    span, *_, name = line.split(maxsplit=5)
    lo, hi = (int(x, 16) for x in span.split("-"))
    if lo <= address < hi:
        print(kept, name.strip() == "[heap]")
"""


def _where(how: str, **env) -> tuple[bool, bool]:
    kept, in_heap = subprocess.run([sys.executable, "-c", _WHERE, how], capture_output=True, text=True, check=True,
                                   env={**os.environ, **env}).stdout.split()
    return kept == "True", in_heap == "True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_large_buffers_come_from_the_heap():
    assert _where("keep") == (True, True)
    assert _where("plain") == (False, False)                                # glibc's own rule: an mmap
    assert _where("keep", NAC_DRIVE_KEEP_BUFFERS="0") == (False, False)    # turned off
