"""Augmentations of Udacity frames (PilotNet input).

The frames are preprocessed by :func:`nac_drive.policy.tasks.udacity_frame`, the one function
that turns a simulator frame into network input for the training data and for live
driving alike: crop rows 60:-25 (sky and the car's hood), resize to 66x200, RGB -> YUV,
uint8 ``[66, 200, 3]``; the dataset then moves channels first and scales by 1/255
(``to_chw_float``), the policy's encoder does the same on uint8 input.

Augmentations (all take/return uint8 RGB [H, W, 3] and a steering value, positive =
right; each takes a ``numpy.random.Generator`` so results are reproducible):

- side cameras: the left camera sees the road as if the car had drifted left, so its
  label is steering + 0.2 (steer back right); the right camera's is steering - 0.2;
- horizontal flip with the steering negated;
- translation by (tx, ty) pixels with steering + 0.002 * tx;
- a random shadow polygon and a random brightness change (labels unchanged).

For a window of consecutive frames the same random draw must be applied to every frame
(a flip or a shift that changes from frame to frame would be a fake motion):
``WindowAugmentation`` draws the parameters once and applies them to each frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIDE_CAMERA_CORRECTION = 0.2
STEER_PER_PIXEL = 0.002


def to_chw_float(frames: np.ndarray) -> np.ndarray:
    """uint8 [..., H, W, 3] -> float32 [..., 3, H, W] in [0, 1]."""
    return np.moveaxis(np.asarray(frames), -1, -3).astype(np.float32) / 255.0


def side_camera_steering(steering: float, camera: str, correction: float = SIDE_CAMERA_CORRECTION) -> float:
    """Label for a frame from ``camera`` ('center', 'left' or 'right')."""
    offsets = {"center": 0.0, "left": correction, "right": -correction}
    if camera not in offsets:
        raise ValueError(f"camera must be one of {sorted(offsets)}, got {camera!r}")
    return steering + offsets[camera]


def flip(image: np.ndarray, steering: float) -> tuple[np.ndarray, float]:
    """Mirror left-right; the steering changes sign."""
    return np.ascontiguousarray(image[:, ::-1]), -steering


def translate(image: np.ndarray, steering: float, tx: float, ty: float = 0.0) -> tuple[np.ndarray, float]:
    """Shift by tx (right) and ty (down) pixels; steering + 0.002 per pixel of tx."""
    import cv2

    h, w = image.shape[:2]
    m = np.float32([[1, 0, tx], [0, 1, ty]])
    out = cv2.warpAffine(image, m, (w, h), borderMode=cv2.BORDER_REPLICATE)
    return out, steering + STEER_PER_PIXEL * tx


def shadow(image: np.ndarray, x_top: float, x_bottom: float, side: int, darkness: float) -> np.ndarray:
    """Darken (V *= darkness) the part of the image on one ``side`` (0 left, 1 right) of the
    line from (x_top, 0) to (x_bottom, H)."""
    import cv2

    h, w = image.shape[:2]
    ys, xs = np.mgrid[0:h, 0:w]
    line_x = x_top + (x_bottom - x_top) * ys / max(h - 1, 1)
    mask = xs < line_x if side == 0 else xs >= line_x
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)
    v = hsv[..., 2].astype(np.float32)
    v[mask] *= darkness
    hsv[..., 2] = np.clip(v, 0, 255).astype(np.uint8)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
    """Scale the HSV value channel by ``factor``."""
    import cv2

    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)
    hsv[..., 2] = np.clip(hsv[..., 2].astype(np.float32) * factor, 0, 255).astype(np.uint8)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


@dataclass
class AugmentConfig:
    """Probabilities and ranges of the standard augmentations."""

    side_camera_prob: float = 0.5  # probability to use the left or right camera (when recorded)
    flip_prob: float = 0.5
    translate_x: float = 50.0  # |tx| <= this many pixels (at 320 px width)
    translate_y: float = 5.0
    shadow_prob: float = 0.3
    brightness_range: tuple[float, float] = (0.6, 1.3)


@dataclass
class WindowAugmentation:
    """One random draw of every augmentation, applied identically to each frame of a window."""

    camera: str
    flip: bool
    tx: float
    ty: float
    shadow: tuple[float, float, int, float] | None
    brightness: float

    @classmethod
    def draw(cls, rng: np.random.Generator, cfg: AugmentConfig, has_side_cameras: bool,
             width: int = 320) -> "WindowAugmentation":
        camera = "center"
        if has_side_cameras and rng.random() < cfg.side_camera_prob:
            camera = "left" if rng.random() < 0.5 else "right"
        shade = None
        if rng.random() < cfg.shadow_prob:
            shade = (rng.uniform(0, width), rng.uniform(0, width), int(rng.integers(2)), rng.uniform(0.4, 0.8))
        return cls(
            camera=camera,
            flip=bool(rng.random() < cfg.flip_prob),
            tx=float(rng.uniform(-cfg.translate_x, cfg.translate_x)),
            ty=float(rng.uniform(-cfg.translate_y, cfg.translate_y)),
            shadow=shade,
            brightness=float(rng.uniform(*cfg.brightness_range)),
        )

    def apply(self, image: np.ndarray, steering: float) -> tuple[np.ndarray, float]:
        """``image`` must already be the frame of ``self.camera``; ``steering`` the centre label."""
        steering = side_camera_steering(steering, self.camera)
        image, steering = translate(image, steering, self.tx, self.ty)
        if self.shadow is not None:
            image = shadow(image, *self.shadow)
        image = brightness(image, self.brightness)
        if self.flip:
            image, steering = flip(image, steering)
        return image, steering
