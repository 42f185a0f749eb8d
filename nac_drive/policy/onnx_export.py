"""A driving policy exported to ONNX (``nac-drive export --format onnx``), for onnxruntime.

One graph per file (``graph``), batch 1, float32:

* ``"step"`` (default): what :meth:`DrivingPolicy.select_action` runs, one frame through
  ``NAC.step`` with the streaming cache (:class:`~nac_drive.nac.NACCache`) an input and an
  output: ``frame [1, C, H, W]`` uint8, ``t [1]`` float32 (seconds since the episode's first
  frame), ``cache [1, heads, window, cache_width]`` float32, ``steps []`` int64 (frames
  consumed) -> ``output [1, num_outputs]``, ``cache_out``, ``steps_out``. NAC cores only (a
  baseline's streaming state grows).
* ``"window"``: :meth:`DrivingPolicy.forward` over a window: ``frames [1, T, C, H, W]`` uint8
  (1 <= T <= window), ``t [1, T]`` float32 -> ``outputs [1, T, num_outputs]``.

The export traces the torch reference code: ``kernels.choose`` steps aside for
``torch.export`` (numba calls cannot be traced) and the Top-K takes its exportable form
(:func:`nac_drive.nac.selection._stable_top`: the same keys, ties to the newest). The file's
``metadata_props`` carry what :class:`~nac_drive.policy.onnx_policy.OnnxPolicy` needs (the
policy's config JSON, the graph, :data:`FORMAT`), so the ``.onnx`` alone drives. Needs the
``onnx`` extra (onnx, onnxscript, onnxruntime).
"""

from __future__ import annotations

import copy
import io
import json
import logging
import warnings
from contextlib import contextmanager, redirect_stdout
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from nac_drive.devices import module_device, resolve_device
from nac_drive.io.atomic import atomic_write, check_writable
from nac_drive.nac import NACCache
from nac_drive.policy.driving_policy import DrivingPolicy
from nac_drive.policy.onnx_policy import (EXTRA_HINT, FORMAT, GRAPHS, INPUTS, META_CONFIG, META_FORMAT, META_GRAPH,
                                          OUTPUTS, OnnxPolicy, session)

OPSET = 20
# The cores whose window forward has no loop over frames: the others' (lstm, gru, cfc, ltc) is
# unrolled by torch.export at the example's length, and fails on onnxruntime at any other.
EXPORTABLE_CORES = ("nac", "mha")


class StepGraph(nn.Module):
    """The ``"step"`` graph: one frame of :meth:`DrivingPolicy.step_output`, the cache passed in and out.

    frame ``[1, C, H, W]`` uint8, t ``[1]`` s since the episode's first frame, cache
    ``[1, H, window, cache_width]``, steps ``[]`` int64 -> (output ``[1, num_outputs]``, cache, steps).
    The cache's origin is 0: the policy's first frame of an episode is its time 0.
    """

    def __init__(self, policy: DrivingPolicy):
        super().__init__()
        self.policy = policy

    def forward(self, frame: torch.Tensor, t: torch.Tensor, cache: torch.Tensor, steps: torch.Tensor):
        state = NACCache(cache, steps=steps, origin=torch.zeros_like(t))
        y, state = self.policy.core.step(self.policy.encoder(frame), state, t=t)
        return self.policy.head(y), state.feats, state.steps


class WindowGraph(nn.Module):
    """The ``"window"`` graph: :meth:`DrivingPolicy.forward`, frames ``[1, T, C, H, W]``, t ``[1, T]``."""

    def __init__(self, policy: DrivingPolicy):
        super().__init__()
        self.policy = policy

    def forward(self, frames: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.policy(frames, t)


def example_inputs(policy: DrivingPolicy, graph: str, frames: int | None = None, seed: int = 0) -> tuple:
    """Inputs of ``graph`` for ``policy`` (random frames, ``frame_dt`` apart; the window
    graph: ``frames`` of them, default the policy's window), as torch tensors."""
    gen = torch.Generator().manual_seed(seed)
    n = policy.config.core.window if frames is None else frames
    pixels = torch.randint(0, 256, (1, n, *policy.frame_shape), dtype=torch.uint8, generator=gen)
    t = torch.arange(n, dtype=torch.float32)[None] * policy.config.frame_dt
    if graph == "window":
        return pixels, t
    return pixels[:, -1], t[:, -1], policy.core.init_state(1).feats, torch.tensor(0)


def check_exportable(policy: DrivingPolicy, graph: str) -> None:
    """One-line ``ValueError`` for what cannot be exported, before any export work."""
    if graph not in GRAPHS:
        raise ValueError(f"graph: must be one of {GRAPHS}, got {graph!r}")
    if policy.config.core.core not in EXPORTABLE_CORES:
        raise ValueError(f"core: a {policy.config.core.core!r} core steps its frames in a Python loop, which the "
                         f"exporter fixes at one window length; only {' and '.join(EXPORTABLE_CORES)} policies "
                         f"export to ONNX")
    if graph == "step" and policy.config.core.core != "nac":
        raise ValueError(f"graph: the step graph streams a NAC core's cache; this policy's core is "
                         f"{policy.config.core.core!r}: export --graph window")
    if next(policy.parameters()).dtype != torch.float32:
        raise ValueError(f"policy: exported in float32, this one is {next(policy.parameters()).dtype}")


def export_onnx(policy: DrivingPolicy, path: str | Path, graph: str = "step", device: str | None = None) -> dict:
    """Write ``policy`` as an ONNX ``graph`` to ``path`` and check it before it takes that name
    (atomically): :class:`OnnxPolicy` loads it and onnxruntime runs it on example inputs beside
    torch on ``device`` (``auto``, ``cpu``, ``cuda``, ...: :func:`~nac_drive.devices.resolve_device`;
    default: where the policy is); a file that fails is removed. The graph is always traced on
    the CPU (a CPU copy of a policy that lives elsewhere): onnxruntime runs it there, and a
    trace would keep a GPU's device in its constants. Returns ``{"path", "graph", "max_abs_diff"}``."""
    check_on = module_device(policy) if device is None else resolve_device(device)
    check_exportable(policy, graph)
    check_writable(path)   # before the 10-40 s of exporting
    try:
        import onnx   # noqa: F401  (torch's exporter needs onnx and onnxscript)
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ValueError(f"export --format onnx needs the 'onnx' extra ({e.name} is missing): {EXTRA_HINT}") from None
    reference = _on(policy.eval(), check_on)
    policy = _on(policy, torch.device("cpu"))
    module = (StepGraph(policy) if graph == "step" else WindowGraph(policy)).eval()
    args = example_inputs(policy, graph)
    dynamic = None
    if graph == "window":   # T from 1 to the window (torch.export calls 1 a special size: its range starts at 2)
        span = torch.export.Dim("T", min=1, max=policy.config.core.window)
        dynamic = {"frames": {1: span}, "t": {1: span}}
    with torch.no_grad(), _quiet():
        program = torch.onnx.export(module, args, dynamo=True, opset_version=OPSET, dynamic_shapes=dynamic,
                                    input_names=list(INPUTS[graph]), output_names=list(OUTPUTS[graph]),
                                    verbose=False)
    proto = program.model_proto
    for key, value in ((META_FORMAT, FORMAT), (META_GRAPH, graph), (META_CONFIG, json.dumps(asdict(policy.config)))):
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.doc_string = f"nac-drive {policy.config.task} policy, {graph} graph"
    checked = {}

    def write_and_check(tmp):   # the file takes its name only once it drives: never a broken .onnx
        Path(tmp).write_bytes(proto.SerializeToString())
        try:
            OnnxPolicy(tmp)
            checked["max_abs_diff"] = max_abs_diff(reference, tmp, graph)
        except Exception as e:   # onnxruntime's errors derive from Exception only
            why = " ".join(str(e).replace(str(tmp), "the file").split())[:200]
            raise ValueError(f"{path}: the exported {graph} graph does not run on onnxruntime ({why}); "
                             f"nothing was written") from None

    atomic_write(path, write_and_check)
    return {"path": str(path), "graph": graph, **checked}


def _on(policy: DrivingPolicy, device: torch.device) -> DrivingPolicy:
    """``policy`` itself if it lives on ``device`` (``cuda`` names the current GPU), else a copy moved there."""
    here = module_device(policy)
    if here.type == device.type and device.index in (None, here.index):
        return policy
    return copy.deepcopy(policy).to(device)


@contextmanager
def _quiet():
    """The exporter's progress lines, its optimizer's notes and its warnings about names, hidden:
    the export either works or raises."""
    optimizer = logging.getLogger("onnxscript")
    level, optimizer.level = optimizer.level, logging.ERROR
    try:
        with warnings.catch_warnings(), redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        optimizer.setLevel(level)


def max_abs_diff(policy: DrivingPolicy, path: str | Path, graph: str) -> float:
    """The largest |torch - onnxruntime| of ``graph``'s outputs on its example inputs (the window
    graph: a window of 3 frames too, so the dynamic length is checked), torch on the policy's
    device, onnxruntime on the CPU."""
    run = session(path)
    device = module_device(policy)
    worst = 0.0
    for frames in ((None, 3) if graph == "window" else (None,)):
        args = tuple(a.cpu() for a in example_inputs(policy, graph, frames=frames, seed=1))
        with torch.no_grad():
            module = WindowGraph(policy) if graph == "window" else StepGraph(policy)
            ref = module(*(a.to(device) for a in args))
        got = run.run(None, dict(zip(INPUTS[graph], (a.numpy() for a in args))))
        refs = ref if isinstance(ref, tuple) else (ref,)
        worst = max(worst, *(float(np.abs(r.cpu().numpy() - g).max()) for r, g in zip(refs, got)))
    return worst
