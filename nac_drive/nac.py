"""The Neuronal Attention Circuit layer (paper §2; docs/ARCHITECTURE.md §3 maps it to this code).

For every query step i and each of its K selected keys j (per head):

    q, k, v      = sensory gates (NCP-masked linear maps) of the input        eq. 13
    inter        = tanh(W_q q_i + W_k k_j + b)       over the backbone wiring  eq. 14
    command      = tanh(W_c inter + b_c),  motor = tanh(W_m command + b_m)
    phi          = sigmoid(w_phi . motor + b_phi)                               eq. 15
    tau          = softplus(w_tau . motor + b_tau) + eps                        eq. 16
    t_ij         = sigmoid(a_ij * t + b_ij),   (a, b) = affine read-out of [q_i; k_j]
    logit_ij     = phi/tau                                  (mode "steady", eq. 18)
                 = phi/tau * (1 - exp(-tau t_ij))           (mode "exact",  eq. 3)
                 = N Euler steps of da/dt = -tau a + phi    (mode "euler",  eq. 2)
    w_ij         = softmax_j(logit_ij)       over the selected keys (invalid: -inf)
    out_i        = W_o concat_h( sum_j w_ij t_ij v_j )                          eq. 19

:meth:`NAC._attend` runs these as named stages, one method each: ``_gather_pairs``,
``_backbone`` (eq. 14), ``_phi_tau`` (eqs. 15-16), ``_time_vector``, ``_logits``
(eqs. 2/3/18) and ``_aggregate`` (eq. 19).

What the weights can say: phi is in (0, 1) and (1 - exp(-tau t)) / tau < t < 1, so in
mode "exact" every logit lies in (0, 1) and the weights of one query's selected keys
differ by less than a factor e (the entropy of a query's weights is close to log K).
The selection (which keys) carries most of the information; the weights only nudge.

The backbone's first layer is linear in the concatenation [q_i; k_j], so W_q q_i is
computed once per query and W_k k_j once per key, then added after gathering: the
``[B, H, T, K, 2*depth]`` pair tensor is never built.

Time input ``t`` of the time vector (``time_input``):
* ``"query"`` (default, as in the paper): the query step's timestamp, or 1 without
  timestamps.
* ``"elapsed"``: ``t_i - t_j``, the age of the key when the query is made (frame
  counts without timestamps); natural for a causal window over irregular frames.
Timestamps count from the sequence's first step (:meth:`NAC.step`: from the first step
the cache saw), subtracted in the caller's dtype before the layer casts them to its own:
absolute clock times (~1.7e9 s) in float32 would keep a resolution of minutes.

Interventions: inside ``with layer.clamped(Clamp(...))`` chosen units (q/k/v, backbone
neurons, whole heads, or the weights made uniform) are held at given values in every call,
which is how the neuron atlas silences a neuron (:class:`Clamp`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from nac_drive import nac_kernels
from nac_drive.key_selection import NO_KEY, BlockPartition, Visibility, select_all, select_block, select_exact
from nac_drive.sparse_linear import HeadwiseMaskedLinear, MaskedLinear
from nac_drive.wiring import BackboneWiring, sensory_gate_mask

MODES = ("exact", "euler", "steady")
SELECTIONS = ("exact", "block", "all")
TIME_INPUTS = ("query", "elapsed")
DEFAULT_WIRING_SEED = 22222  # ncps' own default


@dataclass
class NACTrace:
    """Everything the layer computed, for interpretability. K = selected keys per query.

    q, k, v ``[B, T, d_model]``; inter, command, motor ``[B, H, T, K, n]``;
    phi, tau, t_interp, logits, weights ``[B, H, T, K]``; topk_idx ``[B, H, T, K]``:
    the time step of each selected key, ``-1`` for an empty slot. An empty slot's weight
    is 0 and every other field of it is NaN (no pair was computed there).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    inter: torch.Tensor
    command: torch.Tensor
    motor: torch.Tensor
    phi: torch.Tensor
    tau: torch.Tensor
    t_interp: torch.Tensor
    logits: torch.Tensor
    weights: torch.Tensor
    topk_idx: torch.Tensor

    def detach(self) -> "NACTrace":
        return NACTrace(**{f.name: getattr(self, f.name).detach() for f in fields(self)})


@dataclass(frozen=True)
class KeyLayout:
    """The columns of a packed key row: everything a query gathers from one key, so that
    one gather serves the whole pair stage.

    ``[0, n_inter)`` W_k k_j, the key's half of the backbone's first layer (eq. 14);
    ``n_inter, n_inter + 1`` the key's half of the time affine (a, b); ``stamp`` the key's
    timestamp; ``value`` v_j (``depth`` columns); ``key`` k_j itself, in the streaming
    cache only (:meth:`NAC.step` selects on it).
    """

    n_inter: int
    depth: int

    @property
    def pair(self) -> slice:
        """The columns added to the query side: W_k k_j and the time affine's key half."""
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
        """Columns of a row of :meth:`NAC._key_rows` (without the key)."""
        return self.value.stop

    @property
    def cache_width(self) -> int:
        """Columns of a :class:`NACCache` slot (with the key)."""
        return self.key.stop


@dataclass
class NACCache:
    """Streaming state of :meth:`NAC.step`: the key side of the last ``window`` steps.

    feats ``[B, H, C, KeyLayout.cache_width]``: per slot, a packed key row
    (:class:`KeyLayout`). Slots are in time order, oldest first, so slot c holds step
    ``steps - C + c`` (empty if negative). ``steps`` counts the frames consumed;
    ``origin`` ``[B]`` is the timestamp of the first one (timestamps count from it), None
    before a timestamped step. :meth:`NAC.step` returns a new cache and leaves this one
    untouched.
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


@dataclass
class _PackedParams:
    """The layer's effective (masked, packed) parameters, as its computations consume them.

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
    def kernel_arrays(self) -> tuple[tuple, bool]:
        """:meth:`pair_stage` as numpy arrays for the kernels, and whether they are all
        finite: made once per build (the layer rebuilds whenever a parameter changes)."""
        return nac_kernels.pair_arrays(self.pair_stage())


@dataclass
class Clamp:
    """An intervention on the layer (:meth:`NAC.clamped`): chosen units held at given values
    wherever they are computed, in :meth:`NAC.forward` and :meth:`NAC.step` alike.

    q, k, v: ``{unit: value}``, outputs of the sensory gates, unit in ``[0, d_model)``
    (head ``unit // depth``); inter, command, motor: ``{(head, unit): value}``, a backbone
    neuron of one head, held in every (query, key) pair; heads: ``{head: values [depth]}``,
    that head's output (eq. 19, before the output projection) replaced whole;
    uniform_weights: each query's attention weights replaced by 1 / (its selected keys).

    The backbone and the weights live inside the pair stage, which the numba kernel fuses:
    clamping them runs that stage's eager torch code. q, k, v and heads are set outside it,
    so the kernels still serve (with the clamped values).
    """

    q: Mapping[int, float] = field(default_factory=dict)
    k: Mapping[int, float] = field(default_factory=dict)
    v: Mapping[int, float] = field(default_factory=dict)
    inter: Mapping[tuple[int, int], float] = field(default_factory=dict)
    command: Mapping[tuple[int, int], float] = field(default_factory=dict)
    motor: Mapping[tuple[int, int], float] = field(default_factory=dict)
    heads: Mapping[int, Sequence[float]] = field(default_factory=dict)
    uniform_weights: bool = False

    @property
    def in_pair_stage(self) -> bool:
        """Whether the clamp reaches inside the pair stage (then it runs eager torch code)."""
        return bool(self.inter or self.command or self.motor or self.uniform_weights)


_INTACT = Clamp()   # nothing clamped


def _set_units(x: torch.Tensor, units: Mapping[int, float]) -> torch.Tensor:
    """x ``[..., n]`` with ``x[..., u] = value`` for each clamped unit (a new tensor)."""
    if not units:
        return x
    x = x.clone()
    x[..., torch.tensor(list(units), device=x.device)] = torch.tensor(list(units.values()), dtype=x.dtype,
                                                                      device=x.device)
    return x


def _set_head_units(x: torch.Tensor, units: Mapping[tuple[int, int], float]) -> torch.Tensor:
    """x ``[B, H, ..., n]`` with ``x[:, head, ..., unit] = value`` for each clamped neuron (a new tensor)."""
    if not units:
        return x
    x = x.clone()
    for (head, unit), value in units.items():
        x[:, head, ..., unit] = value
    return x


class _Backend(NamedTuple):
    """Which code serves one call: the numba kernels or the torch reference."""

    selection_on_kernels: bool
    pairs_on_kernels: bool


# Parameters renamed since checkpoints were first written: old name -> new name.
RENAMED_PARAMETERS = {"gate_weight": "phi_tau_weight", "gate_bias": "phi_tau_bias"}


def upgrade_state_names(state: dict) -> dict:
    """A state dict (or name -> shape map) with :data:`RENAMED_PARAMETERS` applied to the
    last component of every name, so checkpoints written before a rename still load."""
    def new(name: str) -> str:
        last = name.rpartition(".")[2]
        return name[:len(name) - len(last)] + RENAMED_PARAMETERS.get(last, last)
    return {new(name): value for name, value in state.items()}


def _gather_keys(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x ``[B, H, Tk, F]`` at idx ``[B, H, Tq, K]`` (all >= 0) -> ``[B, H, Tq, K, F]``."""
    B, H, Tk, F_ = x.shape
    offset = (torch.arange(B * H, device=x.device) * Tk).view(B, H, 1, 1)
    return x.reshape(B * H * Tk, F_)[idx + offset]


class NAC(nn.Module):
    """Neuronal Attention Circuit: multi-head, continuous-time, NCP-gated sparse attention.

    Args:
        input_dim: features per step of the input ``x``.
        d_model: width of q, k, v and of the output; ``d_model = num_heads * depth``.
        num_heads: attention heads, each with its own backbone parameters.
        topk: keys kept per query (K) by ``select="exact"`` or ``"block"``.
        mode: logit solver, ``"exact"`` (closed form), ``"euler"`` or ``"steady"``.
        euler_steps: explicit Euler steps N over the horizon ``t_interp`` (mode euler).
            Stable only while tau * t_interp / N < 2 (t_interp < 1, so N > tau / 2);
            a call that crosses it raises ``ValueError`` instead of returning a logit
            that oscillates with growing amplitude.
        select: key selection, ``"exact"`` Top-K, ``"block"`` (paper Alg. 2, subquadratic)
            or ``"all"`` (every visible key: NAC-PW).
        sparsity: NCP wiring sparsity of the sensory gates and the backbone, 0.1..0.9.
        causal: a query never sees later steps.
        window: if set, a query only sees the last ``window`` steps (itself included).
        dropout: dropout on the attention weights (training only).
        seed: seeds the NCP wirings and the parameter initialisation.
        backbone_units: neurons per head's backbone (inter + command + motor), wired
            by AutoNCP. The paper uses ``d_model + d_model/0.6`` (171 at d_model=64)
            and calls that too large; the backbone runs once per (query, key) pair, so
            its cost is ``B*H*T*K*units^2``. 16 units (8 inter, 4 command, 4 motor)
            keeps the layer a small fraction of a driving policy's time.
        time_input: ``"query"`` or ``"elapsed"`` (see the module docstring).
        time_weighted_values: use ``t_ij`` as the quadrature weight of eq. 19.
        tau_eps: lower bound added to tau.

    ``mode``, ``euler_steps``, ``select``, ``causal``, ``window`` and ``time_input``
    do not change the parameters: a state dict saved under one setting loads under
    another, and they may be changed on a built layer.
    """

    def __init__(self, input_dim: int, d_model: int = 64, num_heads: int = 4, topk: int = 8,
                 mode: str = "exact", euler_steps: int = 6, select: str = "exact",
                 sparsity: float = 0.5, causal: bool = True, window: int | None = None,
                 dropout: float = 0.0, seed: int | None = None, backbone_units: int = 16,
                 time_input: str = "query", time_weighted_values: bool = True,
                 tau_eps: float = 1e-6):
        super().__init__()
        _check_hyperparameters(input_dim=input_dim, d_model=d_model, num_heads=num_heads, topk=topk,
                               mode=mode, euler_steps=euler_steps, select=select, sparsity=sparsity,
                               window=window, dropout=dropout, backbone_units=backbone_units,
                               time_input=time_input, tau_eps=tau_eps)
        self.input_dim, self.d_model, self.num_heads = input_dim, d_model, num_heads
        self.depth = d_model // num_heads
        self.topk, self.mode, self.euler_steps, self.select = topk, mode, euler_steps, select
        self.sparsity, self.causal, self.window = sparsity, causal, window
        self.time_input, self.time_weighted_values, self.tau_eps = time_input, time_weighted_values, tau_eps
        self.seed = seed
        wiring_seed = DEFAULT_WIRING_SEED if seed is None else seed

        motor = max(1, round(0.25 * backbone_units))
        wiring = BackboneWiring.auto(2 * self.depth, backbone_units, motor, sparsity, wiring_seed + 3)
        with torch.random.fork_rng(enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            # Sensory gates (eq. 13): each its own AutoNCP sensory -> inter wiring.
            self.q_gate, self.k_gate, self.v_gate = (
                MaskedLinear(sensory_gate_mask(input_dim, d_model, sparsity, wiring_seed + i)) for i in range(3))
            # Backbone (eq. 14), one parameter set per head, one wiring for all heads.
            self.inter = HeadwiseMaskedLinear(num_heads, wiring.sensory_to_inter)
            self.command = HeadwiseMaskedLinear(num_heads, wiring.inter_to_command)
            self.motor = HeadwiseMaskedLinear(num_heads, wiring.command_to_motor)
            n_motor = wiring.sizes[2]
            # The phi and tau read-outs (eqs. 15, 16) and the time affine (a, b), per head.
            # phi_tau_weight[..., 0] reads phi, [..., 1] reads tau (bias starts tau near 1).
            bound = 1.0 / math.sqrt(n_motor)
            self.phi_tau_weight = nn.Parameter(torch.empty(num_heads, n_motor, 2).uniform_(-bound, bound))
            self.phi_tau_bias = nn.Parameter(torch.tensor([0.0, math.log(math.e - 1.0)]).repeat(num_heads, 1))
            bound = 1.0 / math.sqrt(2 * self.depth)
            self.time_weight = nn.Parameter(torch.empty(num_heads, 2 * self.depth, 2).uniform_(-bound, bound))
            self.time_bias = nn.Parameter(torch.zeros(num_heads, 2))
            self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)
        self.layout = KeyLayout(n_inter=wiring.sizes[0], depth=self.depth)
        self._params_cache: tuple[tuple, _PackedParams] | None = None
        self.clamp: Clamp | None = None   # set by clamped()

    @property
    def backbone_wiring(self) -> BackboneWiring:
        """The backbone's wiring, read from the mask buffers (which a state dict carries)."""
        return BackboneWiring(*(m.mask.detach().cpu().numpy() for m in (self.inter, self.command, self.motor)))

    @contextmanager
    def clamped(self, clamp: Clamp | None):
        """Inside this block every call runs with ``clamp`` (:class:`Clamp`; None: intact).
        Units out of range are refused with a ``ValueError`` before anything runs."""
        if clamp is not None:
            _check_clamp(clamp, self.d_model, self.num_heads, self.depth, self.backbone_wiring.sizes)
        before, self.clamp = self.clamp, clamp
        try:
            yield self
        finally:
            self.clamp = before

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for old, new in RENAMED_PARAMETERS.items():   # checkpoints written before the rename
            if prefix + old in state_dict and prefix + new not in state_dict:
                state_dict[prefix + new] = state_dict.pop(prefix + old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------ parameters
    def _params(self) -> _PackedParams:
        """Masked and packed parameters. Without autograd (inference, streaming) they are
        built once and reused until a parameter or mask changes (in place or replaced):
        a ``step()`` would otherwise spend a third of its time re-masking."""
        # The tensors _pack_params reads, fetched directly: iterating self.parameters()
        # would cost more than the masking it saves.
        wired = (self.q_gate, self.k_gate, self.v_gate, self.inter, self.command, self.motor)
        tensors = [t for m in wired for t in (*m._parameters.values(), *m._buffers.values()) if t is not None]
        tensors += [self.time_weight, self.time_bias, self.phi_tau_weight, self.phi_tau_bias]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self._pack_params()
        try:
            key = tuple((t.data_ptr(), t._version) for t in tensors)
        except RuntimeError:  # inference tensors (a layer built under inference_mode) have no version
            return self._pack_params()
        if self._params_cache is None or self._params_cache[0] != key:
            self._params_cache = (key, self._pack_params())
        return self._params_cache[1]

    def _pack_params(self) -> _PackedParams:
        gates = (self.q_gate, self.k_gate, self.v_gate)
        inter, d = self.inter.effective_weight, self.depth
        query_side = torch.cat([inter[:, :d], self.time_weight[:, :d]], dim=-1)    # [H, depth, P]
        key_side = torch.cat([inter[:, d:], self.time_weight[:, d:]], dim=-1)
        return _PackedParams(
            qkv_weight=torch.cat([g.effective_weight for g in gates]),
            qkv_bias=torch.cat([g.bias for g in gates]),
            query_side=torch.block_diag(*query_side),
            query_bias=torch.cat([self.inter.bias, self.time_bias], dim=-1).flatten(),
            key_side=torch.block_diag(*key_side),
            command=self.command.effective_weight, command_bias=self.command.bias,
            motor=self.motor.effective_weight, motor_bias=self.motor.bias,
            phi_tau=self.phi_tau_weight, phi_tau_bias=self.phi_tau_bias)

    # ---------------------------------------------------- per-step projections
    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H * n] -> [B, H, T, n] (a view)"""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, -1).transpose(1, 2)

    def _sensory(self, x: torch.Tensor, params: _PackedParams):
        """x [B, T, input_dim] -> q, k, v [B, T, d_model] (eq. 13: the three gates in one product;
        clamped units set, :class:`Clamp`)"""
        q, k, v = F.linear(x, params.qkv_weight, params.qkv_bias).split(self.d_model, dim=-1)
        if self.clamp is not None:
            q, k, v = _set_units(q, self.clamp.q), _set_units(k, self.clamp.k), _set_units(v, self.clamp.v)
        return q, k, v

    def _key_rows(self, k: torch.Tensor, vh: torch.Tensor, times: torch.Tensor | None,
                  params: _PackedParams) -> torch.Tensor:
        """k [B, Tk, d_model], vh [B, H, Tk, depth], times [B, Tk] or None
        -> packed key rows [B, H, Tk, layout.width] (:class:`KeyLayout`)."""
        B, H, Tk, _ = vh.shape
        stamp = vh.new_zeros(B, H, Tk, 1) if times is None else times[:, None, :, None].expand(B, H, Tk, 1)
        return torch.cat([self._split_heads(k @ params.key_side), stamp, vh], dim=-1)

    def _query_side(self, q: torch.Tensor, params: _PackedParams) -> torch.Tensor:
        """q [B, T, d_model] -> [B, H, T, n_inter + 2]: W_q q + b, then the time affine's query part"""
        rows = torch.addmm(params.query_bias, q.flatten(0, 1), params.query_side)
        return self._split_heads(rows.view(*q.shape[:2], -1))

    def _backend(self, qh: torch.Tensor, kh: torch.Tensor, q_side: torch.Tensor, key_rows: torch.Tensor,
                 params: _PackedParams, want_trace: bool) -> _Backend:
        """The code that serves this call, chosen once. Key selection is never
        differentiated, so it runs on the kernels whenever they take the tensors; the pair
        stage only when no gradient, trace, active dropout or clamp inside it is needed."""
        selection = nac_kernels.handles_selection(qh, kh)
        pairs = (selection and not want_trace and not (self.training and self.attn_dropout.p > 0)
                 and not (self.clamp is not None and self.clamp.in_pair_stage)
                 and nac_kernels.handles_pairs(q_side, key_rows, params.pair_stage())
                 and params.kernel_arrays[1])   # last: the weights become arrays only for a kernel call
        return _Backend(selection, pairs)

    def _select(self, qh: torch.Tensor, kh: torch.Tensor, vis: Visibility, on_kernels: bool) -> torch.Tensor:
        """qh [B, H, Tq, depth], kh [B, H, Tk, depth] -> idx [B, H, Tq, K] (-1: empty)."""
        B, H, T, _ = qh.shape
        with torch.no_grad():
            if self.select == "all":
                return select_all(T, kh.shape[2], B, H, vis, qh.device)
            if self.select == "block":
                if on_kernels:
                    return nac_kernels.kernel_select_block(qh, BlockPartition.of(kh, self.topk, vis.key_valid), self.topk, vis)
                return select_block(qh, kh, self.topk, vis)
            return (nac_kernels.kernel_select_exact if on_kernels else select_exact)(qh, kh, self.topk, vis)

    # --------------------------------------------------- the pair stage, eq. by eq.
    def _attend(self, q_side: torch.Tensor, q_times: torch.Tensor | None, key_rows: torch.Tensor,
                idx: torch.Tensor, params: _PackedParams, want_trace: bool, on_kernels: bool):
        """Backbone, logits and weighted values for the selected pairs.

        q_side [B,H,Tq,n_inter+2] from :meth:`_query_side`, q_times [B,Tq] or None,
        key_rows [B,H,Tk,>=layout.width] (:class:`KeyLayout`), idx [B,H,Tq,K] into them
        (-1: empty) -> out [B,H,Tq,depth], and the stages' tensors if ``want_trace``.
        ``on_kernels``: the fused kernel computes ``out`` instead (same result).
        """
        if on_kernels:
            out, worst_dt_tau = nac_kernels.attend(
                q_side, q_times, key_rows, idx, params.kernel_arrays[0], self.layout, mode=self.mode,
                euler_steps=self.euler_steps, tau_eps=self.tau_eps, time_input=self.time_input,
                time_weighted_values=self.time_weighted_values)
            if self.mode == "euler":
                _check_euler_stability(torch.tensor(worst_dt_tau), self.euler_steps)
            return out, None
        valid = idx != NO_KEY
        pair, key_times, values = self._gather_pairs(q_side, key_rows, idx)
        n_inter = self.layout.n_inter
        inter, command, motor = self._backbone(pair[..., :n_inter], params)
        phi, tau = self._phi_tau(motor, params)
        t_interp = self._time_vector(pair[..., n_inter:], q_times, key_times)
        logits = self._logits(phi, tau, t_interp, valid)
        # Invalid keys get -inf before the softmax (never a multiplied logit); a row
        # with no valid key at all gets weight 0 everywhere instead of NaN.
        weights = self.attn_dropout(_masked_softmax(logits, valid))
        if self.clamp is not None and self.clamp.uniform_weights:
            weights = (valid / valid.sum(dim=-1, keepdim=True).clamp(min=1)).to(logits.dtype)
        out = self._aggregate(weights, t_interp, values)
        if not want_trace:
            return out, None
        empty = ~valid
        stages = dict(inter=inter, command=command, motor=motor, phi=phi, tau=tau, t_interp=t_interp, logits=logits)
        parts = {name: x.masked_fill(empty[..., None] if x.ndim == 5 else empty, math.nan)
                 for name, x in stages.items()}
        return out, dict(parts, weights=weights)

    def _gather_pairs(self, q_side: torch.Tensor, key_rows: torch.Tensor, idx: torch.Tensor):
        """-> pair [B,H,Tq,K,n_inter+2] (query side + key side: the pre-activations of the
        backbone's first layer and of the time affine), key_times and values of the keys
        ([B,H,Tq,K] and [B,H,Tq,K,depth]). Empty slots hold key 0's row (masked later)."""
        layout = self.layout
        gathered = _gather_keys(key_rows, idx.clamp(min=0))                                 # [B,H,Tq,K,F]
        pair = q_side[:, :, :, None] + gathered[..., layout.pair]
        return pair, gathered[..., layout.stamp], gathered[..., layout.value]

    def _backbone(self, inter_in: torch.Tensor, params: _PackedParams):
        """Eq. 14 on the wiring: [B,H,Tq,K,n_inter] pre-activations -> inter, command,
        motor activations [B,H,Tq,K,n] (clamped neurons held, :class:`Clamp`)."""
        B, H, Tq, K, _ = inter_in.shape
        clamp = self.clamp or _INTACT
        inter = _set_head_units(torch.tanh(inter_in), clamp.inter)
        command = torch.tanh(inter.reshape(B, H, Tq * K, -1) @ params.command + params.command_bias[:, None])
        command = _set_head_units(command, clamp.command)
        motor = _set_head_units(torch.tanh(command @ params.motor + params.motor_bias[:, None]), clamp.motor)
        return inter, command.view(B, H, Tq, K, -1), motor.view(B, H, Tq, K, -1)

    def _phi_tau(self, motor: torch.Tensor, params: _PackedParams):
        """Eqs. 15-16: motor [B,H,Tq,K,n_motor] -> phi = sigmoid(.), tau = softplus(.) + eps, [B,H,Tq,K]."""
        B, H, Tq, K, _ = motor.shape
        read = motor.view(B, H, Tq * K, -1) @ params.phi_tau + params.phi_tau_bias[:, None, :]
        phi = torch.sigmoid(read[..., 0]).view(B, H, Tq, K)
        tau = (F.softplus(read[..., 1]) + self.tau_eps).view(B, H, Tq, K)
        return phi, tau

    def _time_vector(self, affine: torch.Tensor, q_times: torch.Tensor | None, key_times: torch.Tensor):
        """t_ij = sigmoid(a_ij t + b_ij): affine [B,H,Tq,K,2] = (a, b), t from ``time_input``."""
        if self.time_input == "elapsed":
            t_in = q_times[:, None, :, None] - key_times
        elif q_times is None:
            t_in = 1.0
        else:
            t_in = q_times[:, None, :, None]
        return torch.sigmoid(affine[..., 0] * t_in + affine[..., 1])

    def _logits(self, phi: torch.Tensor, tau: torch.Tensor, t_interp: torch.Tensor,
                valid: torch.Tensor) -> torch.Tensor:
        """The logit a_ij of eq. 2 at the horizon t_ij, by ``mode``; all ``[B,H,Tq,K]``
        (``valid``: the filled Top-K slots, whose step sizes the Euler guard checks)."""
        if self.mode == "steady":                                          # eq. 18
            return phi / tau
        if self.mode == "exact":                                           # eq. 3
            return phi / tau * -torch.expm1(-tau * t_interp)
        # eq. 2 from a(0) = 0: a <- a + dt (phi - tau a) = a (1 - dt tau) + dt phi, one fused op a step
        dt = t_interp / self.euler_steps
        dt_tau = dt * tau
        _check_euler_stability(dt_tau.masked_fill(~valid, 0.0), self.euler_steps)
        decay, drive = 1.0 - dt_tau, dt * phi
        logit = drive
        for _ in range(self.euler_steps - 1):
            logit = torch.addcmul(drive, logit, decay)
        return logit

    def _aggregate(self, weights: torch.Tensor, t_interp: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Eq. 19 for one head: sum_j w_ij (t_ij) v_j. weights, t_interp [B,H,Tq,K], values
        [B,H,Tq,K,depth] -> [B,H,Tq,depth]."""
        coef = weights * t_interp if self.time_weighted_values else weights
        return (coef[..., None, :] @ values)[..., 0, :]

    def _output(self, out_heads: torch.Tensor) -> torch.Tensor:
        """[B, H, T, depth] -> [B, T, d_model] (a clamped head's output replaced first, :class:`Clamp`)"""
        B, H, T, _ = out_heads.shape
        if self.clamp is not None and self.clamp.heads:
            out_heads = out_heads.clone()
            for head, values in self.clamp.heads.items():
                out_heads[:, head] = torch.as_tensor(values, dtype=out_heads.dtype, device=out_heads.device)
        return self.out_proj(out_heads.transpose(1, 2).reshape(B, T, self.d_model))

    # ----------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                return_trace: bool = False):
        """x ``[B, T, input_dim]``, t ``[B, T]`` seconds, mask ``[B, T]`` bool (True = valid)
        -> y ``[B, T, d_model]`` (and a :class:`NACTrace` if ``return_trace``)."""
        _check_sequence_inputs(x, t, mask, self.input_dim)
        B, T, _ = x.shape
        params = self._params()
        q, k, v = self._sensory(x, params)
        qh, kh, vh = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        if t is not None:
            times = (t - t[:, :1]).to(x.dtype)                     # relative before the cast
        elif self.time_input == "elapsed":
            times = torch.arange(T, dtype=x.dtype, device=x.device).expand(B, T)
        else:
            times = None
        q_side, key_rows = self._query_side(q, params), self._key_rows(k, vh, times, params)
        backend = self._backend(qh, kh, q_side, key_rows, params, return_trace)
        idx = self._select(qh, kh, Visibility(self.causal, self.window, mask), backend.selection_on_kernels)
        out, parts = self._attend(q_side, times, key_rows, idx, params, return_trace, backend.pairs_on_kernels)
        y = self._output(out)
        if not return_trace:
            return y
        return y, NACTrace(q=q, k=k, v=v, topk_idx=idx, **parts)

    # --------------------------------------------------------------- streaming
    def init_cache(self, batch_size: int) -> NACCache:
        """An empty streaming cache: ``window`` slots, or growing if ``window`` is None."""
        p = self.out_proj.weight
        return NACCache(feats=torch.zeros(batch_size, self.num_heads, self.window or 0, self.layout.cache_width,
                                          dtype=p.dtype, device=p.device))

    def step(self, x_t: torch.Tensor, cache: NACCache, t: torch.Tensor | None = None,
             return_trace: bool = False):
        """Consume one frame: x_t ``[B, input_dim]``, t ``[B]`` -> (y_t ``[B, d_model]``, cache).

        Returns exactly what the causal :meth:`forward` (same ``window``) returns at
        this position, in O(window) work. With ``return_trace`` a :class:`NACTrace`
        with T = 1 comes third. ``select="block"`` is refused: its partition is defined
        on a whole sequence, which a stream does not have.
        """
        if not self.causal:
            raise ValueError("causal: step() streams a causal layer; build it with causal=True")
        if self.select == "block":
            raise ValueError("select: step() cannot stream select='block' (its blocks are cut from a whole "
                             "sequence); stream with select='exact' or 'all', or call forward() on the sequence")
        if x_t.ndim != 2 or x_t.shape[1] != self.input_dim:
            raise ValueError(f"x_t: expected [B, input_dim={self.input_dim}], got {list(x_t.shape)}")
        B = x_t.shape[0]
        if cache.feats.shape[0] != B:
            raise ValueError(f"cache: built for batch {cache.feats.shape[0]}, got a batch of {B}")
        if t is not None and tuple(t.shape) != (B,):
            raise ValueError(f"t: expected [B={B}], got {list(t.shape)}")

        params = self._params()
        q, k, v = self._sensory(x_t[:, None], params)
        qh, kh, vh = self._split_heads(q), self._split_heads(k), self._split_heads(v)
        origin = cache.origin
        if t is None:
            now = torch.full((B,), float(cache.steps), dtype=x_t.dtype, device=x_t.device)
        else:
            origin = t.detach().clone() if origin is None else origin
            now = (t - origin).to(x_t.dtype)                          # relative before the cast
        row = torch.cat([self._key_rows(k, vh, now[:, None], params), kh], dim=-1)     # [B,H,1,cache_width]
        cache = _push(cache, row, self.window, origin)
        C = cache.feats.shape[2]
        slots = torch.arange(C, device=x_t.device)
        empty = slots < C - cache.steps   # in the first steps of a window the oldest slots are empty
        q_times = now[:, None] if (t is not None or self.time_input == "elapsed") else None
        q_side, key_rows = self._query_side(q, params), cache.feats
        keys = key_rows[..., self.layout.key]                                         # [B,H,C,depth]
        backend = self._backend(qh, keys, q_side, key_rows, params, return_trace)
        if self.select == "all":
            idx = slots.masked_fill(empty, NO_KEY).expand(B, self.num_heads, 1, C)
        else:  # the forward's exact Top-K (and tie rule) over the slots, which are all in the past
            idx = self._select(qh, keys,
                               Visibility(causal=False, key_valid=(~empty).expand(B, C)),
                               backend.selection_on_kernels)
        out, parts = self._attend(q_side, q_times, key_rows, idx, params, return_trace, backend.pairs_on_kernels)
        y = self._output(out)[:, 0]
        if not return_trace:
            return y, cache
        steps = torch.where(idx == NO_KEY, NO_KEY, idx + (cache.steps - C))
        return y, cache, NACTrace(q=q, k=k, v=v, topk_idx=steps, **parts)

    def extra_repr(self) -> str:
        n_inter, n_cmd, n_motor = self.backbone_wiring.sizes
        return (f"input_dim={self.input_dim}, d_model={self.d_model}, num_heads={self.num_heads}, "
                f"topk={self.topk}, mode={self.mode!r}, select={self.select!r}, causal={self.causal}, "
                f"window={self.window}, backbone=(inter={n_inter}, command={n_cmd}, motor={n_motor})")


def _push(cache: NACCache, row: torch.Tensor, window: int | None, origin: torch.Tensor | None) -> NACCache:
    """Append one step's slot; with a window, drop the oldest one (a shift: O(window))."""
    joined = torch.cat([cache.feats, row], dim=2)
    return NACCache(feats=joined[:, :, 1:] if window is not None else joined, steps=cache.steps + 1,
                    origin=origin)


def _check_euler_stability(dt_tau: torch.Tensor, euler_steps: int) -> None:
    """Explicit Euler on da/dt = -tau a + phi multiplies a by (1 - dt tau) each step: past
    dt tau = 2 that factor exceeds 1 in size and the logit oscillates with growing
    amplitude instead of settling at phi/tau. Refuse rather than return it."""
    worst = float(dt_tau.detach().max()) if dt_tau.numel() else 0.0
    if worst >= 2.0:
        raise ValueError(f"mode 'euler': tau * t / euler_steps reached {worst:.3g} >= 2, where explicit Euler is "
                         f"unstable; raise euler_steps (now {euler_steps}) above tau * t / 2 or use mode='exact'")


def _masked_softmax(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim where invalid entries count as -inf (never a multiplied
    logit): their weight is exactly 0, and a row with no valid entry is all 0, not NaN."""
    masked = logits.masked_fill(~valid, float("-inf"))
    top = masked.amax(dim=-1, keepdim=True).detach().clamp(min=torch.finfo(logits.dtype).min)  # -inf rows: finite
    e = torch.exp(masked - top)
    return e / e.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(e.dtype).tiny)


def _check_clamp(clamp: Clamp, d_model: int, num_heads: int, depth: int, sizes: tuple[int, int, int]) -> None:
    """A ValueError naming the first unit of ``clamp`` that this layer does not have."""
    for name in ("q", "k", "v"):
        for unit in getattr(clamp, name):
            if not 0 <= unit < d_model:
                raise ValueError(f"clamp.{name}: unit {unit} is outside [0, d_model={d_model})")
    for name, n in zip(("inter", "command", "motor"), sizes):
        for key in getattr(clamp, name):
            if not (isinstance(key, tuple) and len(key) == 2 and 0 <= key[0] < num_heads and 0 <= key[1] < n):
                raise ValueError(f"clamp.{name}: expected (head < {num_heads}, unit < {n}), got {key!r}")
    for head, values in clamp.heads.items():
        if not 0 <= head < num_heads or len(values) != depth:
            raise ValueError(f"clamp.heads: expected a head < {num_heads} with {depth} values, got head {head} "
                             f"with {len(values)}")


def _check_hyperparameters(*, input_dim, d_model, num_heads, topk, mode, euler_steps, select, sparsity,
                           window, dropout, backbone_units, time_input, tau_eps) -> None:
    def need(ok: bool, name: str, why: str) -> None:
        if not ok:
            raise ValueError(f"{name}: {why}")

    for name, value in (("input_dim", input_dim), ("d_model", d_model), ("num_heads", num_heads),
                        ("topk", topk), ("euler_steps", euler_steps)):
        need(isinstance(value, int) and value >= 1, name, f"must be an integer >= 1, got {value!r}")
    need(d_model % num_heads == 0, "d_model", f"{d_model} is not divisible by num_heads={num_heads}")
    need(mode in MODES, "mode", f"must be one of {MODES}, got {mode!r}")
    need(select in SELECTIONS, "select", f"must be one of {SELECTIONS}, got {select!r}")
    need(time_input in TIME_INPUTS, "time_input", f"must be one of {TIME_INPUTS}, got {time_input!r}")
    need(isinstance(sparsity, (int, float)) and 0.1 <= sparsity <= 0.9, "sparsity",
         f"must be in [0.1, 0.9], got {sparsity!r}")
    need(window is None or (isinstance(window, int) and window >= 1), "window",
         f"must be None or an integer >= 1, got {window!r}")
    need(0.0 <= dropout < 1.0, "dropout", f"must be in [0, 1), got {dropout!r}")
    need(isinstance(backbone_units, int) and backbone_units >= 6, "backbone_units",
         f"must be an integer >= 6, got {backbone_units!r}")
    need(tau_eps > 0, "tau_eps", f"must be > 0, got {tau_eps!r}")


def _check_sequence_inputs(x, t, mask, input_dim: int) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != input_dim:
        shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected [B, T, input_dim={input_dim}], got {shape}")
    B, T, _ = x.shape
    if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (B, T)):
        raise ValueError(f"t: expected [B={B}, T={T}] timestamps, got {list(getattr(t, 'shape', []))}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (B, T)
                             or mask.dtype != torch.bool):
        raise ValueError(f"mask: expected a bool tensor [B={B}, T={T}], got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {list(getattr(mask, 'shape', []))}")
