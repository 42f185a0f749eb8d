"""Reads a Rerun recording back through Rerun's own API (rerun-sdk 0.41's ``rerun.chunk``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np


def read_recording(path: str | Path) -> dict[str, dict[str, dict[int, object]]]:
    """``{entity path: {column: {step: value}}}`` of every temporal chunk in ``path``.

    Columns are the component columns (``"Scalars:scalars"``, ``"EncodedImage:blob"``, ...)
    and the other timelines (``"episode"``, ``"episode_step"``); scalar lists become float64
    arrays."""
    from rerun.chunk import RrdReader

    out: dict[str, dict[str, dict[int, object]]] = defaultdict(lambda: defaultdict(dict))
    for chunk in RrdReader(str(path)).stream():
        if chunk.is_static:
            continue
        batch = chunk.to_record_batch()
        names = batch.schema.names
        if "step" not in names:
            continue
        steps = batch.column("step").to_numpy()
        for name in names:
            if name in ("step", "log_time", "log_tick") or name.startswith("rerun."):
                continue
            column = batch.column(name)
            values = column.to_numpy() if name in ("episode", "episode_step") else column.to_pylist()
            for step, value in zip(steps, values):
                if isinstance(value, list) and name == "Scalars:scalars":
                    value = np.asarray(value, dtype=np.float64)
                out[chunk.entity_path.lstrip("/")][name][int(step)] = value
    return out


def series(recording, entity: str, steps: int, width: int | None = None) -> np.ndarray:
    """The ``Scalars`` of ``entity`` as ``[steps, width]`` float64, NaN where a step has none."""
    rows = recording.get(entity, {}).get("Scalars:scalars", {})
    width = width or max((len(v) for v in rows.values()), default=0)
    out = np.full((steps, width), np.nan)
    for step, value in rows.items():
        out[step, :len(value)] = value
    return out
