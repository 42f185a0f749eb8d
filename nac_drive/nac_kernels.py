"""Fused CPU kernels of the NAC layer, for inference.

The eager torch code (:mod:`nac_drive.nac`, :mod:`nac_drive.key_selection`) defines the
layer: autograd differentiates it and GPUs run it. On CPU the layer's two hot spots
run through numba kernels (:mod:`nac_drive._nac_numba`) instead, where they give the
same result:

* key selection (always on CPU: it is never differentiated): each query keeps its
  K best keys in an insertion buffer while its scores stream past, instead of
  materialising every score and calling ``torch.topk``;
* the pair stage (backbone, phi/tau heads, time vector, logits, softmax, weighted
  values), when nothing needs a gradient or a trace: one pass over tiles of pairs
  instead of ~40 small tensor operations.

Tests hold both paths equal. ``NAC_DRIVE_KERNELS=0`` in the environment, or
:func:`disabled`, makes every call take the eager path.
"""

from __future__ import annotations

import functools
import math
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from nac_drive.key_selection import BlockPartition, Visibility

_enabled = os.environ.get("NAC_DRIVE_KERNELS", "1") != "0"

MODE_CODES = {"exact": 0, "euler": 1, "steady": 2}
_PAIR_WEIGHTS = ("command", "command_bias", "motor", "motor_bias", "gate", "gate_bias")  # of nac._Weights


@functools.cache
def _kernels():
    """The numba module, compiled lazily (None if numba cannot be imported here)."""
    try:
        from nac_drive import _nac_numba
    except ImportError:
        return None
    return _nac_numba


def available() -> bool:
    """True if the kernels are enabled and numba imports."""
    return _enabled and _kernels() is not None


@contextmanager
def disabled():
    """Run the eager torch path inside this block (the reference the kernels are tested against)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def _scripting() -> bool:
    """torch.jit.trace / torch.compile see tensors only: numba calls cannot be traced."""
    return torch.jit.is_tracing() or getattr(torch.compiler, "is_compiling", lambda: False)()


def _finite(*arrays: np.ndarray) -> bool:
    """No NaN anywhere. The kernels compare with fast-math and clamp before exp, so NaN
    inputs take the eager code, which lets the NaN through as torch does. (Checked in
    numpy: a third of torch's cost on the small tensors a streamed step has.)"""
    return not any(np.isnan(a).any() for a in arrays)


def handles_selection(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether :func:`select_exact` / :func:`select_block` serve these queries and keys."""
    return (q.device.type == k.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
            and available() and not _scripting() and _finite(q.detach().numpy(), k.detach().numpy()))


def handles_pairs(q_side: torch.Tensor, key_feats: torch.Tensor, w, *, training_dropout: bool,
                  want_trace: bool) -> bool:
    """Whether :func:`attend` serves a pair stage on these inputs and ``nac._Weights``:
    CPU, float32, and no gradient, trace or active dropout needed."""
    if want_trace or training_dropout or not available() or _scripting():
        return False
    tensors = (q_side, key_feats, *(getattr(w, name) for name in _PAIR_WEIGHTS))
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and _finite(q_side.detach().numpy(), key_feats.detach().numpy()) and _weight_arrays(w)[1])


def _flat(x: torch.Tensor) -> np.ndarray:
    """[B, H, T, D] -> contiguous numpy [B*H, T, D] (no copy when already contiguous)."""
    return x.detach().reshape(-1, *x.shape[2:]).contiguous().numpy()


def _keys_transposed(k: torch.Tensor) -> np.ndarray:
    """k [B, H, Tk, D] -> contiguous numpy [B*H, D, Tk]."""
    return k.detach().flatten(0, 1).transpose(1, 2).contiguous().numpy()


def _empty_score(x: torch.Tensor):
    """The score that marks a key which may not be chosen: the dtype's lowest finite value
    (as a numpy scalar of that dtype, so the kernel compares in it)."""
    dtype = np.float32 if x.dtype == torch.float32 else np.float64
    return dtype(torch.finfo(x.dtype).min)


def _key_valid(vis: "Visibility", batch: int, num_keys: int) -> np.ndarray:
    """The key validity mask as bool ``[batch, num_keys]`` (broadcast as torch would; the
    kernels do not check bounds, so a mask of another shape is refused here)."""
    if vis.key_valid is None:
        return np.ones((batch, num_keys), np.bool_)
    try:
        valid = torch.broadcast_to(vis.key_valid.detach().to(torch.bool), (batch, num_keys))
    except RuntimeError as exc:
        raise ValueError(f"key_valid: expected [B={batch}, Tk={num_keys}], got {list(vis.key_valid.shape)}") from exc
    return valid.contiguous().numpy()


def select_exact(q: torch.Tensor, k: torch.Tensor, topk: int, vis: "Visibility",
                 q_offset: int = 0) -> torch.Tensor:
    """As :func:`nac_drive.key_selection.select_exact`: q ``[B,H,Tq,D]``, k ``[B,H,Tk,D]``
    -> idx ``[B,H,Tq,topk]``."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    out = np.empty((B * H, Tq, topk), np.int64)
    _kernels().select_exact(_flat(q), _keys_transposed(k), _key_valid(vis, B, Tk), H, vis.causal,
                            _window(vis), q_offset, _empty_score(q), out)
    return torch.from_numpy(out).view(B, H, Tq, topk)


def select_block(q: torch.Tensor, part: "BlockPartition", topk: int, vis: "Visibility") -> torch.Tensor:
    """As :func:`nac_drive.key_selection.select_block`: q ``[B,H,T,D]`` and the keys cut into
    blocks -> idx ``[B,H,T,topk]``. The centroid scores of every (query, block) are one
    batched product here; the kernel picks the blocks and searches them."""
    B, H, T, D = q.shape
    block_scores = (q @ part.centroids.transpose(-1, -2)).detach()                    # [B,H,T,nb]
    keys = part.k_blocks.flatten(2, 3)                                                # [B,H,nb*size,D]
    out = np.empty((B * H, T, topk), np.int64)
    _kernels().select_block(_flat(q), _keys_transposed(keys), part.key_ok.cpu().numpy(), part.count.cpu().numpy(),
                            _flat(block_scores), H, vis.causal, _window(vis), part.size, part.n_pick,
                            _empty_score(q), out)
    return torch.from_numpy(out).view(B, H, T, topk)


def attend(q_side: torch.Tensor, q_times: torch.Tensor | None, key_feats: torch.Tensor, idx: torch.Tensor,
           w, *, depth: int, mode: str, euler_steps: int, tau_eps: float, time_input: str,
           time_weighted_values: bool) -> torch.Tensor:
    """The pair stage of :meth:`nac_drive.nac.NAC._attend` (same arguments; key_feats holds
    the key side, the timestamp, then ``depth`` value features) -> out ``[B,H,Tq,depth]``."""
    nb = _kernels()
    B, H, Tq, P = q_side.shape
    if time_input == "elapsed":
        if q_times is None:
            raise ValueError("q_times: time_input='elapsed' needs the query timestamps")
        time_kind = nb.TIME_ELAPSED
    elif q_times is None:
        time_kind = nb.TIME_ONE
    else:
        time_kind = nb.TIME_QUERY
    times = _ZERO_TIMES if q_times is None else _array(q_times)
    weights, _ = _weight_arrays(w)
    out = torch.empty(B, H, Tq, depth, dtype=torch.float32)
    nb.attend(_array(q_side.transpose(-1, -2)), _array(key_feats[..., :P + 1].transpose(-1, -2)),
              _array(key_feats), _array(idx), times, time_kind, *weights, MODE_CODES[mode],
              euler_steps, np.float32(tau_eps), time_weighted_values, out.numpy())
    return out


_ZERO_TIMES = np.zeros((1, 1), np.float32)  # stands for q_times when the kernel does not read them


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _weight_arrays(w) -> tuple[tuple[np.ndarray, ...], bool]:
    """The pair stage's weights of a ``nac._Weights`` as numpy arrays, and whether they are
    free of NaN: made once per ``_Weights`` (the layer rebuilds it whenever a parameter
    changes), not on every streamed step."""
    cached = getattr(w, "_kernel_arrays", None)
    if cached is None:
        arrays = tuple(_array(getattr(w, name)) for name in _PAIR_WEIGHTS)
        cached = w._kernel_arrays = (arrays, _finite(*arrays))
    return cached


def _window(vis: "Visibility") -> int:
    return -1 if vis.window is None else vis.window

