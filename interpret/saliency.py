"""Grad-CAM saliency of a driving policy, through pytorch-grad-cam.

The caller hands in an ordinary image model, ``frame_model: nn.Module`` mapping
frames ``[B, C, H, W]`` to the policy head's output ``[B, A]`` with the temporal
context held fixed (the policy builds that wrapper). Saliency is computed on one
convolution layer of it: by default the last ``nn.Conv2d``.

Targets (``target=``), one scalar per sample:

* an ``int``: that discrete action's output (classification, e.g. CarRacing), through
  pytorch-grad-cam's own ``ClassifierOutputTarget``;
* ``"predicted"``: the action the model itself picks (argmax of the output);
* ``"steer+"`` / ``"steer-"``: ``+output[steer_index]`` / ``-output[steer_index]``,
  evidence for steering right / left (regression, e.g. Udacity): :class:`SteeringTarget`,
  as pytorch-grad-cam has no signed target of one output among several (its
  ``BinaryClassifierOutputTarget`` negates the whole output, so serves one-output models only);
* ``"steer"``: the direction the model actually steers (sign of its output).

:func:`overlay` is not pytorch-grad-cam's ``show_cam_on_image``: that one divides the
blend by its brightest pixel, so a frame's brightness changes with its map (by up to 58
of 255 levels for a map with no evidence), truncates instead of rounding, takes float
frames only and a map already at the frame's size.

Test-time augmentation (pytorch-grad-cam's ``aug_smooth``) is never used: it
mirrors the image, and a mirrored road reverses the steering meaning.

``RUN_DIR/saliency.npz`` (an archive as in :mod:`nac_drive.interpret.archive`), version 1:
``maps`` uint8 ``[N, h, w]`` (saliency x 255 at the model-input size),
``overlay_jpeg`` uint8 ``[bytes]`` + ``overlay_offsets`` int64 ``[N+1]`` (the frame
with the map blended in, frame size, JPEG), and ``metadata.json`` with ``format``
("nac-drive-saliency"), ``version``, ``num_steps``, ``method``, ``target``,
``target_layer`` and ``trace_sha256``, the identity of the trace it was computed from
(:attr:`~nac_drive.interpret.trace.RunTrace.sha256`, over the trace's chunks):
:func:`load_saliency` given the run's trace refuses a saliency file of another trace (e.g.
one left in the folder by an earlier run, or computed before the run wrote more chunks).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from nac_drive.interpret.archive import (ArchiveReader, check_jpeg_pack, decode_jpeg, encode_jpeg,
                                         pack_jpegs, write_archive)
from nac_drive.interpret.trace import RunTrace, load_trace

SALIENCY_FILE = "saliency.npz"
FORMAT, VERSION = "nac-drive-saliency", 1
STEER_TARGETS = ("steer+", "steer-", "steer")


def _methods() -> dict[str, type]:
    from pytorch_grad_cam import EigenCAM, GradCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM

    return {"gradcam": GradCAM, "gradcam++": GradCAMPlusPlus, "eigencam": EigenCAM, "hirescam": HiResCAM,
            "xgradcam": XGradCAM, "layercam": LayerCAM}


METHODS = ("gradcam", "gradcam++", "eigencam", "hirescam", "xgradcam", "layercam")


class SteeringTarget:
    """Scalar target ``direction * output[index]`` of one sample's output ``[A]``."""

    def __init__(self, direction: int, index: int = 0):
        if direction not in (1, -1):
            raise ValueError(f"direction: must be +1 or -1, got {direction!r}")
        self.direction, self.index = direction, index

    def __call__(self, output: torch.Tensor) -> torch.Tensor:
        return self.direction * output.reshape(-1)[self.index]


def last_conv2d(model: nn.Module) -> nn.Conv2d:
    """The last ``nn.Conv2d`` registered in ``model`` (the usual Grad-CAM layer)."""
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    if not convs:
        raise ValueError(f"target_layer: {type(model).__name__} has no nn.Conv2d; name a layer explicitly")
    return convs[-1]


def resolve_layer(model: nn.Module, target_layer: nn.Module | str | None) -> nn.Module:
    """``None`` -> last Conv2d; a dotted name (``"encoder.conv3"``) -> that submodule."""
    if target_layer is None:
        return last_conv2d(model)
    if isinstance(target_layer, str):
        try:
            return model.get_submodule(target_layer)
        except AttributeError as e:
            raise ValueError(f"target_layer: {target_layer!r} is not a submodule of {type(model).__name__}") from e
    return target_layer


def _targets(target, outputs: torch.Tensor, steer_index: int) -> list:
    """One scalar target per sample. outputs ``[B, A]`` (or ``[B]`` for the steering targets)."""
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    flat = outputs.reshape(outputs.shape[0], -1)
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        if not 0 <= target < flat.shape[1]:
            raise ValueError(f"target: action {target} is out of range for {flat.shape[1]} outputs")
        return [ClassifierOutputTarget(int(target))] * len(flat)
    if target == "predicted":
        return [ClassifierOutputTarget(a) for a in flat.argmax(dim=1).tolist()]
    if target in STEER_TARGETS:
        if not 0 <= steer_index < flat.shape[1]:
            raise ValueError(f"steer_index: {steer_index} is out of range for {flat.shape[1]} outputs")
        if target == "steer":
            return [SteeringTarget(1 if s >= 0 else -1, steer_index) for s in flat[:, steer_index].tolist()]
        return [SteeringTarget(1 if target == "steer+" else -1, steer_index)] * len(flat)
    raise ValueError(f"target: expected an action index, 'predicted', 'steer+', 'steer-' or 'steer', got {target!r}")


def saliency_maps(frame_model: nn.Module, frames: torch.Tensor, target: int | str = "predicted",
                  method: str = "gradcam", target_layer: nn.Module | str | None = None,
                  steer_index: int = 0) -> np.ndarray:
    """Saliency of ``frames [B, C, H, W]`` -> maps ``[B, H, W]`` float32 in [0, 1].

    Each map is scaled to [0, 1] on its own (a map with no evidence is all 0). The
    model runs in eval mode; each submodule's train/eval mode is restored afterwards.
    """
    classes = _methods()
    if method not in classes:
        raise ValueError(f"method: must be one of {METHODS}, got {method!r}")
    if not isinstance(frames, torch.Tensor) or frames.ndim != 4:
        raise ValueError(f"frames: expected a tensor [B, C, H, W], got {getattr(frames, 'shape', type(frames))}")
    layer = resolve_layer(frame_model, target_layer)
    # Restore every submodule's own mode afterwards: a fresh wrapper is in train mode
    # while the policy inside it is in eval mode, and must stay so (dropout).
    modes = [(m, m.training) for m in frame_model.modules()]
    frame_model.eval()
    try:
        with torch.no_grad():
            outputs = frame_model(frames)
        targets = _targets(target, outputs, steer_index)
        cam = classes[method](model=frame_model, target_layers=[layer])
        try:
            with torch.enable_grad():
                maps = cam(input_tensor=frames, targets=targets, aug_smooth=False, eigen_smooth=False)
        finally:
            cam.activations_and_grads.release()
    finally:
        frame_model.zero_grad(set_to_none=True)
        for module, training in modes:
            module.training = training
    return np.clip(np.nan_to_num(maps.astype(np.float32)), 0.0, 1.0)


def steering_saliency(frame_model: nn.Module, frames: torch.Tensor, method: str = "gradcam",
                      target_layer: nn.Module | str | None = None, steer_index: int = 0):
    """(maps for steering right ``+output``, maps for steering left ``-output``), each ``[B, H, W]``."""
    return tuple(saliency_maps(frame_model, frames, t, method, target_layer, steer_index)
                 for t in ("steer+", "steer-"))


def overlay(frame: np.ndarray, saliency: np.ndarray, alpha: float = 0.45, colormap: int | None = None) -> np.ndarray:
    """Blend a map ``[h, w]`` in [0, 1] (resized to the frame) over a uint8 RGB frame ``[H, W, 3]``."""
    import cv2

    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"frame: expected a uint8 RGB array [H, W, 3], got {frame.dtype} {list(frame.shape)}")
    if saliency.ndim != 2:
        raise ValueError(f"saliency: expected a map [h, w], got shape {list(saliency.shape)}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha: must be in [0, 1], got {alpha!r}")
    h, w = frame.shape[:2]
    m = cv2.resize(np.clip(saliency, 0, 1).astype(np.float32), (w, h), interpolation=cv2.INTER_LINEAR)
    heat = cv2.applyColorMap(np.uint8(np.round(255 * m)), cv2.COLORMAP_JET if colormap is None else colormap)
    heat = cv2.cvtColor(heat, cv2.COLOR_BGR2RGB).astype(np.float32)
    return np.uint8(np.clip((1 - alpha) * frame.astype(np.float32) + alpha * heat, 0, 255).round())


def overlay_region(frame: np.ndarray, saliency: np.ndarray, alpha: float,
                    region: tuple[int, int] | None) -> np.ndarray:
    """:func:`overlay` on the rows ``top .. H - bottom`` only (the model's view), if given."""
    if region is None:
        return overlay(frame, saliency, alpha)
    top, bottom = region
    out = frame.copy()
    out[top:frame.shape[0] - bottom] = overlay(np.ascontiguousarray(frame[top:frame.shape[0] - bottom]), saliency,
                                               alpha)
    return out


def default_preprocess(frame: np.ndarray) -> torch.Tensor:
    """uint8 RGB ``[H, W, 3]`` -> float ``[3, H, W]`` in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1).float() / 255.0


def compute_run_saliency(run_dir: str | os.PathLike, frame_model_for_step: Callable[[int], nn.Module],
                         preprocess: Callable[[np.ndarray], torch.Tensor] = default_preprocess,
                         target: int | str | Callable[[int], int | str] = "predicted", method: str = "gradcam",
                         target_layer: nn.Module | str | None = None, steer_index: int = 0, alpha: float = 0.45,
                         jpeg_quality: int = 85, progress: bool = True,
                         input_region: tuple[int, int] | None = None) -> Path:
    """Saliency for every frame of the run in ``run_dir``; writes ``RUN_DIR/saliency.npz``.

    frame_model_for_step(i): the image model for step i (the policy with step i's
    temporal context held fixed). preprocess(frame): the model input ``[C, H, W]``
    for a recorded RGB frame. target: a target spec (module docstring) or a function
    of the step returning one. target_layer: None (last Conv2d), a dotted name or the module.
    input_region: ``(top, bottom)`` rows cropped off the frame by ``preprocess``
    (Udacity: 60, 25), so the overlay lands on the part of the frame the model saw.
    An output that cannot be written is refused before anything is computed.
    """
    from tqdm import tqdm

    from nac_drive.io.atomic import check_writable

    run = load_trace(run_dir)
    out = check_writable(Path(run.path).parent / SALIENCY_FILE)
    maps, overlays = [], []
    layer_name = None
    for i in tqdm(range(run.num_steps), desc="saliency", unit="frame", disable=not progress):
        frame = run.frame(i)
        model = frame_model_for_step(i)
        if layer_name is None:
            layer = resolve_layer(model, target_layer)
            layer_name = next((n for n, m in model.named_modules() if m is layer), type(layer).__name__)
        spec = target(i) if callable(target) else target
        m = saliency_maps(model, preprocess(frame)[None], spec, method, target_layer, steer_index)[0]
        maps.append(np.uint8(np.round(255 * m)))
        overlays.append(encode_jpeg(overlay_region(frame, m, alpha, input_region), jpeg_quality))
    arrays: dict[str, np.ndarray] = {}
    arrays["maps"] = np.stack(maps) if maps else np.zeros((0, 0, 0), dtype=np.uint8)
    arrays["overlay_jpeg"], arrays["overlay_offsets"] = pack_jpegs(overlays)
    meta = {"format": FORMAT, "version": VERSION, "num_steps": run.num_steps, "method": method,
            "target": target if isinstance(target, (int, str)) else "per-step", "target_layer": layer_name,
            "trace_created_utc": run.metadata.get("created_utc"), "trace_sha256": run.sha256,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return write_archive(out, arrays, meta)


@dataclass
class RunSaliency:
    """A loaded ``saliency.npz``."""

    path: Path
    metadata: dict[str, Any]
    maps: np.ndarray
    overlay_jpeg: np.ndarray
    overlay_offsets: np.ndarray

    @property
    def num_steps(self) -> int:
        return len(self.overlay_offsets) - 1

    def overlay_bytes(self, i: int) -> bytes:
        return self.overlay_jpeg[self.overlay_offsets[i]:self.overlay_offsets[i + 1]].tobytes()

    def overlay(self, i: int) -> np.ndarray:
        return decode_jpeg(self.overlay_bytes(i))


def load_saliency(path: str | os.PathLike, trace: RunTrace | None = None) -> RunSaliency:
    """Load ``RUN_DIR/saliency.npz``; given the run's loaded ``trace``, refuse a file that
    was not computed from that very trace (its ``trace_sha256``) or has another length."""
    path = Path(path)
    if path.is_dir() or path.suffix != ".npz":
        path = path / SALIENCY_FILE
    with ArchiveReader(path) as r:
        meta, n = r.metadata, r.header(FORMAT, VERSION)
        if trace is not None:
            r.require_trace(trace, n, "recompute it with nac-drive saliency")
        maps = r.array("maps", "u", 3)
        r.require(len(maps) == n, "maps", f"expected {n} maps, got {len(maps)}")
        data, offsets = check_jpeg_pack(r, "overlay_jpeg", "overlay_offsets", n)
    return RunSaliency(path=path, metadata=meta, maps=maps, overlay_jpeg=data, overlay_offsets=offsets)
