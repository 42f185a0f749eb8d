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
import operator
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
    phi_tau_bias ``[H, 2]``: the read-outs of phi (column 0) and tau (column 1); output: the
    output projection's weight ``[d_model, d_model]`` and bias, which only the streamed step's
    kernel reads (everything else calls the layer's ``out_proj``, which hooks may watch).
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
    output: tuple[torch.Tensor, torch.Tensor]

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
        """What :func:`~nac_drive.nac.kernels.stream_step` reads, as numpy arrays (made once per
        packing): the linear maps of a streamed step as F.linear reads them (qkv weight and bias,
        the query half ``[H*(n_inter + 2), d_model]`` and its bias, the key half and a zero
        bias), the pair stage's (:attr:`kernel_arrays`) and the output projection's weight and bias."""
        maps = (self.qkv_weight, self.qkv_bias, self.query_side.T, self.query_bias, self.key_side.T,
                torch.zeros_like(self.query_bias))
        return (*(w.detach().contiguous().numpy() for w in maps), *self.kernel_arrays[0],
                *(w.detach().contiguous().numpy() for w in self.output))

    @functools.cached_property
    def streams(self) -> bool:
        """Whether :func:`~nac_drive.nac.kernels.stream_step` can read these weights: on the CPU,
        float32, the pair stage's finite (asked once per packing; a step asks every frame)."""
        return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in self._streamed)
                and self.kernel_arrays[1])

    @functools.cached_property
    def records_gradients(self) -> bool:
        """Whether autograd records what is computed from these weights (while grad mode is on)."""
        return any(t.requires_grad for t in self._streamed)

    @property
    def _streamed(self) -> tuple[torch.Tensor, ...]:
        return (self.qkv_weight, self.qkv_bias, self.query_side, self.query_bias, self.key_side, *self.pair_stage(),
                *self.output)


def pack(gates: Sequence[MaskedLinear], inter: HeadwiseMaskedLinear, command: HeadwiseMaskedLinear,
         motor: HeadwiseMaskedLinear, time: tuple[torch.Tensor, torch.Tensor],
         phi_tau: tuple[torch.Tensor, torch.Tensor], output: nn.Linear) -> PackedWeights:
    """The named weights -> :class:`PackedWeights`. ``gates`` (q, k, v); ``inter`` reads
    ``[q_i; k_j]`` (``[H, 2*depth, n_inter]``); ``time`` = (weight ``[H, 2*depth, 2]``, bias
    ``[H, 2]``); ``phi_tau`` = (weight ``[H, n_motor, 2]``, bias ``[H, 2]``); ``output`` the
    output projection."""
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
        phi_tau=phi_tau[0], phi_tau_bias=phi_tau[1], output=(output.weight, output.bias))


class Derived:
    """A value computed from a module's weights (packed, reordered for a kernel), kept while
    they are unchanged: built every call, the packing alone would take a third of a streamed
    NAC step. The storage and version counter of each of the module's parameters and buffers,
    and its submodules and their modes, key it, so an in-place change (an optimizer's step,
    ``load_state_dict``), a replaced tensor, a replaced layer or a layer put in train mode
    rebuilds it. It is built afresh on every call while autograd records through those weights,
    and for inference tensors (a module built under ``inference_mode``), which have no version.
    A copy of the module starts without it.
    """

    def __init__(self):
        self.key, self.value = None, None
        self._sources = None   # (registrations seen, module, its modules, their tensors, the tensors' ids)

    def get(self, module: nn.Module, build: Callable[[], Any], *extra: Hashable) -> Any:
        """``build()`` for ``module``'s current weights (and ``extra``, such as an input's shape)."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters()):
            return build()
        try:
            key = self._key(module, extra)
            if key != self.key:   # perhaps a tensor replaced in a module's dict: gather them again
                self._sources = None
                key = self._key(module, extra)
        except RuntimeError:   # an inference tensor: no version to tell a change by
            return build()
        if key != self.key:
            value = build()
            self.key, self.value = key, value
        return self.value

    def _key(self, module: nn.Module, extra: tuple) -> list:
        """What the value depends on. The module's modules and tensors are gathered again after a
        registration anywhere (:data:`_registrations`) or when the key changed; each
        call reads the tensors' storage and versions and the modules' modes by C iteration (a walk
        through the modules' dicts every frame cost twice as much)."""
        sources = self._sources
        if sources is None or sources[0] != _registrations[0] or sources[1] is not module:
            modules = list(module.modules())
            tensors = [t for m in modules for t in (*m._parameters.values(), *m._buffers.values()) if t is not None]
            sources = self._sources = (_registrations[0], module, modules, tensors, list(map(id, tensors)))
        _, _, modules, tensors, ids = sources
        # the tensors last: compared only once their ids are equal, they keep those ids taken
        return [extra, modules, ids, list(map(_data_ptr, tensors)), list(map(_version, tensors)),
                list(map(_training, modules)), tensors]

    def clear(self) -> None:
        self.key, self.value, self._sources = None, None, None

    def __deepcopy__(self, memo) -> "Derived":
        return Derived()

    def __getstate__(self) -> dict:
        return {"key": None, "value": None, "_sources": None}


_data_ptr, _version, _training = torch.Tensor.data_ptr, operator.attrgetter("_version"), operator.attrgetter("training")
# Parameters, buffers and submodules assigned to any module so far (torch's global registration
# hooks count them): while the count is unchanged, a module tree holds the same layers and tensors
# (but for a tensor put in a module's dict directly, as Module.to does with a moved buffer, while
# its parameters move too: a changed key gathers them again).
_registrations = [0]


def _count_registration(module: nn.Module, name: str, value: Any) -> None:
    _registrations[0] += 1


for _register in (nn.modules.module.register_module_parameter_registration_hook,
                  nn.modules.module.register_module_buffer_registration_hook,
                  nn.modules.module.register_module_module_registration_hook):
    _register(_count_registration)


def pair_scores(qh: torch.Tensor, kh: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The selected pairs' dot-product scores: qh ``[B,H,Tq,depth]``, kh ``[B,H,Tk,depth]``, idx
    ``[B,H,Tq,K]`` -> q_i . k_j / sqrt(depth) ``[B,H,Tq,K]`` (an empty slot scores key 0; masked later)."""
    B, H, Tq, K = idx.shape
    depth = kh.shape[-1]
    keys = kh.gather(2, idx.clamp(min=0).reshape(B, H, Tq * K, 1).expand(B, H, Tq * K, depth))
    return (keys.view(B, H, Tq, K, depth) @ qh[..., None])[..., 0] / math.sqrt(depth)

