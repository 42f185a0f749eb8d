"""Hand-written Udacity policies (no learning) for tests, benchmarks and smoke runs.

They are actors (:mod:`nac_drive.policy.actor`): ``reset()`` and ``act(obs) -> float`` steering in
[-1, 1] (positive = right), ``obs = {"image": uint8 RGB [160, 320, 3], "timestamp": s,
"speed": mph}``.
"""

from __future__ import annotations

import math

import numpy as np


class ConstantPolicy:
    """Always the same steering (0 by default): the cheapest possible policy."""

    def __init__(self, steering: float = 0.0):
        self.steering = steering
        self.calls = 0

    def reset(self) -> None:
        self.calls = 0

    def act(self, obs) -> float:
        self.calls += 1
        return self.steering


class LaneMarkingPolicy:
    """Steers toward the middle of the road seen in a band of image rows ahead of the car.

    Per row, road pixels (asphalt and painted lines: neither green grass nor brown verge)
    form a run; its midpoint is the road centre at that distance. The steering is
    proportional to the bearing of the median centre column (a pure-pursuit-like look-ahead
    point). Tuned for the emulator's chase camera (focal 150 px, 320x160).
    """

    def __init__(self, rows: tuple[int, int] = (70, 88), gain: float = 3.0, focal: float = 150.0):
        self.rows = rows
        self.gain = gain
        self.focal = focal
        self.last = 0.0

    def reset(self) -> None:
        self.last = 0.0

    def road_centre(self, image: np.ndarray) -> float | None:
        """Median column of the road's middle over the row band, or None if no road is seen."""
        band = image[self.rows[0]:self.rows[1]].astype(np.int16)
        r, g, b = band[..., 0], band[..., 1], band[..., 2]
        road = (g - r < 15) & (r - b < 20)  # not grass (green), not verge (brown)
        centres = []
        for row in road:
            cols = np.flatnonzero(row)
            if cols.size < 8:
                continue
            # the widest contiguous run is the road
            breaks = np.flatnonzero(np.diff(cols) > 3)
            starts = np.concatenate([[0], breaks + 1])
            ends = np.concatenate([breaks, [cols.size - 1]])
            k = int(np.argmax(cols[ends] - cols[starts]))
            centres.append((cols[starts[k]] + cols[ends[k]]) / 2)
        return float(np.median(centres)) if centres else None

    def act(self, obs) -> float:
        image = obs["image"]
        centre = self.road_centre(image)
        if centre is None:
            return self.last
        bearing = math.atan((centre - image.shape[1] / 2) / self.focal)  # positive = road to the right
        self.last = float(np.clip(self.gain * bearing, -1.0, 1.0))
        return self.last
