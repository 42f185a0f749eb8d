"""JSON read with its nesting bounded: every JSON reader of the package parses through :func:`loads`.

``json.loads`` recurses once per level, so a 100,000-deep ``[[[...`` (a few hundred kB, well
under any size cap) ends in ``RecursionError`` wherever it is read. :func:`loads` counts the
depth first, on the brackets outside strings, and refuses a text deeper than
:data:`MAX_DEPTH` with a one-line ``ValueError`` before ``json`` sees it.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64   # the package's own files nest at most ~6 levels
# A string (its brackets do not count), a run of anything else but brackets, or a stray quote.
_NOT_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[^][{}"]+|"')
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def depth(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (0: a scalar)."""
    return max(accumulate(map(_STEP.__getitem__, _NOT_BRACKETS.sub("", text))), default=0)


def within_depth(text: str, max_depth: int = MAX_DEPTH) -> bool:
    """Whether JSON ``text`` nests at most ``max_depth`` deep. Fast where it matters: a text with
    no more opening brackets than that cannot nest deeper (a telemetry of 60 kB: ~10 us, where
    :func:`depth` takes ~0.9 ms)."""
    return text.count("[") + text.count("{") <= max_depth or depth(text) <= max_depth


def loads(text: str | bytes | bytearray, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``, refused with a ``ValueError`` when it nests deeper than ``max_depth``
    (bytes are UTF-8: a ``UnicodeDecodeError``, also a ``ValueError``, otherwise)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    if not within_depth(text, max_depth):
        raise ValueError(f"JSON nested deeper than {max_depth} levels")
    return json.loads(text)
