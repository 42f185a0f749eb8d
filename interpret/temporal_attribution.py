"""Which past frame mattered: each frame's share of a decision over the policy's causal window.

The attention weights of the shipped policy are nearly uniform (entropy 0.9999 of its
maximum), so they cannot say which frame a decision used. Here the decision at step i is
attributed to the frames of its window by captum on the policy's window forward
(``policy(frames [1, T, C, H, W], t [1, T])``, output at the last position, T = the
window's W frames or fewer at an episode's start): what the policy was trained on and,
for a causal window, what its streaming :meth:`~nac_drive.policy.DrivingPolicy.step_output`
returns (checked at every step: :func:`window_attribution` raises if they differ).

Methods (:data:`WINDOW_METHODS`):

* ``"integrated_gradients"`` (default): Integrated Gradients from a window of black frames,
  ``|attribution|`` summed over each frame's pixels, its steps doubled from 8 until the
  attribution is complete for that decision (it sums to within 5% of the output's change
  from the black window, :func:`~nac_drive.interpret.faithfulness.complete_integrated_gradients`;
  at most 256 steps). Eight steps miss by 5-15% on the shipped policy. Consecutive frames are nearly
  identical; the straight path from black changes them together, and Integrated Gradients
  splits the credit between such redundant frames (its symmetry axiom), where removing one
  frame at a time would find that no single frame matters.
* ``"ablation"``: each frame replaced by a black one in turn, ``|change of the output|``
  (captum FeatureAblation on the encoder's per-frame features, a black frame's features
  standing in: the same as replacing the frame, as the encoder sees one frame at a time,
  and each frame is encoded once per run). About 20x faster than the default.

The explained output: the chosen action's logit (discrete), or the steering output
(column 0) signed towards the direction steered (continuous). Timestamps: ``frame_dt``
per frame from the episode's start, as the replay of
:mod:`nac_drive.interpret.policy_saliency` feeds the policy.

``shares [N, W]`` float32: column a is the frame a steps ago (0 = the current one); a
row sums to 1 (0 where the output depends on no frame of the window); NaN where the
window does not reach back (the episode began less than a steps before).

``RUN_DIR/window_attribution.npz`` (an archive as in :mod:`nac_drive.interpret.archive`):
``shares`` and ``metadata.json`` with ``format`` ("nac-drive-window-attribution"),
``version`` (1), ``num_steps``, ``method``, ``window``, ``n_steps`` (the first step count
tried), ``target``, ``max_stream_difference``, ``completeness`` (Integrated Gradients:
:func:`completeness_summary`; None for ablation) and ``trace_sha256``;
:func:`load_window_attribution` given the run's trace refuses a file computed from
another trace.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nac_drive.devices import module_device
from nac_drive.interpret.archive import METADATA_MEMBER, ArchiveReader, write_archive
from nac_drive.interpret.faithfulness import (COMPLETENESS_ATOL, IG_MAX_STEPS, IG_TOLERANCE,
                                              complete_integrated_gradients, eval_mode, resolve_target)
from nac_drive.interpret.policy_saliency import Replay
from nac_drive.interpret.trace import RunTrace, load_trace

WINDOW_FILE = "window_attribution.npz"
FORMAT, VERSION = "nac-drive-window-attribution", 1
WINDOW_METHODS = ("integrated_gradients", "ablation")
IG_STEPS = 8
"""Integrated Gradients' first step count (Gauss-Legendre), doubled until complete."""
STREAM_TOLERANCE = 1e-3
"""largest |window forward - streaming output|, relative to max(1, |output|), accepted."""


def _window_output(policy, frames: torch.Tensor, t: torch.Tensor, index: torch.Tensor,
                   sign: torch.Tensor) -> torch.Tensor:
    """frames ``[B, T, C, H, W]``, t ``[B, T]`` -> ``[B]``: ``sign * output[:, -1, index]``."""
    return sign * policy(frames, t)[:, -1].gather(1, index[:, None])[:, 0]


def _features_output(policy, features: torch.Tensor, t: torch.Tensor, index: torch.Tensor,
                     sign: torch.Tensor) -> torch.Tensor:
    """The same from the encoder's features ``[B, T, F]`` (the policy's forward after its encoder)."""
    return sign * policy.head(policy.core(features, t))[:, -1].gather(1, index[:, None])[:, 0]


def frame_shares(policy, frames: torch.Tensor, t: torch.Tensor, target: int | str,
                 method: str = "integrated_gradients", n_steps: int = IG_STEPS,
                 features: torch.Tensor | None = None, max_steps: int = IG_MAX_STEPS,
                 tolerance: float = IG_TOLERANCE) -> tuple[np.ndarray, dict | None]:
    """Each frame's share of the output at the last of ``frames [T, C, H, W]`` (float in
    [0, 1], oldest first; t ``[T]`` seconds) -> (``[T]`` float64 summing to 1 (or all 0),
    Integrated Gradients' completeness: ``steps``, ``error``, ``difference``, ``complete``
    (:func:`~nac_drive.interpret.faithfulness.complete_integrated_gradients`, from ``n_steps``
    steps); None for ablation). features: ``policy.encoder(frames)`` ``[T, F]`` if already computed."""
    from captum.attr import FeatureAblation

    if method not in WINDOW_METHODS:
        raise ValueError(f"method: must be one of {WINDOW_METHODS}, got {method!r}")
    if frames.ndim != 4 or t.shape != frames.shape[:1]:
        raise ValueError(f"frames, t: expected [T, C, H, W] and [T], got {list(frames.shape)} and {list(t.shape)}")
    with eval_mode(policy):
        with torch.no_grad():
            if features is None:
                features = policy.encoder(frames)
            black = policy.encoder(torch.zeros_like(frames[:1]))                       # [1, F]
            index, sign = resolve_target(policy.head(policy.core(features[None], t[None]))[:, -1], target)
        args = (t[None], index, sign)
        completeness = None
        if method == "integrated_gradients":
            x = frames[None]
            attr, completeness = complete_integrated_gradients(partial(_window_output, policy), x, torch.zeros_like(x),
                                                               args, n_steps, max_steps, tolerance)
        else:   # a frame's features replaced by a black frame's = the frame replaced (the encoder is per frame)
            x = features[None]
            mask = torch.arange(x.shape[1], device=x.device).view(1, -1, 1).expand_as(x)
            with torch.no_grad():
                attr = FeatureAblation(partial(_features_output, policy)).attribute(
                    x, baselines=black.expand_as(features)[None], feature_mask=mask, additional_forward_args=args,
                    perturbations_per_eval=x.shape[1])
    per_frame = attr.detach()[0].abs().flatten(1).sum(dim=1).double().cpu().numpy()
    total = per_frame.sum()
    return (per_frame / total if total > 0 else np.zeros_like(per_frame)), completeness


def completeness_summary(steps: np.ndarray, error: np.ndarray, difference: np.ndarray, first_steps: int = IG_STEPS,
                         max_steps: int = IG_MAX_STEPS, tolerance: float = IG_TOLERANCE) -> dict:
    """What Integrated Gradients' completeness came to over the decisions attributed (each
    ``[n]``: steps used, |sum(attr) - (f(x) - f(black))|, |f(x) - f(black)|): the ``rule``,
    ``tolerance``, ``decisions``, ``steps`` (median, max), ``error`` and ``difference``
    (median, max), ``ratio`` = error / difference over the decisions whose difference is not
    0 (median, max: the criterion holds for each decision, so the max is below ``tolerance``
    unless some reached the cap) and ``incomplete`` (decisions still above ``tolerance`` at
    the cap)."""
    steps, error, difference = (np.asarray(a, dtype=np.float64) for a in (steps, error, difference))
    moved = difference > 0
    ratio = error[moved] / difference[moved]

    def spread(a):
        return {"median": float(np.median(a)), "max": float(np.max(a))} if a.size else {"median": None, "max": None}

    return {"rule": f"steps doubled from {first_steps} (or from the previous decision's of the episode) until each "
                    f"decision's |sum(attr) - (f(x) - f(black))| <= {tolerance:g} x |f(x) - f(black)|, at most "
                    f"{max_steps} steps",
            "tolerance": tolerance, "decisions": int(steps.size), "steps": spread(steps), "error": spread(error),
            "difference": spread(difference), "ratio": spread(ratio),
            "incomplete": int(np.sum(error > tolerance * difference + COMPLETENESS_ATOL))}


def window_attribution(policy, run: RunTrace | str | os.PathLike, method: str = "integrated_gradients",
                       n_steps: int = IG_STEPS, progress: bool = True, max_steps: int = IG_MAX_STEPS,
                       tolerance: float = IG_TOLERANCE, every: int = 1) -> tuple[np.ndarray, float, dict | None]:
    """``(shares [N, W] float32, max_stream_difference, completeness)`` for every ``every``-th
    step of a recorded run (steps 0, every, 2 every, ...; the others' rows stay NaN; module
    docstring); W = ``policy.config.core.window``; ``max_stream_difference`` over the steps
    attributed, the window forward their shares explain against what streamed. Integrated Gradients starts each decision at
    the steps the previous one of its episode needed (at first ``n_steps``; neighbouring decisions
    are alike) and doubles them until complete (``completeness``: :func:`completeness_summary` of
    the decisions attributed; None for ablation)."""
    from tqdm import tqdm

    run = run if isinstance(run, RunTrace) else load_trace(run)
    if method not in WINDOW_METHODS:
        raise ValueError(f"method: must be one of {WINDOW_METHODS}, got {method!r}")
    if every < 1:
        raise ValueError(f"every: must be >= 1, got {every}")
    W, dt = policy.config.core.window, policy.config.frame_dt
    discrete = policy.config.action == "discrete"
    policy.eval()
    device = module_device(policy)      # the window runs there; the streamed output comes back to the CPU
    replay = Replay(policy, run)        # its model_input; the policy itself streams the run below
    shares = np.full((run.num_steps, W), np.nan, dtype=np.float32)
    frames: list[torch.Tensor] = []
    features: list[torch.Tensor] = []
    worst = 0.0
    used = np.zeros((run.num_steps, 3))                                      # [N, (steps, error, difference)]
    for i in tqdm(range(run.num_steps), desc="window attribution", unit="step", disable=not progress):
        if i == 0 or run.episode[i] != run.episode[i - 1]:
            policy.reset()
            frames, features, first, steps = [], [], i, n_steps
        frame = run.frame(i)
        x = replay.model_input(frame).to(device)
        with torch.no_grad():
            frames, features = (frames + [x])[-W:], (features + [policy.encoder(x[None])[0]])[-W:]
        streamed = policy.step_output(frame)   # every step: the stream's state goes on
        if i % every:
            continue
        window = torch.stack(frames)
        t = torch.arange(i - len(frames) + 1 - first, i + 1 - first, dtype=torch.float32, device=device) * dt
        with eval_mode(policy), torch.no_grad():
            forward = policy(window[None], t[None])[0, -1].cpu()
        worst = max(worst, float((forward - streamed).abs().max() / max(1.0, float(streamed.abs().max()))))
        target = int(streamed.argmax()) if discrete else ("steer+" if float(streamed[0]) >= 0 else "steer-")
        share, completeness = frame_shares(policy, window, t, target, method, steps, torch.stack(features),
                                           max(steps, max_steps), tolerance)
        shares[i, :len(frames)] = share[::-1]
        if completeness:
            steps = completeness["steps"]
            used[i] = steps, completeness["error"][0], completeness["difference"][0]
    if worst > STREAM_TOLERANCE:
        raise ValueError(f"policy: its window forward differs from its streaming output by up to {worst:.3g} "
                         f"(relative; at most {STREAM_TOLERANCE} allowed), so attributions over the window would "
                         f"explain another computation than the one that drove (core {policy.config.core.core!r}, "
                         f"time_input {policy.config.core.time_input!r})")
    if method != "integrated_gradients":
        return shares, worst, None
    return shares, worst, completeness_summary(*used[::every].T, n_steps, max_steps, tolerance)


def compute_window_attribution(policy, run_dir: str | os.PathLike, method: str = "integrated_gradients",
                               n_steps: int = IG_STEPS, progress: bool = True, every: int = 1) -> Path:
    """Write ``RUN_DIR/window_attribution.npz`` for ``policy`` on the run recorded in ``run_dir``
    (every ``every``-th step, :func:`window_attribution`)."""
    run = load_trace(run_dir)
    shares, worst, completeness = window_attribution(policy, run, method, n_steps, progress, every=every)
    meta = {"format": FORMAT, "version": VERSION, "num_steps": run.num_steps, "method": method, "every": every,
            "window": policy.config.core.window, "n_steps": n_steps,
            "target": "chosen action's logit" if policy.config.action == "discrete"
            else "steering output (column 0), signed towards the direction steered",
            "baseline": "black frames", "max_stream_difference": worst, "completeness": completeness,
            "trace_created_utc": run.metadata.get("created_utc"), "trace_sha256": run.sha256,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return write_archive(Path(run.path).parent / WINDOW_FILE, {"shares": shares}, meta)


@dataclass
class WindowAttribution:
    """A loaded ``window_attribution.npz``: ``shares [N, W]`` (module docstring)."""

    path: Path
    metadata: dict[str, Any]
    shares: np.ndarray

    @property
    def num_steps(self) -> int:
        return len(self.shares)

    @property
    def window(self) -> int:
        return self.shares.shape[1]


def load_window_attribution(path: str | os.PathLike, trace: RunTrace | None = None) -> WindowAttribution:
    """Load ``RUN_DIR/window_attribution.npz``; given the run's loaded ``trace``, refuse a
    file that was not computed from that very trace (its ``trace_sha256``) or has another length."""
    path = Path(path)
    if path.is_dir() or path.suffix != ".npz":
        path = path / WINDOW_FILE
    with ArchiveReader(path) as r:
        meta, n = r.metadata, r.header(FORMAT, VERSION)
        if trace is not None:
            r.require_trace(trace, n, "recompute the window attribution (nac-drive explain)")
        window = meta.get("window")
        r.require(isinstance(window, int) and window >= 1, METADATA_MEMBER,
                  f"window must be an integer >= 1, got {window!r}")
        shares = r.array("shares", "f", 2)
        r.require(shares.shape == (n, window), "shares", f"expected [{n}, {window}], got {list(shares.shape)}")
        finite = shares[np.isfinite(shares)]
        r.require(not np.isinf(shares).any() and bool(np.all((finite >= 0) & (finite <= 1 + 1e-5))), "shares",
                  "shares must lie in [0, 1] (or be NaN)")
    return WindowAttribution(path=path, metadata=meta, shares=shares.astype(np.float32, copy=False))
