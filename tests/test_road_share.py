"""The share of saliency on the road ahead (a proxy for the paper's Fig. 6 claim): the road
found by colour, the share of known maps, and the table comparing cores."""

import numpy as np
import pytest

from nac_drive.interpret.road_share import (CAR_TOP_ROW, UNIFORM_ROW, markdown_table, road_ahead_mask, road_mask,
                                            road_share, road_share_rows)

ROAD, GRASS, LIGHT_GRASS, HUD, KERB, CAR = (102, 102, 102), (102, 204, 102), (102, 230, 102), (0, 0, 0), \
    (255, 255, 255), (204, 0, 0)


def track_frame(seed: int = 0) -> np.ndarray:
    """A 96 x 96 CarRacing-like frame: grass, a vertical road of columns 40-55 with JPEG-like
    noise, the car on it, a black HUD from row 84."""
    frame = np.empty((96, 96, 3), dtype=np.int16)
    frame[:] = GRASS
    frame[::7] = LIGHT_GRASS
    frame[:, 40:56] = ROAD
    frame[:, 40:56] += np.arange(16)[None, :, None] % 3 * 2          # tiles up to 5 lighter
    frame[66:78, 46:50] = CAR
    frame[30:34, 38:40] = KERB
    frame[84:] = HUD
    frame += np.random.default_rng(seed).integers(-8, 9, frame.shape)   # what a JPEG trace leaves
    return np.clip(frame, 0, 255).astype(np.uint8)


def test_the_road_is_found_by_colour_and_ahead_is_above_the_car():
    frame = track_frame()
    road = road_mask(frame)
    assert road[:84, 40:56][~np.isin(np.arange(84), range(66, 78))].all()   # the road, wherever the car is not
    assert not road[:84, :38].any() and not road[:84, 58:].any()            # grass of both shades
    assert not road[84:].any() and not road[30:34, 38:40].any()             # the HUD, the kerb
    assert not road[66:78, 46:50].any()                                      # the car
    ahead = road_ahead_mask(frame)
    assert ahead[:CAR_TOP_ROW].sum() == road[:CAR_TOP_ROW].sum() and not ahead[CAR_TOP_ROW:].any()
    np.testing.assert_array_equal(road_ahead_mask(np.stack([frame, frame])), np.stack([ahead, ahead]))
    with pytest.raises(ValueError, match="RGB"):
        road_mask(frame[..., 0])


def test_a_map_on_the_road_has_share_one_on_grass_zero_and_uniform_the_roads_pixel_share():
    ahead = road_ahead_mask(track_frame())
    on_road = ahead.astype(np.float32) * 0.7
    on_grass = (~road_mask(track_frame())).astype(np.float32)
    uniform = np.full(ahead.shape, 0.3, dtype=np.float32)
    empty = np.zeros(ahead.shape, dtype=np.float32)
    shares = road_share(np.stack([on_road, on_grass, uniform, empty]), np.stack([ahead] * 4))
    assert shares[0] == pytest.approx(1.0) and shares[1] == 0.0
    assert shares[2] == pytest.approx(ahead.mean()) and 0 < shares[2] < 1
    assert np.isnan(shares[3])                                   # no mass: no share
    with pytest.raises(ValueError, match="same shape"):
        road_share(on_road[None], ahead[None, :10])
    with pytest.raises(ValueError, match="non-negative"):
        road_share(-on_road[None], ahead[None])


def test_the_table_compares_cores_with_the_uniform_maps_row_and_skips_reports_without_a_share():
    def summary(mean, low, high, frames=40):
        return {"mean": mean, "ci95": [low, high], "frames": frames, "blocks": 4}

    reports = {"runs/nac": {"core": "nac", "saliency": {"road_share": {"gradcam": summary(0.61, 0.55, 0.66)},
                                                        "road_pixel_share": summary(0.21, 0.2, 0.22)}},
               "runs/gru": {"core": "gru", "saliency": {"road_share": {"gradcam": summary(0.3, None, None, 1)},
                                                        "road_pixel_share": summary(0.2, 0.19, 0.21)}},
               "runs/udacity": {"core": "nac", "saliency": {"road_share": None}},
               "runs/none": {"core": "lstm", "saliency": None}}
    rows = road_share_rows(reports)
    assert [(r["label"], r["core"], r["method"]) for r in rows] == [
        ("runs/nac", "nac", "gradcam"), ("runs/nac", "nac", UNIFORM_ROW),
        ("runs/gru", "gru", "gradcam"), ("runs/gru", "gru", UNIFORM_ROW)]
    table = markdown_table(rows).splitlines()
    assert table[0] == "| report | core | method | road share [95% CI] | frames |"
    assert table[2] == "| runs/nac | nac | gradcam | 0.610 [0.550, 0.660] | 40 |"
    assert table[4] == "| runs/gru | gru | gradcam | 0.300 [-, -] | 1 |" and len(table) == 2 + len(rows)
