"""Per-step traces of a closed-loop run: a recorder for the driving loop and a loader.

The driving loop calls :meth:`RunRecorder.add` once per step and :meth:`RunRecorder.save`
at the end. The recorder holds only the steps not yet written: every ``chunk_steps`` steps
(500) it hands them to a background writer thread, which writes them as the next chunk, once,
and never rewrites it. :func:`load_trace` reads the chunks back into one :class:`RunTrace`.

Files: ``RUN_DIR/trace/chunk-000000.npz``, ``chunk-000001.npz``, ... (see
:mod:`nac_drive.interpret.chunks`). Each chunk is a plain ``.npz`` (see
:mod:`nac_drive.interpret.archive`: no pickles, ``np.load(path, allow_pickle=False)`` opens it,
plus a ``metadata.json`` member), written atomically: a kill leaves every chunk written before
it whole and readable, so a killed run loses at most its last ``2 * chunk_steps`` steps (the
chunk being filled, and the one being written, if the kill lands in the ~0.2 s that takes). A run's
identity (:attr:`RunTrace.sha256`, which saliency and explain files record) is
:func:`~nac_drive.interpret.chunks.chunks_sha256` over its chunks. Schema, version 2; the arrays
of a chunk hold its own steps. N = steps, A / E = policy / expert action size, D = d_model,
H = heads, K = selected keys per query, n_* = backbone group sizes:

=====================  ==========  ===========================================================
member                 dtype       shape and meaning
=====================  ==========  ===========================================================
frames_jpeg            uint8       [bytes] the JPEG files of all frames, concatenated
frame_offsets          int64       [N+1] frame i is ``frames_jpeg[off[i]:off[i+1]]`` (RGB)
timestamp              float64     [N] seconds
episode                int32       [N] episode counter (:meth:`RunRecorder.new_episode`)
policy_action          float32     [N, A] the action the policy output (a discrete action
                                   is one column holding its index)
expert_action          float32     [N, E] expert / teacher action, NaN where unknown
                                   (E = 0 if no step had one)
reward                 float32     [N] NaN where unknown
cross_track_error      float32     [N] NaN where unknown
curvature              float32     [N] optional: the scene from the simulator's track
heading_error                      (:mod:`nac_drive.simulators.centre_line`: curvature
speed                              ahead 1/units, left +; heading error radians, left +;
                                   speed units/s; units: CarRacing's track units, the
                                   Udacity emulator's metres), NaN where unknown
has_nac                bool        [N] the step came with a NAC trace
nac_step               int64       [N] the layer's step index of the query (-1: no trace)
q, k, v                float32     [N, D] sensory gate activations
inter_mean, inter_top  float32     [N, H, n_inter] backbone inter layer: mean over the
                                   valid selected (query, key) pairs / value for the
                                   top-weighted pair
command_mean, _top     float32     [N, H, n_command] same for the command layer
motor_mean, motor_top  float32     [N, H, n_motor] same for the motor layer
phi, tau, t_interp,    float32     [N, H, K] per selected key; NaN in an empty slot
logits
weights                float32     [N, H, K] attention weights (0 in an empty slot)
key_step               int64       [N, H, K] layer step index of each selected key, -1: empty
key_age                int32       [N, H, K] frames ago (``nac_step - key_step``), -1: empty
wiring_q/_k/_v         uint8       [D, input_dim] sensory gate masks (chunk 0, if the layer was given)
wiring_sensory_to_     uint8       [2*depth, n_inter], [n_inter, n_command],
inter/_inter_to_                   [n_command, n_motor] backbone masks (if the layer was given)
command/_command_to_motor
=====================  ==========  ===========================================================

The scene members (:data:`SCENE_FIELDS`) are optional: a chunk written before they existed
loads with NaN in them. Without any NAC trace in a chunk, its NAC members keep their ranks with size-0 axes
(e.g. q ``[N, 0]``). Steps without a trace hold NaN (key_age / key_step -1). The loader pads
each chunk to the run's sizes: K to the run's largest, and an axis of size 0 (nothing of it
recorded in that chunk: no NAC trace, no expert action) to the run's size, with NaN (-1 for
key_step / key_age, 0 for weights of a step with a trace).

``metadata.json`` of every chunk: ``format`` ("nac-drive-trace"), ``version`` (2), ``chunk``
(its index), ``first_step`` (the run's step of its first row), ``num_steps`` (its rows),
``frame_shape`` [H, W, 3] (null before the first frame) and ``run`` (free-form JSON given by
the caller: policy config, env, seeds ...; the caller may add to it while recording, e.g. the
laps at the end, and the last chunk's wins). Chunk 0 also holds what is fixed for the run,
written once: ``jpeg_quality``, ``created_utc``, ``action_names`` (policy) and
``expert_action_names`` (lists or null), ``nac`` (null, or the layer's hyper-parameters,
``groups`` = neuron group sizes {sensory, inter, command, motor} of one head's backbone,
``wiring_shapes``), and the wiring members. :attr:`RunTrace.metadata` is chunk 0's with the
run's ``num_steps``, ``frame_shape``, the last ``run`` and ``chunks`` (their count) in place
of ``chunk`` and ``first_step``.

A version-1 trace (one ``RUN_DIR/trace.npz`` rewritten whole on every save, the same members)
still loads; its identity is the file's SHA-256.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nac_drive.interpret.archive import (ARCHIVE_LIMIT, METADATA_MEMBER, ArchiveError, ArchiveReader, check_jpeg_pack,
                                         decode_jpeg, encode_jpeg, pack_jpegs, write_archive)
from nac_drive.interpret.chunks import CHUNK, chunk_indices, chunk_path, chunk_paths, chunks_sha256
from nac_drive.io import bounded_json

TRACE_DIR = "trace"             # RUN_DIR/trace/chunk-000000.npz, ...
LEGACY_TRACE_FILE = "trace.npz"  # version 1: one archive, rewritten whole on every save
FORMAT, VERSION, LEGACY_VERSION = "nac-drive-trace", 2, 1
CHUNK_STEPS = 500               # steps a recorder holds before writing them as a chunk
BACKBONE_GROUPS = ("inter", "command", "motor")
PER_KEY = ("phi", "tau", "t_interp", "logits", "weights")
MAX_ACTION_NAMES = 1000
SCENE_FIELDS = ("curvature", "heading_error", "speed")   # optional per-step members: the road's scene
WIRING_FIELDS = ("wiring_q", "wiring_k", "wiring_v", "wiring_sensory_to_inter", "wiring_inter_to_command",
                 "wiring_command_to_motor")


# ------------------------------------------------------------------ NAC trace reduction
def check_nac_step(trace, step: int) -> None:
    """Refuse a :class:`~nac_drive.nac.NACTrace` that is not one streamed step (batch 1,
    T = 1, as :meth:`NAC.step` returns it) or that selects a key later than ``step``, its
    query's step index (``cache.steps - 1`` after the step)."""
    q = trace.q
    if q.ndim != 3 or tuple(q.shape[:2]) != (1, 1):
        raise ValueError(f"nac_trace: expected batch 1 and T = 1 (NAC.step), got q of shape {list(q.shape)}")
    idx = trace.topk_idx
    if idx.numel() and int(idx.max()) > step:
        raise ValueError(f"nac_trace.topk_idx: a selected key (step {int(idx.max())}) is later than the query step "
                         f"{step}; was the layer's cache reset without RunRecorder.new_episode()?")


def reduce_nac_trace(trace, step: int) -> dict[str, np.ndarray]:
    """One step's :class:`~nac_drive.nac.NACTrace` (batch 1, T = 1) -> the trace's NAC
    members for that step (:func:`reduce_nac_steps` without the step axis): q, k, v
    ``[D]``; ``<group>_mean`` / ``<group>_top`` ``[H, n]``; phi, tau, t_interp, logits,
    weights, key_step, key_age ``[H, K]``."""
    check_nac_step(trace, step)
    return {name: x[0] for name, x in reduce_nac_steps([trace], [step]).items()}


def reduce_nac_steps(traces, steps) -> dict[str, np.ndarray]:
    """Streamed steps' NACTraces (each batch 1, T = 1: :func:`check_nac_step`) and each one's
    query step -> the trace's NAC members ``[N, ...]`` (the module docstring's schema): q, k,
    v; per head, each backbone group's mean over the valid selected keys and its value for
    the top-weighted key; the per-key stages with NaN in an empty slot (weights 0);
    key_step and key_age (-1 empty). K is padded to the largest among the steps (a layer
    without a window selects more keys as its cache grows). One pass over all the steps:
    the recorder's writer thread reduces a whole chunk at once."""
    raw = _stack_nac_steps(traces)
    idx = raw["topk_idx"]                                                            # [N, H, K]
    valid = idx >= 0
    out: dict[str, np.ndarray] = {name: raw[name] for name in ("q", "k", "v")}
    weights = raw["weights"]
    top = np.where(valid, weights, -np.inf).argmax(axis=-1)[..., None, None]          # [N, H, 1, 1]
    any_valid = valid.any(axis=-1)[..., None]                                        # [N, H, 1]
    count = valid.sum(axis=-1)[..., None]                                            # [N, H, 1]
    for name in BACKBONE_GROUPS:
        x = raw[name]                                                                # [N, H, K, n]
        total = np.where(valid[..., None], x, 0.0).sum(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"{name}_mean"] = np.where(count > 0, total / count, np.nan).astype(np.float32)
        out[f"{name}_top"] = np.where(any_valid, np.take_along_axis(x, top, axis=2)[:, :, 0],
                                      np.nan).astype(np.float32)
    for name in PER_KEY:
        out[name] = raw[name] if name == "weights" else np.where(valid, raw[name], np.nan).astype(np.float32)
    out["key_step"] = idx
    out["key_age"] = np.where(valid, np.asarray(steps, np.int64)[:, None, None] - idx, -1).astype(np.int32)
    return out


_GATES = ("q", "k", "v")                                  # [B=1, T=1, D] in a step's NACTrace
_PAIR_MEMBERS = (*BACKBONE_GROUPS, *PER_KEY, "topk_idx")   # [B=1, H, T=1, K, ...]


def _stack_nac_steps(traces) -> dict[str, np.ndarray]:
    """NACTraces of steps -> their members stacked: q, k, v ``[N, D]``, the rest
    ``[N, H, K, ...]`` (float32; topk_idx int64), each step's K padded to the largest with
    empty slots (topk_idx -1, weight 0, NaN). One concatenation per member: a chunk's
    hundreds of small tensors cost one call, not one each."""
    import torch
    import torch.nn.functional as F

    out = {}
    for name in (*_GATES, *_PAIR_MEMBERS):
        steps = [getattr(trace, name) for trace in traces]
        per_key = name in _PAIR_MEMBERS
        shapes = [a.shape[1:2] + a.shape[3:] if per_key else a.shape[2:] for a in steps]   # without B and T
        fixed = [shape[:1] + shape[2:] if per_key else shape for shape in shapes]          # all but K must agree
        for i, shape in enumerate(shapes):
            if fixed[i] != fixed[0]:
                raise ValueError(f"nac_trace.{name}: shape {list(shape)} at step {i} differs from {list(shapes[0])}")
        if per_key:
            k_max = max(a.shape[3] for a in steps)
            fill = -1 if name == "topk_idx" else (0.0 if name == "weights" else math.nan)
            steps = [a if a.shape[3] == k_max else F.pad(a, (0, 0) * (a.ndim - 4) + (0, k_max - a.shape[3]), value=fill)
                     for a in steps]
        stacked = torch.cat(steps).to(torch.int64 if name == "topk_idx" else torch.float32)   # (bf16 has no numpy)
        stacked = stacked.numpy(force=True)
        out[name] = stacked[:, 0] if not per_key else stacked[:, :, 0]
    return out


def attention_entropy(weights: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """weights, valid ``[..., K]`` -> ``[...]`` entropy / log(valid keys) (NaN below 2 keys);
    each key's -w log w by scipy's ``special.entr`` (0 for a weight of 0)."""
    from scipy.special import entr

    entropy = entr(np.where(valid, weights, 0.0).astype(np.float64)).sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):   # below 2 keys it divides by log 1 or log 0
        return np.where(valid.sum(axis=-1) >= 2, entropy / np.log(valid.sum(axis=-1)), np.nan)


def describe_nac(layer) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A NAC layer -> (JSON description, wiring masks as uint8 arrays)."""
    n_inter, n_command, n_motor = layer.backbone_wiring.sizes
    bw = layer.backbone_wiring
    wiring = {
        "wiring_q": layer.q_gate.mask, "wiring_k": layer.k_gate.mask, "wiring_v": layer.v_gate.mask,
        "wiring_sensory_to_inter": bw.sensory_to_inter, "wiring_inter_to_command": bw.inter_to_command,
        "wiring_command_to_motor": bw.command_to_motor,
    }
    wiring = {name: (np.asarray(m.detach().cpu() if hasattr(m, "detach") else m) > 0).astype(np.uint8)
              for name, m in wiring.items()}
    info = {
        "input_dim": layer.input_dim, "d_model": layer.d_model, "num_heads": layer.num_heads,
        "depth": layer.depth, "topk": layer.topk, "window": layer.window, "mode": layer.mode,
        "select": layer.select, "time_input": layer.time_input, "sparsity": layer.sparsity, "seed": layer.seed,
        "groups": {"sensory": 2 * layer.depth, "inter": n_inter, "command": n_command, "motor": n_motor},
        "wiring_shapes": {name: list(m.shape) for name, m in wiring.items()},
    }
    return info, wiring


# ------------------------------------------------------------------ the recorded run
@dataclass
class RunTrace:
    """A loaded trace (all its chunks, in order); fields as in the module docstring's schema."""

    path: Path
    metadata: dict[str, Any]
    frames_jpeg: np.ndarray
    frame_offsets: np.ndarray
    timestamp: np.ndarray
    episode: np.ndarray
    policy_action: np.ndarray
    expert_action: np.ndarray
    reward: np.ndarray
    cross_track_error: np.ndarray
    has_nac: np.ndarray
    nac_step: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    inter_mean: np.ndarray
    inter_top: np.ndarray
    command_mean: np.ndarray
    command_top: np.ndarray
    motor_mean: np.ndarray
    motor_top: np.ndarray
    phi: np.ndarray
    tau: np.ndarray
    t_interp: np.ndarray
    logits: np.ndarray
    weights: np.ndarray
    key_step: np.ndarray
    key_age: np.ndarray
    curvature: np.ndarray
    heading_error: np.ndarray
    speed: np.ndarray
    wiring: dict[str, np.ndarray] = field(default_factory=dict)
    sha256: str = ""
    """the trace's identity, what a saliency file computed from it records: hex SHA-256 of the
    chunks' SHA-256 digests (:func:`~nac_drive.interpret.chunks.chunks_sha256`; of a version-1
    ``trace.npz``, the file's)."""

    @property
    def num_steps(self) -> int:
        return len(self.timestamp)

    @property
    def has_scene(self) -> bool:
        """Whether any step has the road's scene (:data:`SCENE_FIELDS`; a CarRacing drive's, or
        a Udacity emulator drive's in-process)."""
        return bool(np.isfinite(self.curvature).any())

    def frame_jpeg(self, i: int) -> bytes:
        return self.frames_jpeg[self.frame_offsets[i]:self.frame_offsets[i + 1]].tobytes()

    def attention_entropy(self) -> np.ndarray:
        """``[N, H]``: the entropy of each query's attention weights over its selected keys,
        divided by its maximum log(selected keys), so 1 means uniform; NaN where a step has
        no trace or a head fewer than 2 keys. In mode exact the logits lie in (0, 1), so
        weights differ by less than a factor e and this stays near 1 (docs/ARCHITECTURE.md)."""
        return attention_entropy(self.weights, self.key_step >= 0)

    def frame(self, i: int) -> np.ndarray:
        """Frame ``i`` as uint8 RGB ``[H, W, 3]``."""
        try:
            return decode_jpeg(self.frame_jpeg(i))
        except ValueError as e:
            raise ArchiveError(self.path, "frames_jpeg", f"frame {i}: {e}") from None

    # ---------------------------------------------------------- short views (a notebook's repr)
    def episode_spans(self) -> list[tuple[int, int, int]]:
        """``(episode, start, stop)`` of each stretch of equal ``episode`` values, in order:
        steps ``start:stop`` are that episode (the dashboard and the reprs read episodes so)."""
        cuts = np.flatnonzero(np.diff(self.episode)) + 1
        starts, stops = np.r_[0, cuts], np.r_[cuts, self.num_steps]
        return [(int(self.episode[a]), int(a), int(b)) for a, b in zip(starts, stops) if b > a]

    def _traced(self) -> list[str]:
        """What the run recorded, in words (names from the file: escape before markup)."""
        meta, shape = self.metadata, self.metadata.get("frame_shape")
        out = [f"frames {shape[0]}x{shape[1]}" if isinstance(shape, list) and len(shape) == 3 else "frames"]
        names = meta.get("action_names")
        out.append(f"policy action [{self.policy_action.shape[1]}]" + (f" ({', '.join(map(str, names))[:80]})"
                                                                     if isinstance(names, list) else ""))
        if self.expert_action.shape[1] and np.isfinite(self.expert_action).any():
            out.append(f"expert action [{self.expert_action.shape[1]}]")
        out += [name for name, a in (("reward", self.reward), ("cross-track error", self.cross_track_error))
                if np.isfinite(a).any()]
        if self.has_scene:
            out.append("scene (curvature, heading error, speed)")
        nac = meta.get("nac")
        if nac and self.has_nac.any():
            out.append(f"NAC ({nac['num_heads']} heads, top-{nac['topk']}, window {nac['window']}, "
                       f"mode {str(nac['mode'])[:20]}) on {int(self.has_nac.sum())} steps")
        return out

    def _returns(self) -> list[float]:
        """Each episode's return (sum of its known rewards); empty when no reward is known."""
        if not np.isfinite(self.reward).any():
            return []
        return [float(np.nansum(self.reward[a:b])) for _, a, b in self.episode_spans()]

    def __repr__(self) -> str:
        """A line, never the arrays (a dataclass repr of them runs to tens of kB)."""
        path = str(self.path)
        path = path if len(path) <= 120 else "..." + path[-117:]
        returns = self._returns()
        text = f", returns mean {np.mean(returns):.1f} (min {min(returns):.1f}, max {max(returns):.1f})" \
            if returns else ""
        return (f"RunTrace({path!r}, {self.num_steps} steps, {len(self.episode_spans())} episodes{text}; "
                f"{'; '.join(self._traced())})")[:499]

    def _repr_html_(self) -> str:
        """Jupyter's view: a few lines (steps, episodes, returns, what was traced)."""
        import html

        spans, returns = self.episode_spans(), self._returns()
        lengths = ", ".join(str(b - a) for _, a, b in spans[:8]) + (", ..." if len(spans) > 8 else "")
        rows = [("steps", str(self.num_steps)),
                ("episodes", f"{len(spans)}" + (f": {lengths} steps" if spans else ""))]
        if returns:
            shown = ", ".join(f"{r:.1f}" for r in returns[:8]) + (", ..." if len(returns) > 8 else "")
            rows.append(("returns", f"mean {np.mean(returns):.1f}: {shown}"))
        rows.append(("traced", ", ".join(self._traced())))
        body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{k}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in rows)
        return f"<div><b>RunTrace</b> <code>{html.escape(str(self.path))}</code><table>{body}</table></div>"


# (member, dtype kinds, rank, trailing-shape key) of every array member. Axis names
# in the key are checked to agree across members.
_SCHEMA: list[tuple[str, str, tuple[str, ...]]] = [
    ("timestamp", "f", ("N",)), ("episode", "i", ("N",)),
    ("policy_action", "f", ("N", "A")), ("expert_action", "f", ("N", "E")),
    ("reward", "f", ("N",)), ("cross_track_error", "f", ("N",)),
    ("has_nac", "b", ("N",)), ("nac_step", "i", ("N",)),
    ("q", "f", ("N", "D")), ("k", "f", ("N", "D")), ("v", "f", ("N", "D")),
    *[(f"{g}_{r}", "f", ("N", "H", f"n_{g}")) for g in BACKBONE_GROUPS for r in ("mean", "top")],
    *[(name, "f", ("N", "H", "K")) for name in PER_KEY],
    ("key_step", "i", ("N", "H", "K")), ("key_age", "i", ("N", "H", "K")),
]
# Members a chunk may lack (written before they existed): read as NaN [N].
_OPTIONAL_SCHEMA = [(name, "f", ("N",)) for name in SCENE_FIELDS]
_MEMBERS = _SCHEMA + _OPTIONAL_SCHEMA


def load_trace(path: str | os.PathLike) -> RunTrace:
    """Load a run's trace: give the run directory, its ``trace/`` folder or one of its chunks
    (all are read), or a version-1 ``trace.npz``.

    Raises :class:`~nac_drive.interpret.archive.ArchiveError` naming the file (or folder) and
    field when a chunk is missing, corrupt, does not match the schema or disagrees with the
    chunks before it.
    """
    where = _trace_path(Path(path))
    legacy = where.is_file()
    parts: list[_Chunk] = []
    axes: dict[str, int] = {}   # the run's size of each axis but N (K: the largest)
    inflated = 0
    for i, chunk in enumerate([where] if legacy else chunk_paths(where)):
        with ArchiveReader(chunk) as r:
            inflated += r.inflated   # all chunks together, as one archive: checked before reading
            if inflated > ARCHIVE_LIMIT:
                raise ArchiveError(where, None, f"its chunks would inflate to more than the {ARCHIVE_LIMIT} bytes "
                                                "allowed")
            parts.append(_read_chunk(r, None if legacy else i, sum(p.num_steps for p in parts),
                                     parts[0].metadata if parts else None, axes))
    sha256 = parts[0].sha256 if legacy else chunks_sha256([p.sha256 for p in parts])
    return _joined(where, parts, axes, sha256)


def _trace_path(path: Path) -> Path:
    """The trace folder (or version-1 file) that ``path`` names: see :func:`load_trace`."""
    if path.is_file():
        return path.parent if CHUNK.fullmatch(path.name) else path
    if not path.is_dir():
        raise ArchiveError(path, None, "no such file or folder")
    if (path / TRACE_DIR).is_dir():
        return path / TRACE_DIR
    if (path / LEGACY_TRACE_FILE).is_file():
        return path / LEGACY_TRACE_FILE
    if path.name == TRACE_DIR or chunk_indices(path):
        return path               # the trace folder itself
    return path / TRACE_DIR       # a run folder without a trace: chunk_paths says "no such folder"


@dataclass
class _Chunk:
    """One chunk as read and checked: its metadata, arrays (``values``) and wiring (chunk 0)."""

    metadata: dict[str, Any]
    num_steps: int
    values: dict[str, np.ndarray]
    wiring: dict[str, np.ndarray]
    sha256: str


def _read_chunk(r: ArchiveReader, index: int | None, first_step: int, run: dict[str, Any] | None,
                axes: dict[str, int]) -> _Chunk:
    """Read and check chunk ``index`` (None: a version-1 file), whose first row is the run's step
    ``first_step``; ``run`` is chunk 0's metadata (None: this is chunk 0); ``axes`` the run's axis
    sizes so far, updated: each must agree across chunks, except K (the largest is kept) and a
    size 0 (nothing of that axis recorded in a chunk)."""
    meta = r.metadata
    n = r.header(FORMAT, LEGACY_VERSION if index is None else VERSION)
    if index is not None:
        r.require((meta.get("chunk"), meta.get("first_step")) == (index, first_step), METADATA_MEMBER,
                  f"says chunk {meta.get('chunk')!r} from step {meta.get('first_step')!r}, its place in the trace is "
                  f"chunk {index} from step {first_step}")
    frames, offsets = check_jpeg_pack(r, "frames_jpeg", "frame_offsets", n)
    values: dict[str, np.ndarray] = {"frames_jpeg": frames, "frame_offsets": offsets}
    sizes: dict[str, int] = {"N": n}
    for name, kinds, names in _MEMBERS:
        if name in SCENE_FIELDS and not r.has(name):
            values[name] = np.full(n, np.nan, np.float32)
            continue
        a = r.array(name, kinds, len(names))
        for axis, size in zip(names, a.shape):
            expected = sizes.setdefault(axis, size)
            r.require(size == expected, name, f"axis {axis} has size {size}, other fields say {expected}")
            if axis != "N" and size:
                earlier = axes.setdefault(axis, size)
                r.require(size == earlier or axis == "K", name, f"axis {axis} has size {size}, earlier chunks say {earlier}")
                axes[axis] = max(size, earlier)
        values[name] = a
    shape = meta.get("frame_shape")
    wiring: dict[str, np.ndarray] = {}
    if run is None:   # chunk 0 (or a version-1 file): what is fixed for the run
        wiring = {name: r.array(name, "u", 2) for name in WIRING_FIELDS if r.has(name)}
        _check_nac_info(r, meta.get("nac"), wiring)
        for key in ("action_names", "expert_action_names"):
            names = meta.get(key)
            r.require(names is None or (isinstance(names, list) and len(names) <= MAX_ACTION_NAMES
                                        and all(isinstance(name, str) for name in names)),
                      METADATA_MEMBER, f"'{key}' must be null or a list of at most {MAX_ACTION_NAMES} names")
    else:
        known = run.get("frame_shape")
        r.require(shape is None or known is None or shape == known, METADATA_MEMBER,
                  f"frame_shape {shape!r} differs from chunk 0's {known!r}")
    return _Chunk(meta, n, values, wiring, r.sha256)


def _joined(where: Path, parts: list[_Chunk], axes: dict[str, int], sha256: str) -> RunTrace:
    """The chunks' rows as one run, each field padded to the run's axis sizes (module docstring)."""
    meta, values = dict(parts[0].metadata), dict(parts[0].values)
    if len(parts) > 1:
        n = sum(p.num_steps for p in parts)
        starts = np.cumsum([0] + [p.num_steps for p in parts])
        frames = [p.values["frames_jpeg"] for p in parts]
        bases = np.cumsum([0] + [len(f) for f in frames])
        values["frames_jpeg"] = np.concatenate(frames)
        values["frame_offsets"] = np.concatenate([p.values["frame_offsets"][:-1] + b for p, b in zip(parts, bases)]
                                                 + [bases[-1:]])
        for name, _, names in _MEMBERS:
            dtype = parts[0].values[name].dtype
            fill = -1 if dtype.kind in "iub" else (0.0 if name == "weights" else np.nan)
            out = np.full((n, *(axes.get(axis, 0) for axis in names[1:])), fill, dtype=dtype)
            for p, start in zip(parts, starts):
                a = p.values[name]
                out[(slice(start, start + len(a)), *(slice(0, s) for s in a.shape[1:]))] = a
            values[name] = out
        values["weights"][~values["has_nac"]] = np.nan   # a step without a trace: NaN, not an empty slot's 0
        shapes = [p.metadata.get("frame_shape") for p in parts]
        meta.update(num_steps=n, run=parts[-1].metadata.get("run"),
                    frame_shape=next((s for s in shapes if s is not None), None))
    if meta.pop("chunk", None) is not None:   # (not a version-1 file)
        meta["chunks"] = len(parts)
        meta.pop("first_step", None)
    return RunTrace(path=where, metadata=meta, wiring=parts[0].wiring, sha256=sha256, **values)

def _check_nac_info(r: ArchiveReader, info: Any, wiring: dict[str, np.ndarray]) -> None:
    """The ``nac`` metadata (:func:`describe_nac`) has the types the dashboard reads, and each
    wiring mask the shape the layer it describes has."""
    if info is None:
        return
    groups = info.get("groups") if isinstance(info, dict) else None
    r.require(isinstance(info, dict) and isinstance(groups, dict) and isinstance(info.get("mode"), str)
              and all(isinstance(info.get(k), int) for k in ("d_model", "num_heads", "topk", "depth", "input_dim"))
              and isinstance(info.get("window"), (int, type(None)))
              and all(isinstance(groups.get(g), int) for g in ("sensory", "inter", "command", "motor")),
              METADATA_MEMBER, "'nac' must be null or a NAC description (integer sizes and groups, a mode name)")
    d, inter, command, motor = info["d_model"], groups["inter"], groups["command"], groups["motor"]
    expected = {"wiring_q": (d, info["input_dim"]), "wiring_k": (d, info["input_dim"]),
                "wiring_v": (d, info["input_dim"]), "wiring_sensory_to_inter": (2 * info["depth"], inter),
                "wiring_inter_to_command": (inter, command), "wiring_command_to_motor": (command, motor)}
    for name, mask in wiring.items():
        r.require(mask.shape == expected[name], name,
                  f"shape {list(mask.shape)}, the NAC the metadata describes has {list(expected[name])}")


# ------------------------------------------------------------------ the recorder
class RunRecorder:
    """Records one closed-loop run step by step into ``RUN_DIR/trace/``, one chunk at a time.

    Args:
        run_dir: directory of the run (created on the first write).
        metadata: free-form JSON-serialisable description (policy config, env, seeds); it may
            grow while recording (each chunk holds it as it was, the last chunk's wins).
        nac: the policy's NAC layer, to store its hyper-parameters and wiring masks.
        action_names, expert_action_names: optional labels of the action columns.
        jpeg_quality: JPEG quality of the stored frames (1-100).
        chunk_steps: the steps of a chunk; :meth:`add` hands them to the writer as the next
            chunk when there are this many (``trace/chunk-NNNNNN.npz``, never rewritten).

    Off the control loop: :meth:`add` keeps the step's frame and NAC trace as they are, and one
    background writer thread JPEG-encodes a full chunk's frames, reduces its traces at once
    (:func:`reduce_nac_steps`) and writes it (OpenCV, torch and zlib release the GIL, so a second
    core takes most of that work) while :meth:`add` fills the next. The recorder holds at most
    two chunks of steps: the one being filled and the one being written (a chunk that fills
    while the writer is still busy waits for it). Its RAM is about ``2 * chunk_steps`` raw
    frames: ~28 MB for CarRacing's 96x96 frames, ~150 MB for the Udacity camera's 320x160.
    A writer error is raised, as the same
    one-line error, by the next :meth:`add` or :meth:`save` (and by every later one: no chunk
    is written after a failed one, so the trace never has a gap). :meth:`save` waits for the
    writer, so after it every step is on disk; so does interpreter exit, for a chunk under way.

    The first write deletes the chunks an earlier recording left in ``RUN_DIR/trace/`` (a
    folder holds one run). Use as a context manager to save on exit, or call :meth:`save`.
    """

    def __init__(self, run_dir: str | os.PathLike, metadata: dict[str, Any] | None = None, nac=None,
                 action_names: list[str] | None = None, expert_action_names: list[str] | None = None,
                 jpeg_quality: int = 90, chunk_steps: int = CHUNK_STEPS):
        if not 1 <= int(jpeg_quality) <= 100:
            raise ValueError(f"jpeg_quality: must be in 1..100, got {jpeg_quality!r}")
        if int(chunk_steps) < 1:
            raise ValueError(f"chunk_steps: must be >= 1, got {chunk_steps!r}")
        try:
            json.dumps(metadata or {}, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"metadata: must be JSON-serialisable ({e})") from e
        self.run_dir = Path(run_dir)
        self.metadata = dict(metadata or {})
        self.jpeg_quality, self.chunk_steps = int(jpeg_quality), int(chunk_steps)
        self.action_names, self.expert_action_names = action_names, expert_action_names
        self.nac_info, self.wiring = describe_nac(nac) if nac is not None else (None, {})
        self._rows: list[dict[str, Any]] = []   # the steps of the chunk being filled
        self._chunks, self._written = 0, 0      # chunks handed to the writer, and the steps they hold
        self._written_metadata: str | None = None   # ``metadata`` as the last chunk holds it (JSON)
        self._writer: threading.Thread | None = None   # writing the last chunk handed over
        self._error: BaseException | None = None   # what stopped the writer
        self._frame_shape: tuple[int, ...] | None = None
        self._widths: dict[str, int] = {}   # each action's size, fixed by its first step
        self._episode = 0
        self._nac_steps = 0  # NAC traces seen in this episode: the layer's step counter

    @property
    def path(self) -> Path:
        """The trace folder, ``RUN_DIR/trace``."""
        return self.run_dir / TRACE_DIR

    def __len__(self) -> int:
        """Steps recorded, written or not."""
        return self._written + len(self._rows)

    @property
    def pending(self) -> int:
        """Steps of the chunk being filled, not handed to the writer yet (fewer than
        ``chunk_steps`` after :meth:`add`)."""
        return len(self._rows)

    def new_episode(self) -> None:
        """Call when the policy resets (its NAC cache restarts at step 0)."""
        if len(self):
            self._episode += 1
        self._nac_steps = 0

    def add(self, frame: np.ndarray, policy_action, expert_action=None, reward: float | None = None,
            cross_track_error: float | None = None, nac_trace=None, timestamp: float | None = None,
            nac_step: int | None = None, scene: dict[str, float] | None = None) -> None:
        """Record one closed-loop step (and hand a chunk to the writer when ``chunk_steps`` are held).

        frame: uint8 RGB ``[H, W, 3]`` (the same size every step). policy_action /
        expert_action: array-like (a discrete action may be a scalar index).
        nac_trace: the :class:`NACTrace` of :meth:`NAC.step` (batch 1). nac_step: the
        layer's step index of this query; by default the number of traces recorded
        since the last :meth:`new_episode`. timestamp: seconds (default: wall clock).
        scene: the road's scene at this step (:func:`~nac_drive.simulators.centre_line.centre_line_scene`;
        its :data:`SCENE_FIELDS` are kept, a missing one is NaN).
        """
        self._check_writer()
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"frame: expected a uint8 RGB array [H, W, 3], got {frame.dtype} {list(frame.shape)}")
        if self._frame_shape is None:
            self._frame_shape = frame.shape
        elif frame.shape != self._frame_shape:
            raise ValueError(f"frame: shape {list(frame.shape)} differs from the run's {list(self._frame_shape)}")
        row: dict[str, Any] = {
            "frame": frame.copy(),   # the writer encodes it (the caller may reuse its array)
            "timestamp": time.time() if timestamp is None else float(timestamp),
            "episode": self._episode,
            "policy_action": _action(policy_action, "policy_action"),
            "expert_action": None if expert_action is None else _action(expert_action, "expert_action"),
            "reward": np.nan if reward is None else float(reward),
            "cross_track_error": np.nan if cross_track_error is None else float(cross_track_error),
            **{name: float((scene or {}).get(name, np.nan)) for name in SCENE_FIELDS},
            "nac": None,
        }
        for name in ("policy_action", "expert_action"):
            a = row[name]
            if a is not None and self._widths.setdefault(name, len(a)) != len(a):
                raise ValueError(f"{name}: the action size changed during the run ({self._widths[name]}, then {len(a)})")
        if nac_trace is not None:   # reduced with its chunk, by the writer thread
            step = self._nac_steps if nac_step is None else int(nac_step)
            check_nac_step(nac_trace, step)
            row["nac"] = nac_trace
            row["nac_step"] = step
            self._nac_steps = step + 1
        self._rows.append(row)
        if len(self._rows) >= self.chunk_steps:
            self._hand_over()

    def _chunk_arrays(self, rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        """The schema's arrays of a chunk's steps (its frames JPEG-encoded)."""
        out: dict[str, np.ndarray] = {}
        out["frames_jpeg"], out["frame_offsets"] = pack_jpegs([encode_jpeg(r["frame"], self.jpeg_quality)
                                                               for r in rows])
        out["timestamp"] = np.array([r["timestamp"] for r in rows], dtype=np.float64)
        out["episode"] = np.array([r["episode"] for r in rows], dtype=np.int32)
        out["policy_action"] = _stack_actions([r["policy_action"] for r in rows], "policy_action")
        out["expert_action"] = _stack_actions([r["expert_action"] for r in rows], "expert_action")
        for name in ("reward", "cross_track_error", *SCENE_FIELDS):
            out[name] = np.array([r[name] for r in rows], dtype=np.float32)
        out["has_nac"] = np.array([r["nac"] is not None for r in rows], dtype=bool)
        out["nac_step"] = np.array([r.get("nac_step", -1) for r in rows], dtype=np.int64)
        out.update(_nac_members(rows))
        return out

    def save(self) -> Path:
        """Write the steps not written yet as the next chunk (atomically; the chunks before it
        are not touched) and wait until it is on disk; returns the trace folder. Writes
        nothing when every step and the current ``metadata`` are written already; a run of no
        steps still gets its chunk 0. Raises the writer's error, if it had one."""
        self._hand_over()
        self._wait_for_writer()
        return self.path

    def _hand_over(self) -> None:
        """Give the chunk being filled (and ``metadata`` as it is now) to a new writer thread,
        once the one before is written; unless nothing is new."""
        run = json.dumps(self.metadata, sort_keys=True, allow_nan=False)
        if self._chunks and not self._rows and run == self._written_metadata:
            return
        self._wait_for_writer()   # at most one chunk being written
        meta = {"format": FORMAT, "version": VERSION, "chunk": self._chunks, "first_step": self._written,
                "num_steps": len(self._rows), "frame_shape": list(self._frame_shape) if self._frame_shape else None,
                "run": bounded_json.loads(run)}   # a copy: the caller may add to metadata meanwhile
        if not self._chunks:   # what is fixed for the run, written once
            meta.update(jpeg_quality=self.jpeg_quality, created_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        action_names=self.action_names, expert_action_names=self.expert_action_names, nac=self.nac_info)
        self._writer = threading.Thread(target=self._write, args=(self._chunks, self._rows, meta),
                                        name=f"trace writer {self.path}")
        self._writer.start()
        self._chunks, self._written, self._rows = self._chunks + 1, len(self), []
        self._written_metadata = run

    def _write(self, index: int, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        """The writer thread: chunk ``index`` of ``rows``; an error is kept for the caller."""
        try:
            arrays = self._chunk_arrays(rows)
            if index == 0:
                self._delete_earlier_recording()
                arrays.update(self.wiring)
            write_archive(chunk_path(self.path, index), arrays, meta)
        except OSError as e:   # a full disk, a file-size limit: say where, in one line
            self._error = OSError(f"{self.path}: chunk {index} could not be written ({e.strerror or e}); the {index} "
                                  "chunk(s) before it are whole")
            self._error.errno = e.errno
        except BaseException as e:   # noqa: BLE001 -- raised in the caller's thread (_check_writer)
            self._error = e

    def _wait_for_writer(self) -> None:
        """Wait until the chunk under way is written; raise the writer's error, if any."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        self._check_writer()

    def _check_writer(self) -> None:
        if self._error is not None:
            raise self._error

    def _delete_earlier_recording(self) -> None:
        """Delete the chunks another recording left in the trace folder, the last first (a kill
        meanwhile leaves a shorter trace of that recording, never one with a gap)."""
        if self.path.is_dir():
            for index in reversed(chunk_indices(self.path)):
                chunk_path(self.path, index).unlink()

    def __enter__(self) -> "RunRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None or exc is not self._error:   # (after the writer's error no chunk follows)
            self.save()

def _action(value, name: str) -> np.ndarray:
    a = np.asarray(value, dtype=np.float32).reshape(-1)
    if a.size == 0:
        raise ValueError(f"{name}: empty action")
    return a


def _stack_actions(actions: list[np.ndarray | None], name: str) -> np.ndarray:
    """Rows of equal width -> [N, A]; None rows become NaN (A = 0 when all are None)."""
    widths = {len(a) for a in actions if a is not None}
    if len(widths) > 1:
        raise ValueError(f"{name}: the action size changed during the run ({sorted(widths)})")
    width = widths.pop() if widths else 0
    out = np.full((len(actions), width), np.nan, dtype=np.float32)
    for i, a in enumerate(actions):
        if a is not None:
            out[i] = a
    return out


def _nac_members(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The NAC members ``[N, ...]`` of a chunk's steps (:func:`reduce_nac_steps` of those
    with a trace); a step without one holds NaN (key_step, key_age -1)."""
    traced = [i for i, r in enumerate(rows) if r["nac"] is not None]
    if not traced:  # no NAC in this chunk: keep the ranks, size-0 axes
        return {name: np.zeros((len(rows),) + (0,) * rank, dtype=_NAC_DTYPES.get(name, np.float32))
                for name, rank in _NAC_RANKS.items()}
    reduced = reduce_nac_steps([rows[i]["nac"] for i in traced], [rows[i]["nac_step"] for i in traced])
    if len(traced) == len(rows):
        return reduced
    out = {}
    for name, x in reduced.items():
        out[name] = np.full((len(rows),) + x.shape[1:], -1 if name.startswith("key_") else np.nan, x.dtype)
        out[name][traced] = x
    return out


_NAC_DTYPES = {"key_step": np.int64, "key_age": np.int32}


# Rank (after the step axis) of every NAC member, in schema order (NAC_FIELDS: their names).
_NAC_RANKS = {"q": 1, "k": 1, "v": 1, **{f"{g}_{r}": 2 for g in BACKBONE_GROUPS for r in ("mean", "top")},
              **{name: 2 for name in PER_KEY}, "key_step": 2, "key_age": 2}


NAC_FIELDS = tuple(_NAC_RANKS)

__all__ = ["NAC_FIELDS", "SCENE_FIELDS", "RunRecorder", "RunTrace", "load_trace", "reduce_nac_trace", "reduce_nac_steps",
           "check_nac_step", "describe_nac", "ArchiveError", "TRACE_DIR",
           "CHUNK_STEPS"]
