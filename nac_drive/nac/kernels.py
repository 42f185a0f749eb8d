"""Fused CPU kernels of the NAC layer, and the choice of when they serve.

The eager torch code (:mod:`.layer`, :mod:`.selection`) defines the layer: autograd
differentiates it and GPUs run it. On CPU the layer's two hot spots run through numba
kernels (:mod:`._numba`) instead, where they give the same result:

* key selection (always on CPU: it is never differentiated): a query's scores, a row at a
  time and never the whole T x T matrix, ranked as integers that order as the scores do,
  only those that can still make the Top-K (``_numba.topk_exact_rows``; by blocks,
  ``topk_block_rows``), instead of every score through ``torch.topk``;
* the pair stage (backbone, phi/tau heads, time vector, logits, softmax, weighted
  values): one pass over tiles of pairs instead of ~40 small tensor operations (that also
  writes out every stage when a trace is asked for). Under autograd (training) it writes
  them for :class:`PairStage`, whose backward is one more pass over the pairs.

:func:`choose` decides once per call which path serves it. The kernels read the layer's
packed weights and key rows (:mod:`.packing`), never the layer itself. Tests hold both
paths equal. ``NAC_DRIVE_KERNELS=0`` in the environment, or :func:`disabled`, makes every
call take the eager path (and a policy's fused layers step aside too:
``nac_drive.policy.fused.FusedLayers``).
"""

from __future__ import annotations

import functools
import operator
import os
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch

from nac_drive.nac.packing import KeyLayout, PackedWeights
from nac_drive.nac.selection import BlockPartition, Visibility, exporting

_enabled = os.environ.get("NAC_DRIVE_KERNELS", "1") != "0"

MODE_CODES = {"exact": 0, "euler": 1, "steady": 2}


@functools.cache
def _kernels():
    """The numba module, compiled lazily (None if numba cannot be imported here)."""
    try:
        import nac_drive.nac._numba as numba_kernels
    except ImportError:
        return None
    return numba_kernels


def enabled() -> bool:
    """False under ``NAC_DRIVE_KERNELS=0`` or inside :func:`disabled`: the eager code serves every call."""
    return _enabled


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


def tracing() -> bool:
    """torch.jit.trace / torch.compile / torch.export (and so ONNX export) see tensors only:
    numba calls cannot be traced, nor can any other fast path outside torch's own operators."""
    return torch.jit.is_tracing() or _is_compiling() or exporting()


_is_compiling = getattr(torch.compiler, "is_compiling", lambda: False)   # (looked up once: asked every frame)


def _finite(*arrays: np.ndarray) -> bool:
    """No NaN or inf anywhere. The kernels compare with fast-math (key selection assumes
    no inf at all) and clamp before exp, so such inputs take the eager code, which lets
    them through as torch does. (Checked in numpy: a third of torch's cost on the small
    tensors a streamed step has.)"""
    return all(np.isfinite(a).all() for a in arrays)


def handles_selection(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether :func:`kernel_select_exact` / :func:`kernel_select_block` serve these queries and keys."""
    return (q.device.type == k.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
            and available() and not tracing() and _finite(q.detach().numpy(), k.detach().numpy()))


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an operation on these tensors."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def handles_pairs(q_side: torch.Tensor, key_rows: torch.Tensor, weights: tuple[torch.Tensor, ...],
                  want_trace: bool = False) -> bool:
    """Whether the kernels can serve a pair stage on these inputs and pair-stage weights: CPU,
    finite inputs, and float32 (:func:`attend`), or with a gradient needed float32 or float64
    (:func:`attend_for_training`) and no trace (its stages would carry no gradient). (Dropout is
    the caller's to rule out, and whether the weights are finite too: ``PackedWeights.kernel_arrays``.)"""
    if not available() or tracing():
        return False
    tensors = (q_side, key_rows, *weights)
    training = needs_grad(*tensors)
    if training and want_trace:
        return False
    dtypes = (torch.float32, torch.float64) if training else (torch.float32,)
    return (all(t.device.type == "cpu" and t.dtype in dtypes for t in tensors)
            and _finite(q_side.detach().numpy(), key_rows.detach().numpy()))


class Backend(NamedTuple):
    """Which code serves one call: the numba kernels or the torch reference."""

    selection_on_kernels: bool
    pairs_on_kernels: bool


def choose(q: torch.Tensor, k: torch.Tensor, q_side: torch.Tensor, key_rows: torch.Tensor,
           packed: PackedWeights, pairs_allowed: bool, want_trace: bool = False) -> Backend:
    """The code that serves one call, chosen once. Key selection is never differentiated,
    so it runs on the kernels whenever they take q, k ``[B,H,T,depth]``; the pair stage
    (q_side, key_rows, ``packed``) only if ``pairs_allowed`` (the caller needs no
    dropout or clamp inside it) and :func:`handles_pairs` takes it (with a gradient needed, by
    :func:`attend_for_training`)."""
    selection = handles_selection(q, k)
    pairs = (selection and pairs_allowed and handles_pairs(q_side, key_rows, packed.pair_stage(), want_trace)
             and packed.kernel_arrays[1])   # last: the weights become arrays only for a kernel call
    return Backend(selection, pairs)


def select(strategy: str, q: torch.Tensor, k: torch.Tensor, topk: int, vis: Visibility) -> torch.Tensor:
    """Top-K by ``strategy`` ("exact" or "block") on the kernels: as the torch reference of
    :mod:`~nac_drive.nac.selection` gives it, q, k ``[B,H,T,D]`` -> idx ``[B,H,Tq,topk]``."""
    if strategy == "block":
        return kernel_select_block(q, BlockPartition.of(k, topk, vis.key_valid), topk, vis)
    return kernel_select_exact(q, k, topk, vis)


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


def _key_valid(vis: Visibility, batch: int, num_keys: int) -> np.ndarray:
    """The key validity mask as bool ``[batch, num_keys]`` (broadcast as torch would; the
    kernels do not check bounds, so a mask of another shape is refused here)."""
    if vis.key_valid is None:
        return np.ones((batch, num_keys), np.bool_)
    try:
        valid = torch.broadcast_to(vis.key_valid.detach().to(torch.bool), (batch, num_keys))
    except RuntimeError as exc:
        raise ValueError(f"key_valid: expected [B={batch}, Tk={num_keys}], got {list(vis.key_valid.shape)}") from exc
    return valid.contiguous().numpy()


def kernel_select_exact(q: torch.Tensor, k: torch.Tensor, topk: int, vis: Visibility,
                 q_offset: int = 0) -> torch.Tensor:
    """As :func:`~nac_drive.nac.selection.select_exact`: q ``[B,H,Tq,D]``, k ``[B,H,Tk,D]``
    -> idx ``[B,H,Tq,topk]``."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    out = np.empty((B * H, Tq, topk), np.int64)
    _kernels().topk_exact_rows(_flat(q), _keys_transposed(k), _key_valid(vis, B, Tk), H, vis.causal,
                            _window(vis), q_offset, _empty_score(q), out)
    return torch.from_numpy(out).view(B, H, Tq, topk)


def kernel_select_block(q: torch.Tensor, part: BlockPartition, topk: int, vis: Visibility) -> torch.Tensor:
    """As :func:`~nac_drive.nac.selection.select_block`: q ``[B,H,T,D]`` and the keys cut into
    blocks -> idx ``[B,H,T,topk]``. The centroid scores of every (query, block) are one
    batched product here; the kernel picks the blocks and searches them."""
    B, H, T, D = q.shape
    block_scores = (q @ part.centroids.transpose(-1, -2)).detach()                    # [B,H,T,nb]
    keys = part.k_blocks.flatten(2, 3)                                                # [B,H,nb*size,D]
    out = np.empty((B * H, T, topk), np.int64)
    _kernels().topk_block_rows(_flat(q), _keys_transposed(keys), part.key_ok.cpu().numpy(), part.count.cpu().numpy(),
                            _flat(block_scores), H, vis.causal, _window(vis), part.size, part.n_pick,
                            _empty_score(q), out)
    return torch.from_numpy(out).view(B, H, T, topk)


def attend(q_side: torch.Tensor, q_times: torch.Tensor | None, key_rows: torch.Tensor, idx: torch.Tensor,
           packed: PackedWeights, layout: KeyLayout, *, mode: str, euler_steps: int,
           tau_eps: float, time_input: str, time_weighted_values: bool,
           trace: bool = False) -> tuple[torch.Tensor, float, dict[str, torch.Tensor] | None]:
    """The pair stage of :meth:`~nac_drive.nac.layer.NAC.attend` (eqs. 14-19) in one pass:
    q_side ``[B,H,Tq,P]`` (:meth:`NAC.query_half <nac_drive.nac.layer.NAC.query_half>`), key_rows
    ``[B,H,Tk,>= layout.width]`` packed as :class:`~nac_drive.nac.packing.KeyLayout` says,
    idx ``[B,H,Tq,K]`` -> (out ``[B,H,Tq,depth]``, the largest dt * tau of a selected pair
    in mode euler, for the layer's stability check, and with ``trace`` the stages as the
    eager :meth:`~nac_drive.nac.layer.NAC.attend` traces them: inter, command, motor
    ``[B,H,Tq,K,n]``, phi, tau, t_interp, logits, weights ``[B,H,Tq,K]``, NaN in an empty
    slot except its weight 0; else None)."""
    nb = _kernels()
    B, H, Tq, P = q_side.shape
    if P != layout.stamp or layout.value.start != P + 1:
        raise ValueError(f"q_side: {P} columns do not match the key layout {layout}")
    time_kind = _time_kind(time_input, q_times is not None)
    times = _ZERO_TIMES if q_times is None else _array(q_times)
    out = torch.empty(B, H, Tq, layout.depth, dtype=torch.float32)
    worst_dt_tau = np.zeros(1, np.float32)
    stages = _traced_stages(idx.shape, layout, packed) if trace else None
    nb.attend(_array(q_side.transpose(-1, -2)), _array(key_rows[..., :layout.stamp + 1].transpose(-1, -2)),
              _array(key_rows), _array(idx), times, time_kind, *packed.kernel_arrays[0], MODE_CODES[mode],
              euler_steps, np.float32(tau_eps), time_weighted_values, out.numpy(), worst_dt_tau, trace,
              tuple(t.numpy() for t in stages.values()) if trace else _NO_TRACE)
    return out, float(worst_dt_tau[0]), stages


def _time_kind(time_input: str, timed: bool) -> int:
    """What the pair stage's time vector reads (the kernels' TIME_* code): the key's age
    ("elapsed"), the query's time, or 1 without timestamps (``timed``: the queries have times)."""
    nb = _kernels()
    if time_input == "elapsed":
        if not timed:
            raise ValueError("q_times: time_input='elapsed' needs the query timestamps")
        return nb.TIME_ELAPSED
    return nb.TIME_QUERY if timed else nb.TIME_ONE


def handles_stream(x_t: torch.Tensor, cache: torch.Tensor, packed: PackedWeights) -> bool:
    """Whether :func:`stream_step` can serve a streamed step on these inputs: CPU float32, no
    gradient needed, and weights it reads (``PackedWeights.streams``: the pair stage's finite;
    the inputs' finiteness the kernel checks itself). (Clamp, dropout and logit variant are the
    caller's to rule out.) Traced, nothing is asked of the weights: they become arrays only for a
    kernel call."""
    return (available() and not tracing() and x_t.dtype == cache.dtype == torch.float32
            and x_t.device.type == cache.device.type == "cpu" and packed.streams
            and not (torch.is_grad_enabled() and (packed.records_gradients or x_t.requires_grad
                                                  or cache.requires_grad)))


def stream_step(x_t: torch.Tensor, cache: torch.Tensor, steps: int, now: torch.Tensor, timed: bool,
                packed: PackedWeights, layout: KeyLayout, *, topk: int, select: str, grows: bool, mode: str,
                euler_steps: int, tau_eps: float, time_input: str, time_weighted_values: bool, trace: bool = False):
    """A streamed step (:func:`~nac_drive.nac.streaming.step`) in one numba call: x_t ``[B, input_dim]``,
    the cache's rows ``[B, H, C, layout.cache_width]`` after ``steps`` steps (an int or a 0-d tensor, as an
    exported step graph passes it), now ``[B]`` (the step's time, which the pair stage reads as
    the query's if ``timed``, as :func:`attend` reads q_times), the layer's ``packed`` weights (its
    output projection's included)
    -> (y ``[B, d_model]``, the heads' outputs ``[B, H, 1, depth]`` it projects, the new rows ``[B,
    H, C (+1 if grows), layout.cache_width]``, the largest dt * tau in mode euler, and with ``trace`` the step's
    q, k, v ``[B, 1, d_model]``, selected slots idx ``[B, H, 1, K]`` and pair stages as
    :func:`attend` traces them, else None), or None when an input or what the gates make of it is
    not finite (the caller takes the eager code). The outputs are numpy arrays seen as tensors
    (numpy allocates them several times faster than torch)."""
    B, H, C, width = cache.shape
    C_out = C + 1 if grows else C
    qkv = np.empty((B, packed.qkv_weight.shape[0]), np.float32)
    rows = np.empty((B, H, C_out, width), np.float32)
    idx = np.empty((B, H, 1, C_out if select == "all" else topk), np.int64)
    heads = np.empty((B, H, 1, layout.depth), np.float32)
    y = np.empty((B, packed.output[0].shape[0]), np.float32)
    worst_dt_tau = np.zeros(1, np.float32)
    stages = _traced_stages(idx.shape, layout, packed) if trace else None
    finite = _kernels().stream_step(
        _array(x_t), _array(cache), _array(now), _time_kind(time_input, timed), *packed.stream_arrays, int(steps),
        select == "all", MODE_CODES[mode], euler_steps, np.float32(tau_eps), time_weighted_values, qkv, rows, idx,
        heads, y, worst_dt_tau, trace, tuple(t.numpy() for t in stages.values()) if trace else _NO_TRACE)
    if not finite:
        return None
    traced = (*torch.from_numpy(qkv)[:, None].chunk(3, dim=-1), torch.from_numpy(idx), stages) if trace else None
    return torch.from_numpy(y), torch.from_numpy(heads), torch.from_numpy(rows), float(worst_dt_tau[0]), traced


def observed(*modules: torch.nn.Module) -> bool:
    """Whether a forward hook (their own or a global one) watches any of ``modules``' calls: a
    fast path that would compute their outputs without calling them steps aside. (Asked every
    frame of a closed loop: the modules' hook dicts are read by C iteration.)"""
    hooks = torch.nn.modules.module
    return bool(hooks._global_forward_hooks or hooks._global_forward_pre_hooks
                or any(map(_FORWARD_HOOKS, modules)) or any(map(_FORWARD_PRE_HOOKS, modules)))


_FORWARD_HOOKS, _FORWARD_PRE_HOOKS = operator.attrgetter("_forward_hooks"), operator.attrgetter("_forward_pre_hooks")


# The pair stages a trace holds, in the kernel's order (NACTrace's fields of the same names).
TRACED_STAGES = ("inter", "command", "motor", "phi", "tau", "t_interp", "logits", "weights")
_PER_UNIT = TRACED_STAGES[:3]   # the stages with a neuron axis


def _traced_stages(shape: tuple[int, ...], layout: KeyLayout, packed: PackedWeights) -> dict[str, torch.Tensor]:
    """Empty float32 tensors the kernel writes a trace's stages into: inter, command, motor
    ``[B,H,Tq,K,n]``, the others ``[B,H,Tq,K]`` (``shape``, the selected keys')."""
    units = dict(zip(_PER_UNIT, (layout.n_inter, packed.command.shape[-1], packed.motor.shape[-1])))
    return {name: torch.empty(*shape, *([units[name]] if name in units else []), dtype=torch.float32)
            for name in TRACED_STAGES}


_NO_TRACE = tuple(np.empty((0,) * (5 if name in _PER_UNIT else 4), np.float32)
                  for name in TRACED_STAGES)   # stands for the trace arrays when none is asked for
_ZERO_TIMES = np.zeros((1, 1), np.float32)  # stands for q_times when the kernel does not read them


def _array(t: torch.Tensor) -> np.ndarray:
    """``t`` as a contiguous numpy array (no copy if it is one; asked a few times a streamed step:
    the questions before the calls)."""
    if t.requires_grad:
        t = t.detach()
    return (t if t.is_contiguous() else t.contiguous()).numpy()


def _window(vis: Visibility) -> int:
    return -1 if vis.window is None else vis.window



class PairStage(torch.autograd.Function):
    """The pair stage with a fused backward (training on CPU): the forward is :func:`attend`
    with its trace (float32) or, in float64, the eager reference ``stages_of`` gives; the backward
    is one numba pass over the selected pairs (:func:`_numba.attend_backward`) from those stages,
    instead of autograd through ~40 small tensor operations and their gathers.

    ``apply(q_side, q_times, key_rows, command, command_bias, motor, motor_bias, phi_tau,
    phi_tau_bias, idx, settings, stages_of)``: the tensors as :func:`attend` reads them (the
    weights those of ``PackedWeights.pair_stage``), ``settings`` = (mode code, euler_steps, tau_eps,
    time kind, time_weighted_values), ``stages_of()`` -> (out, the stages
    :data:`TRACED_STAGES` names) -> out ``[B,H,Tq,depth]``."""

    @staticmethod
    def forward(ctx, q_side, q_times, key_rows, command, command_bias, motor, motor_bias, phi_tau, phi_tau_bias,
                idx, settings, stages_of):
        out, stages = stages_of()
        ctx.settings = settings
        ctx.save_for_backward(q_side, q_times, key_rows, command, motor, phi_tau, idx,
                              *(stages[name] for name in ("inter", "command", "motor", "phi", "tau", "t_interp",
                                                          "weights")))
        return out

    @staticmethod
    def backward(ctx, d_out):
        q_side, q_times, rows, command, motor, phi_tau, idx, *stages = ctx.saved_tensors
        mode, euler_steps, tau_eps, time_kind, time_weighted = ctx.settings
        B, H, Tq, P = q_side.shape
        dtype = q_side.dtype
        grads = [torch.zeros(shape, dtype=dtype) for shape in (
            (B * H, Tq, P), (B * H, *rows.shape[2:]), command.shape, command.shape[::2], motor.shape,
            motor.shape[::2], phi_tau.shape, phi_tau.shape[::2], (B, Tq))]
        times = _array(q_times) if q_times is not None else np.zeros((1, 1), grads[0].numpy().dtype)
        _kernels().attend_backward(
            _array(d_out.flatten(0, 1)), _array(idx.flatten(0, 1)), _array(q_side.flatten(0, 1)),
            _array(rows.flatten(0, 1)), times, time_kind, *(_array(s.flatten(0, 1)) for s in stages),
            _array(command), _array(motor), _array(phi_tau), mode, euler_steps, grads[0].numpy().dtype.type(tau_eps),
            time_weighted, *(g.numpy() for g in grads))
        d_q_side, d_rows, *d_weights, d_q_times = grads
        return (d_q_side.view(q_side.shape), d_q_times if q_times is not None else None, d_rows.view(rows.shape),
                *d_weights, None, None, None)


def attend_for_training(q_side: torch.Tensor, q_times: torch.Tensor | None, key_rows: torch.Tensor, idx: torch.Tensor,
                        packed: PackedWeights, layout: KeyLayout, reference, *, mode: str, euler_steps: int,
                        tau_eps: float, time_input: str, time_weighted_values: bool) -> tuple[torch.Tensor, float]:
    """The pair stage as :func:`attend` computes it, differentiable (:class:`PairStage`): same
    arguments -> (out ``[B,H,Tq,depth]``, the largest dt * tau in mode euler, for the caller's
    stability check). ``reference()`` -> (out, stages): the eager pair stage with its trace, which
    is the forward in float64 (the kernel's forward is float32, and checks its own stability)."""
    time_kind = _time_kind(time_input, q_times is not None)

    worst = [0.0]

    def stages_of():
        if q_side.dtype != torch.float32:
            return reference()
        out, worst[0], stages = attend(q_side, q_times, key_rows, idx, packed, layout, mode=mode,
                                           euler_steps=euler_steps, tau_eps=tau_eps, time_input=time_input,
                                           time_weighted_values=time_weighted_values, trace=True)
        return out, stages

    out = PairStage.apply(q_side, q_times, key_rows, *packed.pair_stage(), idx,
                          (MODE_CODES[mode], euler_steps, tau_eps, time_kind, time_weighted_values), stages_of)
    return out, worst[0]
