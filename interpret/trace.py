"""Per-step traces of a closed-loop run: a recorder for the driving loop and a loader.

The driving loop calls :meth:`RunRecorder.add` once per step and :meth:`RunRecorder.save`
at the end (or every few hundred steps: each save atomically rewrites the file).
:func:`load_trace` reads the file back into a :class:`RunTrace`.

File: ``RUN_DIR/trace.npz`` (see :mod:`nac_drive.interpret.archive`: a plain ``.npz``,
no pickles, ``np.load(path, allow_pickle=False)`` opens it, plus a ``metadata.json``
member). Schema, version 1. N = steps, A / E = policy / expert action size,
D = d_model, H = heads, K = selected keys per query, n_* = backbone group sizes:

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
wiring_q/_k/_v         uint8       [D, input_dim] sensory gate masks (if the layer was given)
wiring_sensory_to_     uint8       [2*depth, n_inter], [n_inter, n_command],
inter/_inter_to_                   [n_command, n_motor] backbone masks (if the layer was given)
command/_command_to_motor
=====================  ==========  ===========================================================

Without any NAC trace in the run, the NAC members keep their ranks with size-0 axes
(e.g. q ``[N, 0]``). Steps without a trace hold NaN (key_age / key_step -1).

``metadata.json``: ``format`` ("nac-drive-trace"), ``version`` (1), ``num_steps``,
``frame_shape`` [H, W, 3], ``jpeg_quality``, ``created_utc``, ``action_names``
(policy) and ``expert_action_names`` (lists or null), ``run`` (free-form JSON given by
the caller: policy config, env, seeds ...), and ``nac`` (null, or the layer's
hyper-parameters, ``groups`` = neuron group sizes {sensory, inter, command, motor}
of one head's backbone, ``wiring_shapes``).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nac_drive.interpret.archive import (METADATA_MEMBER, ArchiveError, ArchiveReader, check_jpeg_pack, decode_jpeg, encode_jpeg,
                                         pack_jpegs, write_archive)

TRACE_FILE = "trace.npz"
FORMAT, VERSION = "nac-drive-trace", 1
BACKBONE_GROUPS = ("inter", "command", "motor")
PER_KEY = ("phi", "tau", "t_interp", "logits", "weights")
MAX_ACTION_NAMES = 1000
WIRING_FIELDS = ("wiring_q", "wiring_k", "wiring_v", "wiring_sensory_to_inter", "wiring_inter_to_command",
                 "wiring_command_to_motor")


# ------------------------------------------------------------------ NAC trace reduction
def reduce_nac_trace(trace, step: int) -> dict[str, np.ndarray]:
    """One step's :class:`~nac_drive.nac.NACTrace` (batch 1, T = 1) -> per-step arrays.

    ``step`` is the layer's step index of the query (``cache.steps - 1`` after
    :meth:`NAC.step`). Returns q, k, v ``[D]``; ``<group>_mean`` / ``<group>_top``
    ``[H, n]`` for inter, command, motor; phi, tau, t_interp, logits, weights ``[H, K]``
    (NaN in empty slots except weights); key_step, key_age ``[H, K]`` (-1 empty).
    """
    def arr(name: str) -> np.ndarray:
        return getattr(trace, name).detach().cpu().float().numpy()

    q = arr("q")
    if q.ndim != 3 or q.shape[:2] != (1, 1):
        raise ValueError(f"nac_trace: expected batch 1 and T = 1 (NAC.step), got q of shape {list(q.shape)}")
    idx = trace.topk_idx.detach().cpu().numpy()[0, :, 0].astype(np.int64)         # [H, K]
    valid = idx >= 0
    if np.any(idx > step):
        raise ValueError(f"nac_trace.topk_idx: a selected key (step {idx.max()}) is later than the query step "
                         f"{step}; was the layer's cache reset without RunRecorder.new_episode()?")
    out: dict[str, np.ndarray] = {name: arr(name)[0, 0] for name in ("q", "k", "v")}

    weights = arr("weights")[0, :, 0]                                                # [H, K]
    top = np.where(valid, weights, -np.inf).argmax(axis=-1)                          # [H]
    any_valid = valid.any(axis=-1)                                                   # [H]
    count = valid.sum(axis=-1)[:, None]                                              # [H, 1]
    heads = np.arange(idx.shape[0])
    for name in BACKBONE_GROUPS:
        x = arr(name)[0, :, 0]                                                       # [H, K, n]
        total = np.where(valid[..., None], x, 0.0).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"{name}_mean"] = np.where(count > 0, total / count, np.nan)
        out[f"{name}_top"] = np.where(any_valid[:, None], x[heads, top], np.nan)
    for name in PER_KEY:
        x = arr(name)[0, :, 0]
        out[name] = x if name == "weights" else np.where(valid, x, np.nan)
    out["key_step"] = idx
    out["key_age"] = np.where(valid, step - idx, -1)
    return {name: np.asarray(value) for name, value in out.items()}


def attention_entropy(weights: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """weights, valid ``[..., K]`` -> ``[...]`` entropy / log(valid keys) (NaN below 2 keys)."""
    w = np.where(valid, weights, 0.0).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.sum(np.where(w > 0, w * np.log(w), 0.0), axis=-1)
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
    """A loaded ``trace.npz``; fields as in the module docstring's schema."""

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
    wiring: dict[str, np.ndarray] = field(default_factory=dict)
    sha256: str = ""
    """hex SHA-256 of the file as read: what a saliency file computed from it records."""

    @property
    def num_steps(self) -> int:
        return len(self.timestamp)

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


def load_trace(path: str | os.PathLike) -> RunTrace:
    """Load ``RUN_DIR/trace.npz`` (give the run directory or the file).

    Raises :class:`~nac_drive.interpret.archive.ArchiveError` naming the file and
    field when the file is missing, corrupt or does not match the schema.
    """
    path = Path(path)
    if path.is_dir() or path.suffix != ".npz":
        path = path / TRACE_FILE
    with ArchiveReader(path) as r:
        meta, n = r.metadata, r.header(FORMAT, VERSION)
        frames, offsets = check_jpeg_pack(r, "frames_jpeg", "frame_offsets", n)
        values: dict[str, np.ndarray] = {}
        sizes: dict[str, int] = {"N": n}
        for name, kinds, axes in _SCHEMA:
            a = r.array(name, kinds, len(axes))
            for axis, size in zip(axes, a.shape):
                expected = sizes.setdefault(axis, size)
                r.require(size == expected, name, f"axis {axis} has size {size}, other fields say {expected}")
            values[name] = a
        wiring = {name: r.array(name, "u", 2) for name in WIRING_FIELDS if r.has(name)}
        _check_nac_info(r, meta.get("nac"), wiring)
        for key in ("action_names", "expert_action_names"):
            names = meta.get(key)
            r.require(names is None or (isinstance(names, list) and len(names) <= MAX_ACTION_NAMES
                                        and all(isinstance(name, str) for name in names)),
                      METADATA_MEMBER, f"'{key}' must be null or a list of at most {MAX_ACTION_NAMES} names")
    return RunTrace(path=path, metadata=meta, frames_jpeg=frames, frame_offsets=offsets, wiring=wiring,
                    sha256=r.sha256, **values)


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
    """Collects one closed-loop run step by step and writes ``RUN_DIR/trace.npz``.

    Args:
        run_dir: directory of the run (created on save).
        metadata: free-form JSON-serialisable description (policy config, env, seeds).
        nac: the policy's NAC layer, to store its hyper-parameters and wiring masks.
        action_names, expert_action_names: optional labels of the action columns.
        jpeg_quality: JPEG quality of the stored frames (1-100).

    Use as a context manager to save on exit, or call :meth:`save`.
    """

    def __init__(self, run_dir: str | os.PathLike, metadata: dict[str, Any] | None = None, nac=None,
                 action_names: list[str] | None = None, expert_action_names: list[str] | None = None,
                 jpeg_quality: int = 90):
        if not 1 <= int(jpeg_quality) <= 100:
            raise ValueError(f"jpeg_quality: must be in 1..100, got {jpeg_quality!r}")
        try:
            json.dumps(metadata or {}, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"metadata: must be JSON-serialisable ({e})") from e
        self.run_dir = Path(run_dir)
        self.metadata = dict(metadata or {})
        self.jpeg_quality = int(jpeg_quality)
        self.action_names, self.expert_action_names = action_names, expert_action_names
        self.nac_info, self.wiring = describe_nac(nac) if nac is not None else (None, {})
        self._rows: list[dict[str, Any]] = []
        self._frame_shape: tuple[int, ...] | None = None
        self._episode = 0
        self._nac_steps = 0  # NAC traces seen in this episode: the layer's step counter

    @property
    def path(self) -> Path:
        return self.run_dir / TRACE_FILE

    def __len__(self) -> int:
        return len(self._rows)

    def new_episode(self) -> None:
        """Call when the policy resets (its NAC cache restarts at step 0)."""
        if self._rows:
            self._episode += 1
        self._nac_steps = 0

    def add(self, frame: np.ndarray, policy_action, expert_action=None, reward: float | None = None,
            cross_track_error: float | None = None, nac_trace=None, timestamp: float | None = None,
            nac_step: int | None = None) -> None:
        """Record one closed-loop step.

        frame: uint8 RGB ``[H, W, 3]`` (the same size every step). policy_action /
        expert_action: array-like (a discrete action may be a scalar index).
        nac_trace: the :class:`NACTrace` of :meth:`NAC.step` (batch 1). nac_step: the
        layer's step index of this query; by default the number of traces recorded
        since the last :meth:`new_episode`. timestamp: seconds (default: wall clock).
        """
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"frame: expected a uint8 RGB array [H, W, 3], got {frame.dtype} {list(frame.shape)}")
        if self._frame_shape is None:
            self._frame_shape = frame.shape
        elif frame.shape != self._frame_shape:
            raise ValueError(f"frame: shape {list(frame.shape)} differs from the run's {list(self._frame_shape)}")
        row: dict[str, Any] = {
            "jpeg": encode_jpeg(np.ascontiguousarray(frame), self.jpeg_quality),
            "timestamp": time.time() if timestamp is None else float(timestamp),
            "episode": self._episode,
            "policy_action": _action(policy_action, "policy_action"),
            "expert_action": None if expert_action is None else _action(expert_action, "expert_action"),
            "reward": np.nan if reward is None else float(reward),
            "cross_track_error": np.nan if cross_track_error is None else float(cross_track_error),
            "nac": None,
        }
        if nac_trace is not None:
            step = self._nac_steps if nac_step is None else int(nac_step)
            row["nac"] = reduce_nac_trace(nac_trace, step)
            row["nac_step"] = step
            self._nac_steps = step + 1
        self._rows.append(row)

    def arrays(self) -> dict[str, np.ndarray]:
        """The schema's arrays for everything recorded so far."""
        rows, n = self._rows, len(self._rows)
        out: dict[str, np.ndarray] = {}
        out["frames_jpeg"], out["frame_offsets"] = pack_jpegs([r["jpeg"] for r in rows])
        out["timestamp"] = np.array([r["timestamp"] for r in rows], dtype=np.float64)
        out["episode"] = np.array([r["episode"] for r in rows], dtype=np.int32)
        out["policy_action"] = _stack_actions([r["policy_action"] for r in rows], "policy_action")
        out["expert_action"] = _stack_actions([r["expert_action"] for r in rows], "expert_action")
        for name in ("reward", "cross_track_error"):
            out[name] = np.array([r[name] for r in rows], dtype=np.float32)
        out["has_nac"] = np.array([r["nac"] is not None for r in rows], dtype=bool)
        out["nac_step"] = np.array([r.get("nac_step", -1) for r in rows], dtype=np.int64)
        out.update(_stack_nac([r["nac"] for r in rows], n))
        out.update(self.wiring)
        return out

    def save(self) -> Path:
        """Atomically (re)write ``RUN_DIR/trace.npz`` with all steps so far."""
        meta = {
            "format": FORMAT, "version": VERSION, "num_steps": len(self._rows),
            "frame_shape": list(self._frame_shape) if self._frame_shape else None,
            "jpeg_quality": self.jpeg_quality,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "action_names": self.action_names, "expert_action_names": self.expert_action_names,
            "run": self.metadata, "nac": self.nac_info,
        }
        return write_archive(self.path, self.arrays(), meta)

    def __enter__(self) -> "RunRecorder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
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


def _stack_nac(rows: list[dict[str, np.ndarray] | None], n: int) -> dict[str, np.ndarray]:
    """Per-step reductions -> [N, ...] arrays. Per-key fields are padded to the run's
    largest K (a layer without a window selects more keys as its cache grows)."""
    def dtype_and_fill(name: str):
        if name == "key_step":
            return np.int64, -1
        if name == "key_age":
            return np.int32, -1
        return np.float32, (0.0 if name == "weights" else np.nan)

    present = [r for r in rows if r is not None]
    if not present:  # no NAC in this run: keep the ranks, size-0 axes
        return {name: np.zeros((n,) + (0,) * rank, dtype=dtype_and_fill(name)[0]) for name, rank in _NAC_RANKS.items()}
    k_max = max(r["weights"].shape[-1] for r in present)
    out = {}
    for name in _NAC_RANKS:
        ref = present[0][name].shape
        per_key = name in PER_KEY or name.startswith("key_")
        shape = ref[:-1] + (k_max,) if per_key else ref
        dtype, fill = dtype_and_fill(name)
        a = np.full((n,) + shape, fill, dtype=dtype)
        for i, r in enumerate(rows):
            if r is None:
                continue
            x = r[name]
            if x.shape[:-1] != shape[:-1] or (not per_key and x.shape != shape):
                raise ValueError(f"nac_trace.{name}: shape {list(x.shape)} at step {i} differs from {list(ref)}")
            a[i, ..., :x.shape[-1]] = x
        out[name] = a
    # Steps without a trace hold NaN weights, not the 0.0 of an empty slot.
    out["weights"][np.array([r is None for r in rows])] = np.nan
    return out


# Rank (after the step axis) of every NAC member, in schema order (NAC_FIELDS: their names).
_NAC_RANKS = {"q": 1, "k": 1, "v": 1, **{f"{g}_{r}": 2 for g in BACKBONE_GROUPS for r in ("mean", "top")},
              **{name: 2 for name in PER_KEY}, "key_step": 2, "key_age": 2}


NAC_FIELDS = tuple(_NAC_RANKS)

__all__ = ["NAC_FIELDS", "RunRecorder", "RunTrace", "load_trace", "reduce_nac_trace", "describe_nac", "ArchiveError", "TRACE_FILE"]
