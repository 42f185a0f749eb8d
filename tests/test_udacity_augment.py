"""Udacity preprocessing, augmentations and windowed dataset."""

import datetime as dt

import numpy as np
import pytest

from nac_drive.data_collection.udacity_augment import (
    AugmentConfig,
    WindowAugmentation,
    brightness,
    flip,
    shadow,
    side_camera_steering,
    to_chw_float,
    translate,
)
from nac_drive.policy.tasks import udacity_frame as preprocess
from nac_drive.data_collection.udacity_dataset import UdacityWindowDataset, segments_from_log, split_segments
from nac_drive.data_collection.udacity_log import DrivingLogWriter


def _ramp():
    """RGB [160, 320, 3]: red grows left to right, so flips and shifts are visible."""
    img = np.zeros((160, 320, 3), np.uint8)
    img[..., 0] = np.linspace(0, 255, 320).astype(np.uint8)[None, :]
    img[..., 1] = 80
    return img


def test_flip_mirrors_and_negates_steering():
    img = _ramp()
    out, s = flip(img, 0.3)
    assert s == -0.3
    assert np.array_equal(out[:, 0], img[:, -1]) and np.array_equal(out[:, -1], img[:, 0])


def test_side_cameras_add_and_subtract_correction():
    assert side_camera_steering(0.1, "left") == pytest.approx(0.3)
    assert side_camera_steering(0.1, "right") == pytest.approx(-0.1)
    assert side_camera_steering(0.1, "center") == 0.1
    with pytest.raises(ValueError, match="camera"):
        side_camera_steering(0.1, "top")


def test_translate_shifts_pixels_and_steering_by_0_002_per_pixel():
    img = _ramp()
    out, s = translate(img, 0.1, tx=20)
    assert s == pytest.approx(0.1 + 0.04)
    assert np.array_equal(out[:, 120], img[:, 100])  # content moved 20 px right
    out, s = translate(img, 0.0, tx=-30)
    assert s == pytest.approx(-0.06) and np.array_equal(out[:, 100], img[:, 130])


def test_shadow_darkens_one_side_only_and_brightness_scales():
    img = np.full((160, 320, 3), 200, np.uint8)
    out = shadow(img, 160, 160, side=0, darkness=0.5)
    assert out[80, 50].mean() < 120 and out[80, 250].mean() > 190
    assert brightness(img, 0.5).mean() == pytest.approx(100, abs=2)


def test_preprocess_crops_resizes_and_converts_to_yuv():
    img = np.zeros((160, 320, 3), np.uint8)
    img[60:135] = (255, 0, 0)  # pure red in the kept rows; the cropped rows stay black
    x = preprocess(img)
    assert x.shape == (66, 200, 3) and x.dtype == np.uint8
    # YUV of pure red (OpenCV): Y = 0.299 * 255 = 76, V (channel 2) well above 128, U below
    assert np.all(np.abs(x[..., 0].astype(int) - 76) <= 2)
    assert np.all(x[..., 2] > 180) and np.all(x[..., 1] < 115)
    chw = to_chw_float(x)
    assert chw.shape == (3, 66, 200) and chw.dtype == np.float32 and chw[0, 0, 0] == pytest.approx(x[0, 0, 0] / 255)
    img[:60] = 255  # sky and hood rows must not influence the input
    img[135:] = 255
    assert np.allclose(preprocess(img), x)
    with pytest.raises(ValueError, match="shape"):
        preprocess(np.zeros((50, 50), np.uint8))


def test_window_augmentation_is_identical_for_every_frame():
    rng = np.random.default_rng(3)
    cfg = AugmentConfig(flip_prob=1.0, shadow_prob=1.0)
    aug = WindowAugmentation.draw(rng, cfg, has_side_cameras=False)
    img = _ramp()
    a, sa = aug.apply(img, 0.1)
    b, sb = aug.apply(img.copy(), 0.1)
    assert np.array_equal(a, b) and sa == sb
    assert aug.flip and aug.camera == "center"
    assert sa == pytest.approx(-(0.1 + 0.002 * aug.tx))


def _recording(out, frames, start, gap_at=None, value=0):
    """Frames at 15 Hz; a 5 s gap before frame ``gap_at`` (a new segment)."""
    t = start
    with DrivingLogWriter(out) as w:
        for k in range(frames):
            if k == gap_at:
                t += dt.timedelta(seconds=5)
            img = np.full((160, 320, 3), (k * 7 + value) % 255, np.uint8)
            w.write(img, k / 100, 0.3, 0.0, 9.0, left=img, right=img, when=t)
            t += dt.timedelta(milliseconds=67)


def test_windows_follow_time_stamps_and_never_cross_segments(tmp_path):
    _recording(tmp_path / "a", 20, dt.datetime(2026, 1, 1, 12), gap_at=12)
    segs = segments_from_log(tmp_path / "a" / "driving_log.csv")
    assert [len(s.rows) for s in segs] == [12, 8]
    ds = UdacityWindowDataset(segs, window=4, stride=2)
    assert len(ds) == 5 + 3  # starts 0,2,..,8 in the first; 0,2,4 in the second
    frames, times, steer = ds[0]
    assert frames.shape == (4, 3, 66, 200) and frames.dtype.is_floating_point
    assert 0.0 <= float(frames.min()) and float(frames.max()) <= 1.0
    assert times.tolist() == pytest.approx([0.0, 0.067, 0.134, 0.201], abs=1e-4)
    assert steer.tolist() == pytest.approx([0.0, 0.01, 0.02, 0.03])
    last = ds[len(ds) - 1]
    assert last[2].tolist() == pytest.approx([0.16, 0.17, 0.18, 0.19])  # rows 16..19, inside segment 2
    # frames differ over time (they are real consecutive images, not copies)
    assert not np.allclose(frames[0].numpy(), frames[1].numpy())


def test_augmented_windows_are_reproducible_and_labels_follow_the_augmentation(tmp_path):
    _recording(tmp_path / "a", 8, dt.datetime(2026, 1, 1, 12))
    segs = segments_from_log(tmp_path / "a" / "driving_log.csv")
    cfg = AugmentConfig(side_camera_prob=0.0, flip_prob=1.0, translate_x=0.0, translate_y=0.0, shadow_prob=0.0)
    ds = UdacityWindowDataset(segs, window=3, augment=True, augment_config=cfg, seed=5)
    _, _, steer = ds[1]
    assert steer.tolist() == pytest.approx([-0.01, -0.02, -0.03])  # flipped: negated
    a, b = ds[2], ds[2]
    assert np.array_equal(a[0].numpy(), b[0].numpy())


def test_split_is_by_segment_never_by_frame(tmp_path):
    for k in range(4):
        _recording(tmp_path / f"r{k}", 10, dt.datetime(2026, 1, 1, 12 + k), value=k)
    segs = [s for k in range(4) for s in segments_from_log(tmp_path / f"r{k}" / "driving_log.csv")]
    train, val = split_segments(segs, 0.25, seed=0)
    assert len(train) + len(val) == 4 and len(val) == 1
    train_files = {r.center for s in train for r in s.rows}
    assert not train_files & {r.center for s in val for r in s.rows}
    assert split_segments(segs, 0.25, seed=0)[1][0].name == val[0].name  # seeded
