"""The layer's named weights, masked and packed into the few products its fast path takes.

The layer (:mod:`.layer`) owns its weights by name: the sensory gates ``q_gate``, ``k_gate``,
``v_gate`` (eq. 13), the backbone ``inter``, ``command``, ``motor`` (eq. 14), the read-outs
``phi_tau_weight`` / ``phi_tau_bias`` (eqs. 15-16) and the time affine ``time_weight`` /
``time_bias``. Its computations consume them packed (:class:`PackedWeights`):

* the three gates stacked, so q, k and v take one product;
* the backbone's first layer and the time affine cut into a query half and a key half.
  Both are linear in the pair ``[q_i; k_j]``: ``W [q_i; k_j] + b = (W_q q_i + b) + W_k k_j``.
  The layer computes and adds the halves (:meth:`NAC.query_half`, :meth:`NAC.key_rows`,
  :meth:`NAC.gather_pairs`, beside :meth:`NAC.backbone`); here they are only cut, the heads'
  halves block-diagonally in one matrix, so all heads take one product.

What a query gathers from a key is one packed row (:class:`KeyLayout`); the streaming cache
and the numba kernels read the same rows. Without autograd the packed weights are built once
and reused until a source tensor changes (:class:`Derived`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from nac_drive.nac.sparse_linear import HeadwiseMaskedLinear, MaskedLinear


@dataclass(frozen=True)
class KeyLayout:
    """The columns of a packed key row: everything a query gathers from one key, so that
    one gather serves the whole pair stage.

    ``[0, n_inter)`` W_k k_j, the key's half of the backbone's first layer (eq. 14);
    ``n_inter, n_inter + 1`` the key's half of the time affine (a, b); ``stamp`` the key's
    timestamp; ``value`` v_j (``depth`` columns); ``key`` k_j itself, in the streaming
    cache only (:func:`~nac_drive.nac.streaming.step` selects on it).
    """

    n_inter: int
    depth: int

    @property
    def pair(self) -> slice:
        """The columns added to the query half: W_k k_j and the time affine's key half."""
        return slice(0, self.n_inter + 2)

    @property
    def stamp(self) -> int:
        return self.n_inter + 2

    @property
    def value(self) -> slice:
        return slice(self.stamp + 1, self.stamp + 1 + self.depth)

    @property
    def key(self) -> slice:
        return slice(self.value.stop, self.value.stop + self.depth)

    @property
    def width(self) -> int:
        """Columns of a row of :func:`key_rows` (without the key)."""
        return self.value.stop

    @property
    def cache_width(self) -> int:
        """Columns of a :class:`~nac_drive.nac.streaming.NACCache` slot (with the key)."""
        return self.key.stop


@dataclass
class PackedWeights:
    """The layer's effective (masked, packed) weights, as its computations consume them.

    qkv ``[3*d_model, input_dim]`` and ``[3*d_model]``: the three sensory gates stacked;
    query_side, key_side ``[d_model, H*(n_inter + 2)]``: the query and key halves of the
    backbone's first layer and of the time affine, block-diagonal over the heads so all
    heads take one product (query_bias ``[H*(n_inter + 2)]``); command, motor
    ``[H, in, out]`` with biases ``[H, out]``; phi_tau ``[H, n_motor, 2]`` and
    phi_tau_bias ``[H, 2]``: the read-outs of phi (column 0) and tau (column 1).
    """

    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor
    query_side: torch.Tensor
    query_bias: torch.Tensor
    key_side: torch.Tensor
    command: torch.Tensor
    command_bias: torch.Tensor
    motor: torch.Tensor
    motor_bias: torch.Tensor
    phi_tau: torch.Tensor
    phi_tau_bias: torch.Tensor

    def pair_stage(self) -> tuple[torch.Tensor, ...]:
        """What the pair stage reads after the gather, in the kernel's argument order."""
        return self.command, self.command_bias, self.motor, self.motor_bias, self.phi_tau, self.phi_tau_bias

    @functools.cached_property
    def kernel_arrays(self) -> tuple[tuple[np.ndarray, ...], bool]:
        """:meth:`pair_stage` as contiguous numpy arrays for the kernels, and whether they
        are all finite: made once per packing (a changed parameter repacks)."""
        arrays = tuple(w.detach().contiguous().numpy() for w in self.pair_stage())
        return arrays, all(np.isfinite(a).all() for a in arrays)

    @functools.cached_property
    def stream_arrays(self) -> tuple[np.ndarray, ...]:
        """The linear maps of a streamed step as F.linear reads them, for
        :func:`~nac_drive.nac.kernels.stream_step`: qkv weight and bias, the query half
        ``[H*(n_inter + 2), d_model]`` and its bias, the key half and a zero bias (made once per packing)."""
        maps = (self.qkv_weight, self.qkv_bias, self.query_side.T, self.query_bias, self.key_side.T,
                torch.zeros_like(self.query_bias))
        return tuple(w.detach().contiguous().numpy() for w in maps)


def pack(gates: Sequence[MaskedLinear], inter: HeadwiseMaskedLinear, command: HeadwiseMaskedLinear,
         motor: HeadwiseMaskedLinear, time: tuple[torch.Tensor, torch.Tensor],
         phi_tau: tuple[torch.Tensor, torch.Tensor]) -> PackedWeights:
    """The named weights -> :class:`PackedWeights`. ``gates`` (q, k, v); ``inter`` reads
    ``[q_i; k_j]`` (``[H, 2*depth, n_inter]``); ``time`` = (weight ``[H, 2*depth, 2]``, bias
    ``[H, 2]``); ``phi_tau`` = (weight ``[H, n_motor, 2]``, bias ``[H, 2]``)."""
    first, (time_weight, time_bias) = inter.effective_weight, time
    d = first.shape[1] // 2                                                  # rows of q_i, then of k_j
    query_side = torch.cat([first[:, :d], time_weight[:, :d]], dim=-1)      # [H, depth, n_inter + 2]
    key_side = torch.cat([first[:, d:], time_weight[:, d:]], dim=-1)
    return PackedWeights(
        qkv_weight=torch.cat([g.effective_weight for g in gates]),
        qkv_bias=torch.cat([g.bias for g in gates]),
        query_side=torch.block_diag(*query_side),
        query_bias=torch.cat([inter.bias, time_bias], dim=-1).flatten(),
        key_side=torch.block_diag(*key_side),
        command=command.effective_weight, command_bias=command.bias,
        motor=motor.effective_weight, motor_bias=motor.bias,
        phi_tau=phi_tau[0], phi_tau_bias=phi_tau[1])


class Derived:
    """A value computed from a module's weights (packed, reordered for a kernel), kept while
    they are unchanged: built every call, the packing alone would take a third of a streamed
    NAC step. The storage and version counter of each of the module's parameters and buffers
    (its submodules' included) key it, so an in-place change (an optimizer's step,
    ``load_state_dict``) or a replaced tensor rebuilds it. It is built afresh on every call
    while autograd records through those weights, and for inference tensors (a module built
    under ``inference_mode``), which have no version. A copy of the module starts without it.
    """

    def __init__(self):
        self.key, self.value = None, None

    def get(self, module: nn.Module, build: Callable[[], Any], *extra: Hashable) -> Any:
        """``build()`` for ``module``'s current weights (and ``extra``, such as an input's shape)."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()):
            return build()
        try:
            key = _contents(module, [*extra])
        except RuntimeError:   # an inference tensor: no version to tell a change by
            return build()
        if key != self.key:
            value = build()
            self.key, self.value = key, value
        return self.value

    def clear(self) -> None:
        self.key, self.value = None, None

    def __deepcopy__(self, memo) -> "Derived":
        return Derived()

    def __getstate__(self) -> dict:
        return {"key": None, "value": None}


def _contents(module: nn.Module, key: list) -> list:
    """``key`` extended by the storage address and version counter of each of ``module``'s
    parameters and buffers, its submodules' included (read from the modules' own dicts:
    ``Module.parameters()`` would cost more than what the cache saves)."""
    for tensor in module._parameters.values():
        if tensor is not None:
            key.append(tensor.data_ptr())
            key.append(tensor._version)
    for tensor in module._buffers.values():
        if tensor is not None:
            key.append(tensor.data_ptr())
            key.append(tensor._version)
    for child in module._modules.values():
        if child is not None:
            _contents(child, key)
    return key


def pair_scores(qh: torch.Tensor, kh: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The selected pairs' dot-product scores: qh ``[B,H,Tq,depth]``, kh ``[B,H,Tk,depth]``, idx
    ``[B,H,Tq,K]`` -> q_i . k_j / sqrt(depth) ``[B,H,Tq,K]`` (an empty slot scores key 0; masked later)."""
    B, H, Tq, K = idx.shape
    depth = kh.shape[-1]
    keys = kh.gather(2, idx.clamp(min=0).reshape(B, H, Tq * K, 1).expand(B, H, Tq * K, depth))
    return (keys.view(B, H, Tq, K, depth) @ qh[..., None])[..., 0] / math.sqrt(depth)

