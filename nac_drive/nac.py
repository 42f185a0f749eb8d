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

The backbone's first layer is linear in the concatenation [q_i; k_j], so W_q q_i is
computed once per query and W_k k_j once per key, then added after gathering: the
``[B, H, T, K, 2*depth]`` pair tensor is never built.

Time input ``t`` of the time vector (``time_input``):
* ``"query"`` (default, as in the paper): the query step's timestamp, or 1 without
  timestamps.
* ``"elapsed"``: ``t_i - t_j``, the age of the key when the query is made (frame
  counts without timestamps); natural for a causal window over irregular frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from nac_drive import nac_kernels
from nac_drive.key_selection import NO_KEY, Visibility, select_all, select_block, select_exact
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
    the time step of each selected key, ``-1`` for an empty slot (its weight is 0).
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


@dataclass
class NACCache:
    """Streaming state of :meth:`NAC.step`: the key side of the last ``window`` steps.

    feats ``[B, H, C, F + depth]``: per slot, the packed key side the attention gathers
    (:meth:`NAC._key_features`) followed by the key itself (for key selection). Slots
    are in time order, oldest first, so slot c holds step ``steps - C + c`` (empty if
    negative). ``steps`` counts the frames consumed. :meth:`NAC.step` returns a new
    cache and leaves this one untouched.
    """

    feats: torch.Tensor
    steps: int = 0

    @property
    def positions(self) -> torch.Tensor:
        """``[C]`` the step index held by each slot, ``-1`` for an empty one."""
        C = self.feats.shape[2]
        pos = torch.arange(self.steps - C, self.steps, device=self.feats.device)
        return pos.clamp(min=-1)


@dataclass
class _Weights:
    """The layer's effective (masked, packed) weights, as its computations consume them.

    qkv ``[3*d_model, input_dim]`` and ``[3*d_model]``: the three sensory gates stacked;
    query_side, key_side ``[d_model, H*(n_inter + 2)]``: the query and key halves of the
    backbone's first layer and of the time affine, block-diagonal over the heads so all
    heads take one product (query_bias ``[H*(n_inter + 2)]``); command, motor
    ``[H, in, out]`` with biases ``[H, out]``; gate ``[H, n_motor, 2]`` and ``[H, 2]``:
    the phi and tau heads.
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
    gate: torch.Tensor
    gate_bias: torch.Tensor


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
        euler_steps: explicit Euler steps over the horizon ``t_interp`` (mode euler).
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
            # Heads (eqs. 15, 16) and the time affine (a, b), per head.
            # gate_weight[..., 0] reads phi, [..., 1] reads tau (bias starts tau near 1).
            bound = 1.0 / math.sqrt(n_motor)
            self.gate_weight = nn.Parameter(torch.empty(num_heads, n_motor, 2).uniform_(-bound, bound))
            self.gate_bias = nn.Parameter(torch.tensor([0.0, math.log(math.e - 1.0)]).repeat(num_heads, 1))
            bound = 1.0 / math.sqrt(2 * self.depth)
            self.time_weight = nn.Parameter(torch.empty(num_heads, 2 * self.depth, 2).uniform_(-bound, bound))
            self.time_bias = nn.Parameter(torch.zeros(num_heads, 2))
            self.out_proj = nn.Linear(d_model, d_model)
        self.attn_dropout = nn.Dropout(dropout)
        self._weights_cache: tuple[tuple, _Weights] | None = None

    @property
    def backbone_wiring(self) -> BackboneWiring:
        """The backbone's wiring, read from the mask buffers (which a state dict carries)."""
        return BackboneWiring(*(m.mask.detach().cpu().numpy() for m in (self.inter, self.command, self.motor)))

    # ----------------------------------------------------------------- helpers
    def _weights(self) -> _Weights:
        """Masked and packed weights. Without autograd (inference, streaming) they are
        built once and reused until a parameter or mask changes (in place or replaced):
        a ``step()`` would otherwise spend a third of its time re-masking."""
        # The tensors _build_weights reads, fetched directly: iterating self.parameters()
        # would cost more than the masking it saves.
        wired = (self.q_gate, self.k_gate, self.v_gate, self.inter, self.command, self.motor)
        tensors = [t for m in wired for t in (*m._parameters.values(), *m._buffers.values()) if t is not None]
        tensors += [self.time_weight, self.time_bias, self.gate_weight, self.gate_bias]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return self._build_weights()
        try:
            key = tuple((t.data_ptr(), t._version) for t in tensors)
        except RuntimeError:  # inference tensors (a layer built under inference_mode) have no version
            return self._build_weights()
        if self._weights_cache is None or self._weights_cache[0] != key:
            self._weights_cache = (key, self._build_weights())
        return self._weights_cache[1]

    def _build_weights(self) -> _Weights:
        gates = (self.q_gate, self.k_gate, self.v_gate)
        inter, d = self.inter.effective_weight, self.depth
        query_side = torch.cat([inter[:, :d], self.time_weight[:, :d]], dim=-1)    # [H, depth, P]
        key_side = torch.cat([inter[:, d:], self.time_weight[:, d:]], dim=-1)
        return _Weights(
            qkv_weight=torch.cat([g.effective_weight for g in gates]),
            qkv_bias=torch.cat([g.bias for g in gates]),
            query_side=torch.block_diag(*query_side),
            query_bias=torch.cat([self.inter.bias, self.time_bias], dim=-1).flatten(),
            key_side=torch.block_diag(*key_side),
            command=self.command.effective_weight, command_bias=self.command.bias,
            motor=self.motor.effective_weight, motor_bias=self.motor.bias,
            gate=self.gate_weight, gate_bias=self.gate_bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, H * n] -> [B, H, T, n] (a view)"""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, -1).transpose(1, 2)

    def _sensory(self, x: torch.Tensor, w: _Weights):
        """x [B, T, input_dim] -> q, k, v [B, T, d_model] (the three gates in one product)"""
        return F.linear(x, w.qkv_weight, w.qkv_bias).split(self.d_model, dim=-1)

    def _key_features(self, k: torch.Tensor, vh: torch.Tensor, times: torch.Tensor | None,
                      w: _Weights) -> torch.Tensor:
        """Everything a query gathers from a key, packed so one gather serves all.

        k [B, Tk, d_model], vh [B, H, Tk, depth], times [B, Tk] or None
        -> [B, H, Tk, n_inter + 2 + 1 + depth]: the key half of the backbone's first layer
        (W_k k), of the time affine (a, b), the key's timestamp, and the value.
        """
        B, H, Tk, _ = vh.shape
        stamp = vh.new_zeros(B, H, Tk, 1) if times is None else times[:, None, :, None].expand(B, H, Tk, 1)
        return torch.cat([self._heads(k @ w.key_side), stamp, vh], dim=-1)

    def _query_side(self, q: torch.Tensor, w: _Weights) -> torch.Tensor:
        """q [B, T, d_model] -> [B, H, T, n_inter + 2]: W_q q + b, then the time affine's query part"""
        return self._heads(torch.addmm(w.query_bias, q.flatten(0, 1), w.query_side).view(*q.shape[:2], -1))

    def _logits(self, phi: torch.Tensor, tau: torch.Tensor, t_interp: torch.Tensor) -> torch.Tensor:
        if self.mode == "steady":                                          # eq. 18
            return phi / tau
        if self.mode == "exact":                                           # eq. 3
            return phi / tau * -torch.expm1(-tau * t_interp)
        # eq. 2 from a(0) = 0: a <- a + dt (phi - tau a) = a (1 - dt tau) + dt phi, one fused op a step
        dt = t_interp / self.euler_steps
        decay, drive = 1.0 - dt * tau, dt * phi
        logit = drive
        for _ in range(self.euler_steps - 1):
            logit = torch.addcmul(drive, logit, decay)
        return logit

    def _attend(self, q_side: torch.Tensor, q_times: torch.Tensor | None, key_feats: torch.Tensor,
                idx: torch.Tensor, w: _Weights, want_trace: bool):
        """Backbone, logits and weighted values for selected pairs.

        q_side [B,H,Tq,n_inter+2] from :meth:`_query_side`, q_times [B,Tq] or None,
        key_feats [B,H,Tk,F] from :meth:`_key_features`, idx [B,H,Tq,K] into it
        (-1: empty) -> out [B,H,Tq,depth], parts.

        On CPU, when nothing needs a gradient, a trace or dropout, the fused kernel of
        :mod:`nac_drive.nac_kernels` computes ``out`` instead of the code below.
        """
        if nac_kernels.handles_pairs(q_side, key_feats, w,
                                     training_dropout=self.training and self.attn_dropout.p > 0,
                                     want_trace=want_trace):
            out = nac_kernels.attend(q_side, q_times, key_feats, idx, w, depth=self.depth, mode=self.mode,
                                     euler_steps=self.euler_steps, tau_eps=self.tau_eps,
                                     time_input=self.time_input, time_weighted_values=self.time_weighted_values)
            return out, None
        B, H, Tq, K = idx.shape
        n_inter = q_side.shape[-1] - 2
        valid = idx != NO_KEY
        gathered = _gather_keys(key_feats, idx.clamp(min=0))                                # [B,H,Tq,K,F]
        pair = q_side[:, :, :, None] + gathered[..., :n_inter + 2]                         # [B,H,Tq,K,ni+2]
        key_times, values = gathered[..., n_inter + 2], gathered[..., n_inter + 3:n_inter + 3 + self.depth]

        inter = torch.tanh(pair[..., :n_inter])                                            # [B,H,Tq,K,ni]
        command = torch.tanh(inter.reshape(B, H, Tq * K, -1) @ w.command + w.command_bias[:, None])  # [B,H,TqK,nc]
        motor = torch.tanh(command @ w.motor + w.motor_bias[:, None])                      # [B,H,TqK,nm]
        heads = motor @ w.gate + w.gate_bias[:, None, :]                                   # [B,H,TqK,2]
        phi = torch.sigmoid(heads[..., 0]).view(B, H, Tq, K)
        tau = (F.softplus(heads[..., 1]) + self.tau_eps).view(B, H, Tq, K)

        affine = pair[..., n_inter:]                                                       # [B,H,Tq,K,2]
        if self.time_input == "elapsed":
            t_in = q_times[:, None, :, None] - key_times
        elif q_times is None:
            t_in = 1.0
        else:
            t_in = q_times[:, None, :, None]
        t_interp = torch.sigmoid(affine[..., 0] * t_in + affine[..., 1])

        logits = self._logits(phi, tau, t_interp)
        # Invalid keys get -inf before the softmax (never a multiplied logit); a row
        # with no valid key at all gets weight 0 everywhere instead of NaN.
        weights = self.attn_dropout(_masked_softmax(logits, valid))

        coef = weights * t_interp if self.time_weighted_values else weights
        out = (coef[..., None, :] @ values)[..., 0, :]                                      # [B,H,Tq,depth]
        parts = None
        if want_trace:
            parts = dict(inter=inter, command=command.view(B, H, Tq, K, -1), motor=motor.view(B, H, Tq, K, -1),
                         phi=phi, tau=tau, t_interp=t_interp, logits=logits, weights=weights)
        return out, parts

    def _output(self, out_heads: torch.Tensor) -> torch.Tensor:
        """[B, H, T, depth] -> [B, T, d_model]"""
        B, H, T, _ = out_heads.shape
        return self.out_proj(out_heads.transpose(1, 2).reshape(B, T, self.d_model))

    # ----------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                return_trace: bool = False):
        """x ``[B, T, input_dim]``, t ``[B, T]`` seconds, mask ``[B, T]`` bool (True = valid)
        -> y ``[B, T, d_model]`` (and a :class:`NACTrace` if ``return_trace``)."""
        _check_sequence_inputs(x, t, mask, self.input_dim)
        B, T, _ = x.shape
        w = self._weights()
        q, k, v = self._sensory(x, w)
        qh, kh, vh = self._heads(q), self._heads(k), self._heads(v)
        vis = Visibility(self.causal, self.window, mask)
        with torch.no_grad():
            if self.select == "exact":
                idx = select_exact(qh, kh, self.topk, vis)
            elif self.select == "block":
                idx = select_block(qh, kh, self.topk, vis)
            else:
                idx = select_all(T, T, B, self.num_heads, vis, x.device)
        times = t.to(x.dtype) if t is not None else None
        if times is None and self.time_input == "elapsed":
            times = torch.arange(T, dtype=x.dtype, device=x.device).expand(B, T)
        out, parts = self._attend(self._query_side(q, w), times, self._key_features(k, vh, times, w), idx, w,
                                  return_trace)
        y = self._output(out)
        if not return_trace:
            return y
        return y, NACTrace(q=q, k=k, v=v, topk_idx=idx, **parts)

    # --------------------------------------------------------------- streaming
    def init_cache(self, batch_size: int) -> NACCache:
        """An empty streaming cache: ``window`` slots, or growing if ``window`` is None."""
        p = self.out_proj.weight
        width = self.inter.out_features + 3 + 2 * self.depth   # _key_features + the key
        return NACCache(feats=torch.zeros(batch_size, self.num_heads, self.window or 0, width,
                                          dtype=p.dtype, device=p.device))

    def step(self, x_t: torch.Tensor, cache: NACCache, t: torch.Tensor | None = None,
             return_trace: bool = False):
        """Consume one frame: x_t ``[B, input_dim]``, t ``[B]`` -> (y_t ``[B, d_model]``, cache).

        Returns exactly what the causal :meth:`forward` (same ``window``) returns at
        this position, in O(window) work. ``select="block"`` streams with exact Top-K
        over the cache (a window is small; block partitions are defined on a full
        sequence). With ``return_trace`` a :class:`NACTrace` with T = 1 comes third.
        """
        if not self.causal:
            raise ValueError("causal: step() streams a causal layer; build it with causal=True")
        if x_t.ndim != 2 or x_t.shape[1] != self.input_dim:
            raise ValueError(f"x_t: expected [B, input_dim={self.input_dim}], got {list(x_t.shape)}")
        B = x_t.shape[0]
        if cache.feats.shape[0] != B:
            raise ValueError(f"cache: built for batch {cache.feats.shape[0]}, got a batch of {B}")
        if t is not None and tuple(t.shape) != (B,):
            raise ValueError(f"t: expected [B={B}], got {list(t.shape)}")

        w = self._weights()
        q, k, v = self._sensory(x_t[:, None], w)
        qh, kh, vh = self._heads(q), self._heads(k), self._heads(v)
        now = t.to(x_t.dtype) if t is not None else torch.full((B,), float(cache.steps), dtype=x_t.dtype,
                                                                device=x_t.device)
        new = torch.cat([self._key_features(k, vh, now[:, None], w), kh], dim=-1)     # [B,H,1,F+depth]
        cache = _push(cache, new, self.window)
        C = cache.feats.shape[2]
        slots = torch.arange(C, device=x_t.device)
        empty = slots < C - cache.steps   # in the first steps of a window the oldest slots are empty
        with torch.no_grad():
            if self.select == "all":
                idx = slots.masked_fill(empty, NO_KEY).expand(B, self.num_heads, 1, C)
            else:  # the forward's exact Top-K (and tie rule) over the slots, which are all in the past
                idx = select_exact(qh, cache.feats[..., -self.depth:], self.topk,
                                   Visibility(causal=False, key_valid=(~empty).expand(B, C)))
        q_times = now[:, None] if (t is not None or self.time_input == "elapsed") else None
        out, parts = self._attend(self._query_side(q, w), q_times, cache.feats, idx, w, return_trace)
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


def _push(cache: NACCache, new: torch.Tensor, window: int | None) -> NACCache:
    """Append one step's slot; with a window, drop the oldest one (a shift: O(window))."""
    joined = torch.cat([cache.feats, new], dim=2)
    return NACCache(feats=joined[:, :, 1:] if window is not None else joined, steps=cache.steps + 1)


def _masked_softmax(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim where invalid entries count as -inf (never a multiplied
    logit): their weight is exactly 0, and a row with no valid entry is all 0, not NaN."""
    masked = logits.masked_fill(~valid, float("-inf"))
    top = masked.amax(dim=-1, keepdim=True).detach().clamp(min=torch.finfo(logits.dtype).min)  # -inf rows: finite
    e = torch.exp(masked - top)
    return e / e.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(e.dtype).tiny)


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
