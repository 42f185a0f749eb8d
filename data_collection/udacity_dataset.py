"""Ordered windows of consecutive Udacity frames for a temporal core (PilotNet + NAC).

A *segment* is a run of consecutive rows of one recording with no gap in the image time
stamps larger than ``max_gap`` seconds (the simulator's recording button starts and stops
runs; a gap means the car was moved). Windows never cross a segment, and train/validation
splits are made by segment, never by frame, so a validation window never has a
near-duplicate neighbour in the training set.

``UdacityWindowDataset[i]`` yields ``(frames [W, 3, 66, 200] float32 YUV in [0, 1],
timestamps [W] float32 seconds from the window's first frame, steering [W] float32)``.
Without augmentation, ``index[i]`` (segment, first row) with :meth:`~UdacityWindowDataset.frames_of`
and :meth:`~UdacityWindowDataset.labels` give the same parts (validation encodes each frame
once, however many windows hold it). With ``frame_drop`` the windows are cut from the frames a
drive under ``--perturb frame-drop`` would have shown the policy, as in
:class:`~nac_drive.data_collection.carracing_dataset.WindowDataset`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nac_drive.data_collection.udacity_augment import AugmentConfig, WindowAugmentation, to_chw_float
from nac_drive.policy.tasks import udacity_frame
from nac_drive.data_collection.udacity_log import DrivingLogRow, check_images, load_rgb, read_driving_log
from nac_drive.simulators.frame_drops import window_frames

DEFAULT_FPS = 15.0  # the simulator records at about 15 Hz; used when names carry no time


@dataclass
class Segment:
    """Consecutive rows of one recording (``source`` names the CSV, ``index`` its position)."""

    source: Path
    index: int
    rows: list[DrivingLogRow]

    @property
    def name(self) -> str:
        return f"{self.source}#{self.index}"


def _times(rows: list[DrivingLogRow]) -> np.ndarray:
    if all(r.timestamp is not None for r in rows):
        return np.array([r.timestamp for r in rows], dtype=np.float64)
    return np.arange(len(rows), dtype=np.float64) / DEFAULT_FPS


def _window_times(rows: list[DrivingLogRow]):
    """Seconds from a window's first frame: float32 tensor ``[W]``."""
    import torch

    t = _times(rows)
    return torch.from_numpy((t - t[0]).astype(np.float32))


def segments_from_log(path: str | os.PathLike, max_gap: float = 0.5) -> list[Segment]:
    """Split one driving_log.csv into segments at time gaps > max_gap s (or going back in time).
    Every image the log lists must exist, and belong to one row only (:func:`check_images`)."""
    rows = read_driving_log(path)
    check_images(rows, path)
    if not rows:
        return []
    t = _times(rows)
    cuts = [0] + [i for i in range(1, len(rows)) if not 0 < t[i] - t[i - 1] <= max_gap] + [len(rows)]
    return [Segment(Path(path), k, rows[a:b]) for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])) if b > a]


def split_segments(segments: list[Segment], val_fraction: float, seed: int) -> tuple[list[Segment], list[Segment]]:
    """Random split by segment: about ``val_fraction`` of the frames go to validation.

    With a single segment, it is cut in two contiguous halves at the split point (the
    boundary frames are the only neighbours across the split).
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if val_fraction == 0 or not segments:
        return list(segments), []
    if len(segments) == 1:
        seg = segments[0]
        cut = int(round(len(seg.rows) * (1 - val_fraction)))
        return [Segment(seg.source, seg.index, seg.rows[:cut])], [Segment(seg.source, seg.index, seg.rows[cut:])]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(segments))
    total = sum(len(s.rows) for s in segments)
    val, n_val = [], 0
    for i in order:
        if n_val >= val_fraction * total or len(val) == len(segments) - 1:
            break
        val.append(segments[i])
        n_val += len(segments[i].rows)
    val_ids = {id(s) for s in val}
    return [s for s in segments if id(s) not in val_ids], val


class UdacityWindowDataset:
    """Windows of ``window`` consecutive frames (step ``stride``) over segments.

    Args:
        segments: from ``segments_from_log`` / ``split_segments``.
        window: frames per item W.
        stride: step between window starts inside a segment.
        augment: apply one ``WindowAugmentation`` per item (training); off for validation.
        augment_config: probabilities/ranges of the augmentations.
        seed: base seed; item i uses ``default_rng((seed, epoch, i))`` so runs are reproducible.
        frame_drop: the share of each segment's frames dropped each epoch (the drop schedule
            of ``(seed, epoch, segment)``); the windows are cut from the frames left.
    """

    def __init__(self, segments: list[Segment], window: int = 16, stride: int = 1, augment: bool = False,
                 augment_config: AugmentConfig | None = None, seed: int = 0, frame_drop: float = 0.0):
        if window < 1 or stride < 1:
            raise ValueError(f"window and stride must be >= 1, got window={window}, stride={stride}")
        self.segments = segments
        self.window = window
        self.frame_drop = frame_drop
        self.augment = augment
        self.cfg = augment_config or AugmentConfig()
        self.seed = seed
        self.epoch = 0
        self.index: list[tuple[int, int]] = []
        for k, seg in enumerate(segments):
            self.index.extend((k, start) for start in range(0, len(seg.rows) - window + 1, stride))

    def set_epoch(self, epoch: int) -> None:
        """Change the augmentation draws and the dropped frames (call once per training epoch)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.index)

    def positions(self, i: int) -> np.ndarray:
        """Window ``i``'s rows in its segment ``[W]``: consecutive, or under ``frame_drop`` those left."""
        k, start = self.index[i]
        return window_frames(self.frame_drop, (self.seed, self.epoch, k), len(self.segments[k].rows), start,
                             self.window)

    def __getitem__(self, i: int):
        import torch

        k = self.index[i][0]
        if not self.augment:
            return (self.frames_of(k, self.positions(i)), *self.labels(i))
        rows = [self.segments[k].rows[p] for p in self.positions(i)]
        rng = np.random.default_rng((self.seed, self.epoch, i))
        aug = WindowAugmentation.draw(rng, self.cfg, all(r.left is not None and r.right is not None for r in rows))
        frames, steering = [], []
        for r in rows:
            img, s = aug.apply(load_rgb(getattr(r, aug.camera)), r.steering)
            frames.append(udacity_frame(img))
            steering.append(float(np.clip(s, -1.0, 1.0)))
        return (torch.from_numpy(to_chw_float(np.stack(frames))), _window_times(rows),
                torch.tensor(steering, dtype=torch.float32))

    def frames_of(self, k: int, positions):
        """The centre camera's frames at ``positions`` (row numbers) of segment ``k``, as
        recorded (no augmentation): float32 ``[n, 3, 66, 200]``."""
        import torch

        rows = self.segments[k].rows
        return torch.from_numpy(to_chw_float(np.stack([udacity_frame(load_rgb(rows[p].center)) for p in positions])))

    def labels(self, i: int):
        """Window ``i``'s timestamps ``[W]`` and steering ``[W]`` as recorded, without its frames."""
        import torch

        k = self.index[i][0]
        rows = [self.segments[k].rows[p] for p in self.positions(i)]
        return _window_times(rows), torch.tensor([float(np.clip(r.steering, -1.0, 1.0)) for r in rows],
                                                 dtype=torch.float32)
