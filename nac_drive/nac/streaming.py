"""Streaming the NAC layer one frame at a time (:meth:`NAC.step`), as a driving policy does.

The cache keeps, for the last ``window`` steps, the packed row of each key
(:class:`~nac_drive.nac.packing.KeyLayout`: its half of the backbone's first layer and of
the time affine, its timestamp, its value, and the key itself, which selection reads).
A step computes the new frame's q, k, v, appends its row, selects among the cached keys and
runs the layer's pair stage for the one query: exactly what the causal forward (same
``window``) returns at that position, in O(window) work. On CPU without autograd the whole
step is one numba call (:func:`~nac_drive.nac.kernels.stream_step`; the shipped policy's step:
0.25 -> 0.05 ms, most of the 0.25 spent in the torch and numpy calls around the stage-by-stage
kernels, ``benchmarks/policy_speed.py --breakdown``); the output projection stays a module call
while a hook watches it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import nac_drive.nac.kernels as kernels
from nac_drive.nac.packing import KeyLayout, pair_scores
from nac_drive.nac.selection import NO_KEY, Visibility
from nac_drive.nac.validation import check_step_inputs


@dataclass
class NACCache:
    """Streaming state of :meth:`NAC.step`: the key side of the last ``window`` steps.

    feats ``[B, H, C, KeyLayout.cache_width]``: per slot, a packed key row
    (:class:`~nac_drive.nac.packing.KeyLayout`; the rows that ``NAC.key_rows`` makes, with the key
    appended: the kernels call them ``cache`` or ``key_feats``). Slots are in time order, oldest first, so
    slot c holds step ``steps - C + c`` (empty if negative). ``steps`` counts the frames
    consumed; ``origin`` ``[B]`` is the timestamp of the first one (timestamps count from
    it), None before a timestamped step. :meth:`NAC.step` returns a new cache and leaves
    this one untouched.
    """

    feats: torch.Tensor
    steps: int = 0
    origin: torch.Tensor | None = None

    @property
    def positions(self) -> torch.Tensor:
        """``[C]`` the step index held by each slot, ``-1`` for an empty one."""
        C = self.feats.shape[2]
        pos = torch.arange(self.steps - C, self.steps, device=self.feats.device)
        return pos.clamp(min=-1)


def empty_cache(batch_size: int, num_heads: int, window: int | None, layout: KeyLayout,
                like: torch.Tensor) -> NACCache:
    """An empty cache: ``window`` slots (growing if None) of ``layout.cache_width`` columns,
    in the dtype and on the device of ``like``."""
    return NACCache(feats=torch.zeros(batch_size, num_heads, window or 0, layout.cache_width,
                                      dtype=like.dtype, device=like.device))


def step(layer: nn.Module, x_t: torch.Tensor, cache: NACCache, t: torch.Tensor | None = None,
         return_trace: bool = False):
    """:meth:`NAC.step` of ``layer``: x_t ``[B, input_dim]``, t ``[B]`` -> (y_t ``[B, d_model]``,
    the new cache), and a ``NACTrace`` with T = 1 third if ``return_trace``."""
    check_step_inputs(x_t, cache.feats.shape[0], t, layer.input_dim, layer.causal, layer.select)
    B, H = x_t.shape[0], layer.num_heads
    packed = layer.packed_weights()
    origin = cache.origin
    if t is None:
        now = torch.full((B,), float(cache.steps), dtype=x_t.dtype, device=x_t.device)
    else:
        origin = t.detach().clone() if origin is None else origin
        now = (t - origin).to(x_t.dtype)                          # relative before the cast
    timed = t is not None or layer.time_input == "elapsed"   # the pair stage reads the query's time
    if layer.streams_on_kernels(x_t, cache.feats, packed):
        # its fast path: the whole step in one numba call (None: a value not finite)
        fused = kernels.stream_step(x_t, cache.feats, cache.steps, now, timed, packed, layer.layout, topk=layer.topk,
                                    select=layer.select, grows=layer.window is None, trace=return_trace,
                                    **layer.pair_settings)
        if fused is not None:
            y, heads, rows, worst_dt_tau, traced = fused
            layer.check_kernel_stability(worst_dt_tau)
            if kernels.observed(layer.out_proj):   # a hook reads the heads: the projection as a module call
                y = layer.output(heads)[:, 0]
            cache = NACCache(feats=rows, steps=cache.steps + 1, origin=origin)
            if not return_trace:
                return y, cache
            q, k, v, idx, stages = traced
            return y, cache, layer.trace(q, k, v, _steps_of(idx, cache), stages)
    q, k, v = layer.sensory_gates(x_t[:, None], packed)                                 # eq. 13
    qh, kh, vh = layer.split_heads(q), layer.split_heads(k), layer.split_heads(v)
    row = torch.cat([layer.key_rows(k, vh, now[:, None], packed), kh], dim=-1)        # [B,H,1,cache_width]
    cache = push(cache, row, layer.window, origin)
    C = cache.feats.shape[2]
    slots = torch.arange(C, device=x_t.device)
    empty = slots < C - cache.steps   # in the first steps of a window the oldest slots are empty
    q_side, rows = layer.query_half(q, packed), cache.feats
    keys = rows[..., layer.layout.key]                                                # [B,H,C,depth]
    backend = layer.backend(qh, keys, q_side, rows, packed, return_trace)
    if layer.select == "all":
        idx = slots.masked_fill(empty, NO_KEY).expand(B, H, 1, C)
    else:  # the forward's exact Top-K (and tie rule) over the slots, which are all in the past
        idx = layer.select_keys(qh, keys, Visibility(causal=False, key_valid=(~empty).expand(B, C)),
                                backend.selection_on_kernels)
    qk = pair_scores(qh, keys, idx) if layer.logit_variant == "qk" else None
    q_times = now[:, None] if timed else None
    out, stages = layer.attend(q_side, q_times, rows, idx, packed, return_trace, backend.pairs_on_kernels, qk)
    y = layer.output(out)[:, 0]
    if not return_trace:
        return y, cache
    return y, cache, layer.trace(q, k, v, _steps_of(idx, cache), stages)


def _steps_of(idx: torch.Tensor, cache: NACCache) -> torch.Tensor:
    """The step index of each selected slot ``idx`` ``[B, H, 1, K]`` of ``cache``, -1 for an empty one."""
    return torch.where(idx == NO_KEY, NO_KEY, idx + (cache.steps - cache.feats.shape[2]))


def push(cache: NACCache, row: torch.Tensor, window: int | None, origin: torch.Tensor | None) -> NACCache:
    """Append one step's slot; with a window, drop the oldest one (a shift: O(window))."""
    joined = torch.cat([cache.feats, row], dim=2)
    return NACCache(feats=joined[:, :, 1:] if window is not None else joined, steps=cache.steps + 1,
                    origin=origin)
