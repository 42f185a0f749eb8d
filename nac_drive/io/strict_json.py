"""JSON written strict: numpy values as Python numbers, NaN and infinities as ``null``, so any
JSON reader (``jq``, a browser, another language) takes what the package writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np


def jsonable(value):
    """``value`` with numpy scalars and arrays as Python numbers and lists, NaN and inf as None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def dumps(value, indent: int | None = None) -> str:
    """``value`` as strict JSON text (:func:`jsonable` first)."""
    return json.dumps(jsonable(value), indent=indent, allow_nan=False)


def write_report(path: Path, report: dict) -> Path:
    """Write ``report`` (explain.json, compare.json) as strict JSON to ``path`` atomically."""
    from nac_drive.io.atomic import atomic_write

    text = dumps(report, indent=1) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path
