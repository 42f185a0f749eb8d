"""Are saliency maps faithful to what the policy uses? RISE deletion / insertion and the
model-randomisation sanity check.

Attribution methods (:data:`ATTRIBUTIONS`), each
``method(frame_model, frames [B, C, H, W] float in [0, 1], target, seed=0) -> maps [B, H, W]``
float32 in [0, 1] at the model-input size (larger = more salient); ``target`` is a target
spec of :mod:`nac_drive.interpret.saliency` (an action index, ``"predicted"``, ``"steer+"``,
``"steer-"``, ``"steer"``):

* ``"gradcam"`` (and the other CAMs of :data:`~nac_drive.interpret.saliency.METHODS`):
  :func:`~nac_drive.interpret.saliency.saliency_maps` on the last ``nn.Conv2d``;
* ``"integrated_gradients"``: captum's Integrated Gradients from a black frame, ``|attr|``
  summed over channels, divided by its maximum;
* ``"occlusion"``: captum's Occlusion, black patches of 1/8 of the frame's height and width
  (stride = patch); the drop of the target's output, min-max scaled (evidence against the
  target ranks last);
* the baselines every method should beat (:data:`RANDOM_BASELINES`), each from ``seed``:
  ``"random"``, uniform noise per pixel; ``"random_cam_grid"``, uniform noise on the grid
  Grad-CAM's maps are made on (the last ``nn.Conv2d``'s output, e.g. 10 x 10) upsampled as
  pytorch-grad-cam upsamples its maps; ``"random_patches"``, uniform noise per Occlusion
  patch (8 x 8 patches). A coarse map moves whole regions at once, which by itself changes
  a deletion curve, so each method is compared with noise of its own granularity too.

RISE (Petsiuk et al. 2018, arXiv 1806.07421), :func:`deletion_insertion`: the pixels are
ranked by the map (ties in random order, from ``seed``); *deletion* sets the most salient
fraction to black, *insertion* copies it onto a blurred frame (Gaussian, kernel 11, sigma 5,
as in the paper), at fractions 0, 1/S, ..., 1; the 2 (S + 1) images of a frame go through
the model in one forward. The score is the probability (softmax of the outputs) of the
target action for a discrete policy, or for a regression policy (Udacity steering) the
signed output ``sign * output[steer_index]`` that the "steer" targets explain, in the
output's own units (not normalised: its AUCs compare methods on the same frames, not
across policies). The area under each curve is the trapezoid rule over the fractions
(:func:`auc`). Faithful maps give a low deletion AUC and a high insertion AUC.

Sanity check (Adebayo et al. 2018, "Sanity Checks for Saliency Maps"),
:func:`randomized_policy`: the policy's parameters are randomised in a cascade from the
top, :data:`CASCADE` = head, then head + core, then head + core + encoder (the whole
model). Each randomised tensor keeps its own values in a random order (a permutation),
so activations stay in their trained range while what was learned is gone. The
Spearman rank correlation (:func:`spearman`) between a method's maps for the trained
and the randomised policy (same frames, same target action; each randomised policy
replays the run itself, so its window holds its own features) should fall well below 1;
a method whose maps stay the same does not explain the model.

:func:`saliency_faithfulness` does both on a recorded run (up to ``max_frames`` frames,
spread evenly, each replayed with its window as :mod:`nac_drive.interpret.policy_saliency`
does) and returns a JSON-able summary. Neighbouring frames of a drive are alike, so no
interval treats frames as independent: each is a block bootstrap
(:func:`~nac_drive.simulators.episode_stats.block_mean_interval`) over the blocks of
:func:`frame_blocks` (episodes, or contiguous stretches of frames when the frames come from
fewer than :data:`MIN_EPISODE_BLOCKS` episodes). Each method is compared with each random
baseline *paired*, on the same frames (:func:`paired_against_random`): the mean per-frame
difference of the AUCs and its block-bootstrap interval.
"""

from __future__ import annotations

import copy
import math
import os
import time
import warnings
from contextlib import contextmanager
from functools import partial
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from nac_drive.interpret.policy_saliency import Replay
from nac_drive.interpret.road_share import road_share
from nac_drive.interpret.saliency import METHODS as CAM_METHODS
from nac_drive.interpret.saliency import STEER_TARGETS, resolve_layer, saliency_maps
from nac_drive.interpret.trace import RunTrace, load_trace
from nac_drive.simulators.episode_stats import block_mean_interval, paired_block_change

RANDOM_BASELINES = ("random", "random_cam_grid", "random_patches")
DEFAULT_METHODS = ("gradcam", "integrated_gradients", "occlusion", *RANDOM_BASELINES)
OCCLUSION_PARTS = 8           # Occlusion's patches per side, and the random patches'
MIN_EPISODE_BLOCKS = 10       # fewer episodes than this: contiguous stretches of frames are the blocks
CASCADE = ("head", "core", "encoder")
BLUR_KERNEL, BLUR_SIGMA = 11, 5.0
IG_STEPS = 16
IG_TOLERANCE = 0.05         # Integrated Gradients is complete when it misses f(x) - f(baseline) by less than this share
IG_MAX_STEPS = 256          # ... or when doubling its steps reached this many
IG_STEPS_PER_BATCH = 16     # interpolation steps per forward (bounds memory at many steps)
COMPLETENESS_ATOL = 1e-6    # an error this small is float rounding, whatever the difference


# ----------------------------------------------------------------------- targets
def resolve_target(outputs: torch.Tensor, target: int | str, steer_index: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A target spec for outputs ``[B, A]`` -> (index ``[B]`` long, sign ``[B]`` float), on the
    outputs' device: the scalar explained for sample b is ``sign[b] * outputs[b, index[b]]``."""
    B, A = outputs.shape
    where = outputs.device
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        if not 0 <= target < A:
            raise ValueError(f"target: action {target} is out of range for {A} outputs")
        return torch.full((B,), int(target), dtype=torch.long, device=where), torch.ones(B, device=where)
    if target == "predicted":
        return outputs.argmax(dim=1), torch.ones(B, device=where)
    if target in STEER_TARGETS:
        if not 0 <= steer_index < A:
            raise ValueError(f"steer_index: {steer_index} is out of range for {A} outputs")
        index = torch.full((B,), steer_index, dtype=torch.long, device=where)
        if target == "steer":
            return index, torch.where(outputs[:, steer_index] >= 0, 1.0, -1.0)
        return index, torch.full((B,), 1.0 if target == "steer+" else -1.0, device=where)
    raise ValueError(f"target: expected an action index, 'predicted', 'steer+', 'steer-' or 'steer', got {target!r}")


def _signed_output(model: nn.Module, frames: torch.Tensor, index: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """``[B]``: ``sign * model(frames)[b, index]`` (captum expands index and sign with the batch)."""
    return sign * model(frames).gather(1, index[:, None])[:, 0]


@contextmanager
def eval_mode(model: nn.Module):
    """Run ``model`` in eval mode; every submodule's own mode is restored afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


def _check_frames(frames) -> None:
    if not isinstance(frames, torch.Tensor) or frames.ndim != 4 or not frames.is_floating_point():
        raise ValueError(f"frames: expected a float tensor [B, C, H, W] in [0, 1], got "
                         f"{getattr(frames, 'dtype', type(frames))} {list(getattr(frames, 'shape', []))}")


def _unit_scale(maps: torch.Tensor | np.ndarray) -> np.ndarray:
    """``[B, H, W]`` -> each map min-max scaled to [0, 1] (a constant map -> 0), float32."""
    m = np.nan_to_num(np.asarray(maps, dtype=np.float64))
    low = m.min(axis=(1, 2), keepdims=True)
    span = m.max(axis=(1, 2), keepdims=True) - low
    return np.where(span > 0, (m - low) / np.where(span > 0, span, 1), 0.0).astype(np.float32)


# ------------------------------------------------------------------ attributions
def cam_maps(frame_model: nn.Module, frames: torch.Tensor, target: int | str = "predicted", seed: int = 0,
             method: str = "gradcam") -> np.ndarray:
    """A pytorch-grad-cam map (:func:`~nac_drive.interpret.saliency.saliency_maps`) ``[B, H, W]``."""
    _check_frames(frames)
    return saliency_maps(frame_model, frames, target, method)


def integrated_gradients_maps(frame_model: nn.Module, frames: torch.Tensor, target: int | str = "predicted",
                              seed: int = 0, n_steps: int = IG_STEPS) -> np.ndarray:
    """captum Integrated Gradients from a black frame: ``|attr|`` summed over channels,
    divided by each map's maximum -> ``[B, H, W]``."""
    from captum.attr import IntegratedGradients

    _check_frames(frames)
    with eval_mode(frame_model), torch.no_grad():
        index, sign = resolve_target(frame_model(frames), target)
    with eval_mode(frame_model):
        attr = IntegratedGradients(partial(_signed_output, frame_model)).attribute(
            frames, baselines=torch.zeros_like(frames), additional_forward_args=(index, sign), n_steps=n_steps)
    total = attr.detach().abs().sum(dim=1).numpy()
    peak = total.max(axis=(1, 2), keepdims=True)
    return np.where(peak > 0, total / np.where(peak > 0, peak, 1), 0.0).astype(np.float32)


def occlusion_maps(frame_model: nn.Module, frames: torch.Tensor, target: int | str = "predicted",
                   seed: int = 0, parts: int = OCCLUSION_PARTS) -> np.ndarray:
    """captum Occlusion with black patches of ``H // parts`` x ``W // parts`` pixels (stride
    the same): the drop of the target's output, min-max scaled -> ``[B, H, W]``."""
    from captum.attr import Occlusion

    _check_frames(frames)
    C, H, W = frames.shape[1:]
    patch = (C, max(1, H // parts), max(1, W // parts))
    with eval_mode(frame_model), torch.no_grad():
        index, sign = resolve_target(frame_model(frames), target)
        attr = Occlusion(partial(_signed_output, frame_model)).attribute(
            frames, sliding_window_shapes=patch, strides=patch, baselines=0.0,
            additional_forward_args=(index, sign), perturbations_per_eval=parts * parts + 2 * parts + 1)
    return _unit_scale(attr.mean(dim=1).numpy())


def random_maps(frame_model: nn.Module, frames: torch.Tensor, target: int | str = "predicted",
                seed: int = 0) -> np.ndarray:
    """Uniform noise ``[B, H, W]`` from ``seed`` (ignores the model): the baseline."""
    _check_frames(frames)
    B, _, H, W = frames.shape
    return np.random.default_rng(seed).random((B, H, W), dtype=np.float32)


def cam_grid(frame_model: nn.Module, frames: torch.Tensor) -> tuple[int, int]:
    """``(h, w)``: the spatial size of the layer Grad-CAM explains (the last ``nn.Conv2d``'s
    output), the grid its maps are made on before they are upsampled."""
    sizes = []
    hook = resolve_layer(frame_model, None).register_forward_hook(lambda m, args, out: sizes.append(out.shape[-2:]))
    try:
        with eval_mode(frame_model), torch.no_grad():
            frame_model(frames[:1])
    finally:
        hook.remove()
    return int(sizes[0][0]), int(sizes[0][1])


def random_cam_grid_maps(frame_model: nn.Module, frames: torch.Tensor, target: int | str = "predicted",
                         seed: int = 0) -> np.ndarray:
    """Uniform noise from ``seed`` on Grad-CAM's grid (:func:`cam_grid`), upsampled to the
    frames' size by pytorch-grad-cam's own ``scale_cam_image`` -> ``[B, H, W]`` in [0, 1]."""
    from pytorch_grad_cam.utils.image import scale_cam_image

    _check_frames(frames)
    B, _, H, W = frames.shape
    grid = np.random.default_rng(seed).random((B, *cam_grid(frame_model, frames)), dtype=np.float32)
    return np.clip(scale_cam_image(grid, (W, H)), 0.0, 1.0)


def random_patch_maps(frame_model: nn.Module, frames: torch.Tensor, target: int | str = "predicted",
                      seed: int = 0, parts: int = OCCLUSION_PARTS) -> np.ndarray:
    """Uniform noise from ``seed``, one value per patch of :func:`occlusion_maps`' grid
    (``parts`` x ``parts`` patches of ``H // parts`` x ``W // parts`` pixels; rows and
    columns past the last whole patch join it) -> ``[B, H, W]`` (ignores the model)."""
    _check_frames(frames)
    B, _, H, W = frames.shape
    patch_values = np.random.default_rng(seed).random((B, parts, parts), dtype=np.float32)
    rows = np.minimum(np.arange(H) // max(1, H // parts), parts - 1)
    cols = np.minimum(np.arange(W) // max(1, W // parts), parts - 1)
    return patch_values[:, rows[:, None], cols[None, :]]


def complete_integrated_gradients(forward: Callable[..., torch.Tensor], inputs: torch.Tensor, baselines: torch.Tensor,
                                  additional_forward_args: tuple = (), first_steps: int = 8,
                                  max_steps: int = IG_MAX_STEPS, tolerance: float = IG_TOLERANCE
                                  ) -> tuple[torch.Tensor, dict]:
    """captum's Integrated Gradients of ``forward`` (``inputs [B, ...]`` -> ``[B]``) from
    ``baselines``, its steps doubled from ``first_steps`` until the attribution is complete
    for every sample: ``|sum(attr) - (f(x) - f(baseline))| <= tolerance * |f(x) - f(baseline)|``
    (or below :data:`COMPLETENESS_ATOL`), or ``max_steps`` is reached.

    Returns ``(attr [B, ...], completeness)``: ``steps`` (the steps of the returned
    attribution), ``error`` ``[B]`` (|sum(attr) - (f(x) - f(baseline))|, captum's
    convergence delta), ``difference`` ``[B]`` (|f(x) - f(baseline)|), ``complete`` (bool)."""
    from captum.attr import IntegratedGradients

    if not isinstance(first_steps, int) or first_steps < 1 or max_steps < first_steps:
        raise ValueError(f"first_steps, max_steps: expected 1 <= first_steps <= max_steps, got {first_steps!r}, "
                         f"{max_steps!r}")
    with torch.no_grad():
        difference = (forward(inputs, *additional_forward_args)
                      - forward(baselines, *additional_forward_args)).abs().double().cpu().numpy()
    ig = IntegratedGradients(forward)
    steps = first_steps
    while True:
        attr, delta = ig.attribute(inputs, baselines=baselines, additional_forward_args=additional_forward_args,
                                   n_steps=steps, return_convergence_delta=True,
                                   internal_batch_size=IG_STEPS_PER_BATCH * len(inputs))
        error = delta.detach().abs().double().cpu().numpy()
        complete = bool(np.all(error <= tolerance * difference + COMPLETENESS_ATOL))
        if complete or 2 * steps > max_steps:
            return attr.detach(), {"steps": steps, "error": error, "difference": difference, "complete": complete}
        steps *= 2


ATTRIBUTIONS: dict[str, Callable[..., np.ndarray]] = {
    **{name: partial(cam_maps, method=name) for name in CAM_METHODS},
    "integrated_gradients": integrated_gradients_maps,
    "occlusion": occlusion_maps,
    "random": random_maps,
    "random_cam_grid": random_cam_grid_maps,
    "random_patches": random_patch_maps,
}


def attribution_maps(method: str, frame_model: nn.Module, frames: torch.Tensor, target: int | str = "predicted",
                     seed: int = 0) -> np.ndarray:
    """Maps ``[B, H, W]`` in [0, 1] of the registered ``method`` (:data:`ATTRIBUTIONS`)."""
    if method not in ATTRIBUTIONS:
        raise ValueError(f"method: must be one of {tuple(ATTRIBUTIONS)}, got {method!r}")
    return ATTRIBUTIONS[method](frame_model, frames, target, seed=seed)


# ----------------------------------------------------------------------- RISE
def auc(curve: np.ndarray, fractions: np.ndarray | None = None) -> np.ndarray:
    """Area under ``curve [..., S+1]`` by the trapezoid rule over ``fractions`` (default:
    S + 1 even steps from 0 to 1) -> ``[...]``."""
    curve = np.asarray(curve, dtype=np.float64)
    x = np.linspace(0.0, 1.0, curve.shape[-1]) if fractions is None else np.asarray(fractions, dtype=np.float64)
    if x.shape != curve.shape[-1:] or len(x) < 2:
        raise ValueError(f"fractions: expected {curve.shape[-1]} >= 2 values, got shape {list(x.shape)}")
    return np.trapezoid(curve, x, axis=-1)


def _blurred(frames: torch.Tensor) -> torch.Tensor:
    from torchvision.transforms.functional import gaussian_blur

    k = min(BLUR_KERNEL, *(s - 1 if s % 2 == 0 else s for s in frames.shape[-2:]))
    return gaussian_blur(frames, [k, k], [BLUR_SIGMA, BLUR_SIGMA]) if k > 1 else frames.clone()


def deletion_insertion(frame_model: nn.Module, frames: torch.Tensor, maps: np.ndarray,
                       target: int | str = "predicted", steps: int = 16, score: str = "probability",
                       seed: int = 0, steer_index: int = 0) -> dict[str, np.ndarray]:
    """RISE deletion and insertion of ``frames [B, C, H, W]`` ranked by ``maps [B, H, W]``.

    score: ``"probability"`` (softmax of the outputs at the target action) or ``"output"``
    (``sign * output[index]`` of the target, for regression). Returns ``fractions [S+1]``,
    ``deletion`` / ``insertion`` curves ``[B, S+1]`` and ``deletion_auc`` / ``insertion_auc``
    ``[B]``, float64.
    """
    _check_frames(frames)
    maps = np.asarray(maps)
    B, C, H, W = frames.shape
    if maps.shape != (B, H, W):
        raise ValueError(f"maps: expected [B, H, W] = {[B, H, W]} (the frames' size), got {list(maps.shape)}")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: must be an integer >= 1, got {steps!r}")
    if score not in ("probability", "output"):
        raise ValueError(f"score: must be 'probability' or 'output', got {score!r}")
    n = H * W
    counts = np.round(np.linspace(0, n, steps + 1)).astype(np.int64)                    # pixels moved per step
    rng = np.random.default_rng(seed)
    ranks = np.empty((B, n), dtype=np.int64)
    for b in range(B):   # most salient first; ties in random order
        order = np.lexsort((rng.random(n), -maps[b].reshape(-1).astype(np.float64)))
        ranks[b, order] = np.arange(n)
    moved = torch.from_numpy(ranks[:, None, :] < counts[None, :, None]).view(B, steps + 1, 1, H, W).float()
    x = frames[:, None]
    deleted = x * (1 - moved)                                                         # black baseline
    inserted = _blurred(frames)[:, None] * (1 - moved) + x * moved
    images = torch.cat([deleted, inserted], dim=1).flatten(0, 1)                      # [B * 2(S+1), C, H, W]
    with eval_mode(frame_model), torch.no_grad():
        index, sign = resolve_target(frame_model(frames), target, steer_index)
        out = frame_model(images).view(B, 2 * (steps + 1), -1)
        values = out.softmax(dim=-1) if score == "probability" else out * sign[:, None, None]
        curves = values.gather(2, index[:, None, None].expand(B, 2 * (steps + 1), 1))[..., 0].double().numpy()
    fractions = counts / n
    deletion, insertion = curves[:, :steps + 1], curves[:, steps + 1:]
    return {"fractions": fractions, "deletion": deletion, "insertion": insertion,
            "deletion_auc": auc(deletion, fractions), "insertion_auc": auc(insertion, fractions)}


# ----------------------------------------------------------------- sanity check
def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman rank correlation of two arrays of the same size, flattened (scipy's
    ``spearmanr``: ties averaged); NaN if either is constant."""
    from scipy.stats import ConstantInputWarning, spearmanr

    a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
    if a.shape != b.shape:
        raise ValueError(f"a, b: expected the same number of values, got {a.size} and {b.size}")
    with warnings.catch_warnings():   # a constant map has no ranking: NaN is the answer, not a warning
        warnings.simplefilter("ignore", ConstantInputWarning)
        return float(spearmanr(a, b).statistic)


def randomized_policy(policy: nn.Module, stage: str, seed: int = 0) -> nn.Module:
    """A copy of ``policy`` (a :class:`~nac_drive.policy.DrivingPolicy`, in eval mode, reset)
    with the parameters of the cascade up to ``stage`` (:data:`CASCADE`: "head" -> head;
    "core" -> head and core; "encoder" -> the whole model) each permuted at random."""
    if stage not in CASCADE:
        raise ValueError(f"stage: must be one of {CASCADE}, got {stage!r}")
    clone = copy.deepcopy(policy)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in CASCADE[:CASCADE.index(stage) + 1]:
            for p in getattr(clone, block).parameters():
                p.copy_(p.reshape(-1)[torch.randperm(p.numel(), generator=g)].view_as(p))
    clone.eval()
    clone.reset()
    return clone


# ----------------------------------------------------------------- a whole run
def frame_blocks(episodes: np.ndarray, block_frames: int | None = None) -> tuple[np.ndarray, dict]:
    """The blocks a bootstrap resamples, for frames in time order whose episodes are
    ``episodes`` ``[n]``: ``(labels [n] int64, rule)``.

    From :data:`MIN_EPISODE_BLOCKS` episodes on, each episode is a block. With fewer, the
    frames of each episode are cut into contiguous stretches of ``block_frames`` frames
    (default ``ceil(n ** (1/3))``, the rate that suits a block bootstrap of a mean; a
    stretch never crosses an episode's end). ``rule``: ``{"by": "episode" | "time",
    "frames_per_block": int | None, "count": blocks}``."""
    episodes = np.asarray(episodes).reshape(-1)
    n = episodes.size
    _, episode_of = np.unique(episodes, return_inverse=True)
    if episode_of.size and episode_of.max() + 1 >= MIN_EPISODE_BLOCKS:
        return episode_of.astype(np.int64), {"by": "episode", "frames_per_block": None,
                                             "count": int(episode_of.max() + 1)}
    length = block_frames or max(1, math.ceil(n ** (1 / 3)))
    if not isinstance(length, int) or length < 1:
        raise ValueError(f"block_frames: must be an integer >= 1, got {block_frames!r}")
    starts = np.r_[True, episodes[1:] != episodes[:-1]] if n else np.zeros(0, dtype=bool)
    position = np.arange(n) - np.maximum.accumulate(np.where(starts, np.arange(n), 0))  # within its episode
    new_block = starts | (position % length == 0)
    labels = np.cumsum(new_block) - 1
    return labels.astype(np.int64), {"by": "time", "frames_per_block": length, "count": int(labels.max() + 1) if n else 0}


def _summary(values: np.ndarray, episodes: np.ndarray, block_frames: int | None = None) -> dict:
    """``{mean, ci95, frames, blocks}`` of ``values`` ``[n]`` (frames in time order, their
    ``episodes`` ``[n]``), the interval a block bootstrap over :func:`frame_blocks`."""
    v = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(v)
    blocks, rule = frame_blocks(np.asarray(episodes)[keep], block_frames)
    low, high = block_mean_interval(v[keep], blocks) if keep.any() else (math.nan, math.nan)
    return {"mean": float(v[keep].mean()) if keep.any() else None,
            "ci95": [None, None] if math.isnan(low) else [low, high], "frames": int(keep.sum()),
            "blocks": rule["count"]}


def paired_against_random(aucs: Mapping[str, np.ndarray], episodes: np.ndarray,
                          block_frames: int | None = None) -> dict:
    """Each method of ``aucs`` (name -> per-frame AUC ``[n]``, the same frames in time order
    for every name, their ``episodes`` ``[n]``) against each random baseline among them
    (:data:`RANDOM_BASELINES`): ``{method: {baseline: paired change}}``, the change
    ``method - baseline`` frame by frame, its mean, block-bootstrap 95% interval
    (:func:`~nac_drive.simulators.episode_stats.paired_block_change` over
    :func:`frame_blocks`), ``blocks`` and ``items`` (frames)."""
    blocks, _ = frame_blocks(episodes, block_frames)
    baselines = [name for name in RANDOM_BASELINES if name in aucs]
    return {name: {baseline: paired_block_change(aucs[baseline], values, blocks) for baseline in baselines}
            for name, values in aucs.items() if name not in RANDOM_BASELINES}


def _spread(n: int, count: int) -> np.ndarray:
    """Up to ``count`` indices of ``range(n)`` spread evenly (first and last included)."""
    return np.unique(np.round(np.linspace(0, n - 1, min(count, n))).astype(int)) if count and n else \
        np.zeros(0, dtype=int)


def _resolve_methods(methods) -> dict[str, Callable[..., np.ndarray]]:
    if isinstance(methods, Mapping):
        return dict(methods)
    if isinstance(methods, str) or not methods:
        raise ValueError(f"methods: expected a non-empty list of names of {tuple(ATTRIBUTIONS)} or a mapping "
                         f"name -> method, got {methods!r}")
    unknown = [m for m in methods if m not in ATTRIBUTIONS]
    if unknown:
        raise ValueError(f"methods: {unknown} are not among {tuple(ATTRIBUTIONS)}")
    return {name: ATTRIBUTIONS[name] for name in methods}


def saliency_faithfulness(policy, run: RunTrace | str | os.PathLike,
                          methods: Sequence[str] | Mapping[str, Callable[..., np.ndarray]] = DEFAULT_METHODS,
                          max_frames: int = 500, steps: int = 16, seed: int = 0, progress: bool = True,
                          cascade: Sequence[str] = CASCADE, sanity_frames: int = 100,
                          block_frames: int | None = None,
                          road: Callable[[np.ndarray], np.ndarray] | None = None) -> dict:
    """RISE deletion / insertion AUCs and the randomisation sanity check of each method on
    up to ``max_frames`` frames (spread evenly) of a recorded run.

    policy: a :class:`~nac_drive.policy.DrivingPolicy`; run: a :class:`RunTrace` or its
    folder / file. methods: names of :data:`ATTRIBUTIONS` or a mapping name -> method
    (the module docstring's signature). Target: the action the policy chose (discrete;
    score "probability"), or the direction it steered (continuous, column 0; score
    "output"). cascade: the randomisation stages to check (:data:`CASCADE`; empty: none),
    on ``sanity_frames`` of the frames (spread evenly; they cost a map per method and stage).
    block_frames: frames per bootstrap block when the frames come from fewer than
    :data:`MIN_EPISODE_BLOCKS` episodes (:func:`frame_blocks`; default ``ceil(n ** (1/3))``).
    road: the road of a recorded frame, ``frame [H, W, 3] uint8 -> mask [h, w] bool`` at the
    maps' size (e.g. :func:`~nac_drive.interpret.road_share.road_ahead_mask`); None: no road share.

    Returns a JSON-able dict: ``frames``, ``frame_indices``, ``steps``, ``score``,
    ``sanity_frames``, ``seconds``, ``trace_sha256``, ``blocks`` (:func:`frame_blocks`' rule
    for the frames scored), per method ``deletion_auc`` / ``insertion_auc`` ``{mean, ci95:
    [low, high], frames, blocks}`` (None where no frame has a value; the interval a block
    bootstrap) and ``sanity_spearman`` ``{stage: {mean, ci95, frames, blocks}}`` (frames: those
    whose correlation is defined, i.e. neither map is constant; the random maps ignore the
    model, so their correlation is 1 by construction), and ``paired``: per method that is not
    a random baseline, per baseline run, ``{deletion_auc, insertion_auc}`` each ``{mean, ci95,
    blocks, items}`` of the per-frame AUC differences method - baseline
    (:func:`paired_against_random`; a faithful method: deletion below 0, insertion above).
    With ``road``: ``road_share`` per method ``{mean, ci95, frames, blocks}``, the share of
    each map's mass on the frame's road (:func:`~nac_drive.interpret.road_share.road_share`),
    and ``road_pixel_share``, the road's share of the pixels (a uniform map's road share).
    """
    from tqdm import tqdm

    run = run if isinstance(run, RunTrace) else load_trace(run)
    chosen = _resolve_methods(methods)
    if not isinstance(max_frames, int) or max_frames < 1:
        raise ValueError(f"max_frames: must be an integer >= 1, got {max_frames!r}")
    if not isinstance(sanity_frames, int) or sanity_frames < 0:
        raise ValueError(f"sanity_frames: must be an integer >= 0, got {sanity_frames!r}")
    if any(stage not in CASCADE for stage in cascade):
        raise ValueError(f"cascade: stages must be among {CASCADE}, got {list(cascade)}")
    if run.num_steps == 0:
        raise ValueError(f"run: {run.path} has no steps")
    discrete = policy.config.action == "discrete"
    score = "probability" if discrete else "output"
    frames = _spread(run.num_steps, max_frames)
    checked = set(frames[_spread(len(frames), sanity_frames)].tolist()) if cascade and sanity_frames else set()
    started = time.perf_counter()
    policy.eval()
    replay = Replay(policy, run)
    randomized = {stage: Replay(randomized_policy(policy, stage, seed), run) for stage in cascade}
    deletion = {name: np.full(len(frames), np.nan) for name in chosen}
    insertion = {name: np.full(len(frames), np.nan) for name in chosen}
    sanity = {name: {stage: np.full(len(frames), np.nan) for stage in cascade} for name in chosen}
    on_road = {name: np.full(len(frames), np.nan) for name in chosen}
    road_pixels = np.full(len(frames), np.nan)
    for j, i in enumerate(tqdm(frames, desc="faithfulness", unit="frame", disable=not progress)):
        model = replay.frame_model_for_step(int(i))
        x = replay.model_input(run.frame(int(i)))[None]
        with torch.no_grad():
            out = model(x)
        # the trained policy's own choice, named explicitly so the randomised ones explain the same action
        target = int(out.argmax()) if discrete else ("steer+" if float(out[0, 0]) >= 0 else "steer-")
        random_models = {stage: r.frame_model_for_step(int(i)) for stage, r in randomized.items()} \
            if int(i) in checked else {}
        mask = road(run.frame(int(i)))[None] if road is not None else None
        if mask is not None:
            road_pixels[j] = mask.mean()
        for name, method in chosen.items():
            maps = method(model, x, target, seed=seed + int(i))
            rise = deletion_insertion(model, x, maps, target, steps, score, seed=seed + int(i))
            deletion[name][j], insertion[name][j] = rise["deletion_auc"][0], rise["insertion_auc"][0]
            if mask is not None:
                on_road[name][j] = road_share(maps, mask)[0]
            for stage, random_model in random_models.items():
                sanity[name][stage][j] = spearman(maps, method(random_model, x, target, seed=seed + int(i)))
    episodes = np.asarray(run.episode)[frames]
    paired = {name: {} for name in chosen if name not in RANDOM_BASELINES}
    for key, aucs in (("deletion_auc", deletion), ("insertion_auc", insertion)):
        for name, against in paired_against_random(aucs, episodes, block_frames).items():
            for baseline, change in against.items():
                paired[name].setdefault(baseline, {})[key] = change
    roads = {} if road is None else {
        "road_share": {name: _summary(on_road[name], episodes, block_frames) for name in chosen},
        "road_pixel_share": _summary(road_pixels, episodes, block_frames)}
    return {"frames": len(frames), "frame_indices": frames.tolist(), "steps": steps, "score": score,
            "target": "chosen action" if discrete else "chosen steering direction (output 0)",
            "deletion_baseline": "black",
            "insertion_baseline": f"gaussian blur (kernel {BLUR_KERNEL}, sigma {BLUR_SIGMA:g})",
            "cascade": list(cascade), "sanity_frames": len(checked), "seed": seed, "trace_sha256": run.sha256,
            "seconds": round(time.perf_counter() - started, 3), "blocks": frame_blocks(episodes, block_frames)[1],
            "methods": {name: {"deletion_auc": _summary(deletion[name], episodes, block_frames),
                               "insertion_auc": _summary(insertion[name], episodes, block_frames),
                               "sanity_spearman": {stage: _summary(sanity[name][stage], episodes, block_frames)
                                                   for stage in cascade}}
                        for name in chosen},
            "paired": paired, **roads}
