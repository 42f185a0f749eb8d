"""Where a saliency map puts its mass: the share on the road ahead of the car, a measurable
proxy for the paper's Fig. 6 claim (the NAC's saliency keeps to the road up to the horizon,
other cores' does not). It reads maps only, so every core's maps are measured alike.

The road ahead of a CarRacing frame (96 x 96 RGB, :func:`road_ahead_mask`) is taken from the
frame's own pixels, not from a fixed band: the road is grey (gymnasium draws it (102, 102,
102), each tile up to 5 lighter), the grass green ((102, 204, 102) and (102, 230, 102)), so a
pixel is road when its channels lie within :data:`ROAD_MAX_SPREAD` of each other and its mean
within :data:`ROAD_BRIGHTNESS` (the HUD's black bar, the white kerbs and the red car are
not). "Ahead" is the rows above the car's nose (:data:`CAR_TOP_ROW`): CarRacing draws the
car at a fixed place, rows 66-77 around column 48, and the HUD from row 84; the road behind
the car is left out. The limits leave room for the JPEG noise of a recorded trace (about +-10
a channel). Under ``--perturb`` colour changes the rule no longer finds the road.

:func:`road_share` is the map's mass on a mask over its whole mass; a uniform map's share is
the mask's pixel share, the chance level a map must beat. :func:`road_share_rows` and
:func:`markdown_table` compare the ``saliency.road_share`` of several ``explain.json``
reports (``benchmarks/saliency_road_share.py`` prints it for files).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

CAR_TOP_ROW = 66               # CarRacing's car spans rows 66-77 of the 96-row frame: rows above are ahead
ROAD_MAX_SPREAD = 24           # max - min of a road pixel's RGB channels (grey; grass: G - R ~ 100)
ROAD_BRIGHTNESS = (60, 180)    # the mean channel of a road pixel (the HUD is black, the kerbs white)
ROAD_RULE = (f"CarRacing road ahead: pixels whose RGB channels lie within {ROAD_MAX_SPREAD} of each other with a "
             f"mean in [{ROAD_BRIGHTNESS[0]}, {ROAD_BRIGHTNESS[1]}] (grey road, not green grass, black HUD or white "
             f"kerb), in the rows above the car (rows 0-{CAR_TOP_ROW - 1} of 96)")
UNIFORM_ROW = "uniform map (road pixels)"   # the table's chance-level row


def road_mask(frames: np.ndarray) -> np.ndarray:
    """Road pixels of RGB ``frames`` ``[..., H, W, 3]`` (uint8) by colour -> bool ``[..., H, W]``."""
    frames = np.asarray(frames)
    if frames.ndim < 3 or frames.shape[-1] != 3:
        raise ValueError(f"frames: expected RGB [..., H, W, 3], got shape {list(frames.shape)}")
    pixels = frames.astype(np.int16)
    spread = pixels.max(axis=-1) - pixels.min(axis=-1)
    brightness = pixels.mean(axis=-1)
    return (spread <= ROAD_MAX_SPREAD) & (brightness >= ROAD_BRIGHTNESS[0]) & (brightness <= ROAD_BRIGHTNESS[1])


def road_ahead_mask(frames: np.ndarray) -> np.ndarray:
    """The road ahead of the car in CarRacing ``frames`` ``[..., 96, 96, 3]`` (uint8): the
    road pixels (:func:`road_mask`) in the rows above the car -> bool ``[..., 96, 96]``."""
    mask = road_mask(frames)
    mask[..., CAR_TOP_ROW:, :] = False
    return mask


def road_share(maps: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """The share of each map's mass on its mask: ``maps`` ``[N, H, W]`` (non-negative, e.g.
    saliency in [0, 1]) and ``masks`` ``[N, H, W]`` (bool) -> ``[N]`` float64 in [0, 1], NaN
    where a map has no mass."""
    maps, masks = np.asarray(maps, dtype=np.float64), np.asarray(masks, dtype=bool)
    if maps.shape != masks.shape or maps.ndim != 3:
        raise ValueError(f"maps, masks: expected the same shape [N, H, W], got {list(maps.shape)} and "
                         f"{list(masks.shape)}")
    if (maps < 0).any():
        raise ValueError("maps: a share of mass needs non-negative maps")
    total = maps.sum(axis=(1, 2))
    on_mask = (maps * masks).sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, on_mask / total, np.nan)


def road_share_rows(reports: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows comparing cores from ``explain.json`` reports (label, e.g. the file, -> report):
    per report, per method of ``saliency.road_share``, ``{label, core, method, mean, ci95,
    frames}``, then the uniform map's row (the road's pixel share, the chance level). A report
    without a road share (no saliency section, a Udacity policy) gives no rows."""
    rows = []
    for label, report in reports.items():
        saliency = report.get("saliency") or {}
        shares = saliency.get("road_share") or {}
        measured = [*shares.items()] + ([(UNIFORM_ROW, saliency["road_pixel_share"])]
                                        if shares and saliency.get("road_pixel_share") else [])
        for method, summary in measured:
            rows.append({"label": label, "core": report.get("core", "nac"), "method": method,
                         "mean": summary.get("mean"), "ci95": summary.get("ci95") or [None, None],
                         "frames": summary.get("frames")})
    return rows


def markdown_table(rows: list[Mapping[str, Any]]) -> str:
    """:func:`road_share_rows` as a markdown table: report, core, method, road share [95% CI], frames."""
    def number(x) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = ["| report | core | method | road share [95% CI] | frames |", "|---|---|---|---|---|"]
    for row in rows:
        low, high = row["ci95"]
        lines.append(f"| {row['label']} | {row['core']} | {row['method']} | {number(row['mean'])} "
                     f"[{number(low)}, {number(high)}] | {row['frames'] if row['frames'] is not None else '-'} |")
    return "\n".join(lines)
