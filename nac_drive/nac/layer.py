"""The Neuronal Attention Circuit layer, in the paper's order (arXiv 2512.10282, §2.2).

For every query step i and each of its K selected keys j, per head (the method that computes
each line on the right):

    q, k, v   = NCP-wired linear maps of x                  eq. 13       NAC.sensory_gates
    j         = the K keys of best q_i . k_j it may see     Top-K        NAC.select_keys
    inter     = tanh(W [q_i; k_j] + b)                      eq. 14       NAC.backbone
    command   = tanh(W_c inter + b_c)
    motor     = tanh(W_m command + b_m)
    phi       = sigmoid(w_phi . motor + b_phi)              eq. 15       NAC.phi_tau
    tau       = softplus(w_tau . motor + b_tau) + eps       eq. 16
    t_ij      = sigmoid(a_ij t + b_ij), (a, b) = A [q_i; k_j] + c        NAC.time_vector
    logit_ij  = phi/tau                      mode "steady", eq. 18       NAC.logits
              = phi/tau (1 - exp(-tau t_ij)) mode "exact",  eqs. 3, 17
              = N Euler steps of da/dt = -tau a + phi, "euler", eq. 2
    (beyond the paper, ``logit_variant``: logit_ij * exp(s_h), or + q_i . k_j / sqrt(depth))
    w_ij      = softmax_j(logit_ij), invalid keys -inf      softmax      NAC.attention_weights
    out_i     = W_o concat_h(sum_j w_ij t_ij v_j)           eq. 19       NAC.aggregate, NAC.output

:meth:`NAC.forward` runs them in that order; :meth:`NAC.attend` is the pair stage (eqs.
14-19). Beside each readable step sits its fast path, as nanoGPT keeps flash attention
beside its five-line attention: on CPU the numba kernels of :mod:`.kernels` run the
selection and the whole pair stage instead, in training with a fused backward (same
results and gradients, tested). The weights are
used packed (:mod:`.packing`: the three gates in one product, the backbone's first layer
split into a query half and a key half, so the ``[B,H,T,K,2*depth]`` pair tensor is never
built). Streaming one frame at a time is :mod:`.streaming`; interventions :mod:`.clamp`.
Where this layer departs from the paper and from the public reference code, and why:
``docs/nac-vs-paper.md``.

Time input ``t`` of the time vector (``time_input``):
* ``"query"`` (default, as in the paper): the query step's timestamp, or 1 without
  timestamps.
* ``"elapsed"``: ``t_i - t_j``, the age of the key when the query is made (frame
  counts without timestamps); natural for a causal window over irregular frames.
Timestamps count from the sequence's first step (:meth:`NAC.step`: from the first step
the cache saw), subtracted in the caller's dtype before the layer casts them to its own:
absolute clock times (~1.7e9 s) in float32 would keep a resolution of minutes.

What the weights can say: phi is in (0, 1) and (1 - exp(-tau t)) / tau < t < 1, so in
mode "exact" every logit lies in (0, 1) and the weights of one query's selected keys
differ by less than a factor e. Measured in closed loop on the shipped policies
(``docs/nac-vs-paper.md`` §3), the attention acts through t_ij, which scales each value in
eq. 19: held at its mean, every drive fails. The Top-K selection matters less (replaced by
random or recent keys it costs a few hard CarRacing tracks, nothing on Udacity), and
uniform weights cost nothing measurable.
Two variants beyond the paper let the weights attend (``logit_variant``; default
``"paper"``): ``"scaled"`` multiplies each head's logits by a learned exp(s_h) (s_h = 0 at
initialisation, the paper's logits), so their spread is no longer capped; ``"qk"`` adds the
score Top-K selected by, q_i . k_j / sqrt(depth), as in dot-product attention, which also
gives q and k a gradient through the score that chooses the keys. Both run the eager pair
stage (the kernels compute the paper's logits only).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

import nac_drive.nac.kernels as kernels
import nac_drive.nac.packing as packing
import nac_drive.nac.streaming as streaming
from nac_drive.nac.clamp import Clamp, check_clamp, set_head_units, set_heads, set_units
from nac_drive.nac.kernels import Backend
from nac_drive.nac.packing import KeyLayout, PackedWeights, pair_scores
from nac_drive.nac.renames import rename_in_place
from nac_drive.nac.selection import NO_KEY, Visibility, select_all, select_block, select_exact, select_instead
from nac_drive.nac.sparse_linear import HeadwiseMaskedLinear, MaskedLinear
from nac_drive.nac.streaming import NACCache
from nac_drive.nac.validation import check_hyperparameters, check_sequence_inputs
from nac_drive.nac.wiring import BackboneWiring, sensory_gate_mask

DEFAULT_WIRING_SEED = 22222  # ncps' own default


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
            by AutoNCP. The paper uses ``d_model + d_model/0.6`` (170 at d_model=64:
            64 + 106 whole neurons, the AutoNCP size ``wiring._units_for_inter(64, 64)``
            gives for 64 inter neurons beside 64 motor ones)
            and calls that too large; the backbone runs once per (query, key) pair, so
            its cost is ``B*H*T*K*units^2``. 16 units (8 inter, 4 command, 4 motor)
            keeps the layer a small fraction of a driving policy's time.
        time_input: ``"query"`` or ``"elapsed"`` (see the module docstring).
        time_weighted_values: use ``t_ij`` as the quadrature weight of eq. 19.
        tau_eps: lower bound added to tau.
        logit_variant: ``"paper"``, or beyond the paper ``"scaled"`` (a learned scale per
            head, parameter ``logit_log_scale [H]``) or ``"qk"`` (+ q . k / sqrt(depth));
            see the module docstring.

    ``mode``, ``euler_steps``, ``select``, ``causal``, ``window`` and ``time_input``
    do not change the parameters: a state dict saved under one setting loads under
    another, and they may be changed on a built layer.
    """

    def __init__(self, input_dim: int, d_model: int = 64, num_heads: int = 4, topk: int = 8,
                 mode: str = "exact", euler_steps: int = 6, select: str = "exact",
                 sparsity: float = 0.5, causal: bool = True, window: int | None = None,
                 dropout: float = 0.0, seed: int | None = None, backbone_units: int = 16,
                 time_input: str = "query", time_weighted_values: bool = True,
                 tau_eps: float = 1e-6, logit_variant: str = "paper"):
        super().__init__()
        check_hyperparameters(input_dim=input_dim, d_model=d_model, num_heads=num_heads, topk=topk,
                              mode=mode, euler_steps=euler_steps, select=select, sparsity=sparsity,
                              window=window, dropout=dropout, backbone_units=backbone_units,
                              time_input=time_input, tau_eps=tau_eps, logit_variant=logit_variant)
        self.input_dim, self.d_model, self.num_heads = input_dim, d_model, num_heads
        self.depth = d_model // num_heads
        self.topk, self.mode, self.euler_steps, self.select = topk, mode, euler_steps, select
        self.sparsity, self.causal, self.window = sparsity, causal, window
        self.time_input, self.time_weighted_values, self.tau_eps = time_input, time_weighted_values, tau_eps
        self.logit_variant = logit_variant
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
            # Backbone (eq. 14), one parameter set per head, one wiring for all heads: inter
            # reads the pair [q_i; k_j] (weight [H, 2*depth, n_inter]).
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
        if logit_variant == "scaled":   # beyond the paper: exp(0) = 1 starts at the paper's logits
            self.logit_log_scale = nn.Parameter(torch.zeros(num_heads))
        self.attn_dropout = nn.Dropout(dropout)
        self.layout = KeyLayout(n_inter=wiring.sizes[0], depth=self.depth)
        self._weights_cache = packing.Derived()    # the packed weights, while the parameters are unchanged
        self.clamp: Clamp | None = None            # set by clamped()

    # ----------------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                return_trace: bool = False):
        """x ``[B, T, input_dim]``, t ``[B, T]`` seconds, mask ``[B, T]`` bool (True = valid)
        -> y ``[B, T, d_model]`` (and a :class:`NACTrace` if ``return_trace``)."""
        check_sequence_inputs(x, t, mask, self.input_dim)
        B, T, _ = x.shape
        packed = self.packed_weights()
        q, k, v = self.sensory_gates(x, packed)                                            # eq. 13
        qh, kh, vh = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        if t is not None:
            times = (t - t[:, :1]).to(x.dtype)                     # relative before the cast
        elif self.time_input == "elapsed":
            times = torch.arange(T, dtype=x.dtype, device=x.device).expand(B, T)
        else:
            times = None
        q_side, rows = self.query_half(q, packed), self.key_rows(k, vh, times, packed)    # eq. 14, split
        backend = self.backend(qh, kh, q_side, rows, packed, return_trace)
        idx = self.select_keys(qh, kh, Visibility(self.causal, self.window, mask),
                               backend.selection_on_kernels)                                 # Top-K
        qk = pair_scores(qh, kh, idx) if self.logit_variant == "qk" else None
        out, stages = self.attend(q_side, times, rows, idx, packed, return_trace,
                                  backend.pairs_on_kernels, qk)                              # eqs. 14-19
        y = self.output(out)
        if not return_trace:
            return y
        return y, self.trace(q, k, v, idx, stages)

    def attend(self, q_side: torch.Tensor, q_times: torch.Tensor | None, rows: torch.Tensor, idx: torch.Tensor,
               packed: PackedWeights, want_trace: bool, on_kernels: bool, qk: torch.Tensor | None = None):
        """The pair stage, eqs. 14-19, for the selected pairs.

        q_side ``[B,H,Tq,n_inter+2]`` (:meth:`query_half`), q_times
        ``[B,Tq]`` or None, rows ``[B,H,Tk,>=layout.width]`` (:meth:`key_rows`), idx
        ``[B,H,Tq,K]`` into them (-1: empty) -> out ``[B,H,Tq,depth]``, and the stages'
        tensors if ``want_trace``. ``on_kernels``: the fused kernel computes ``out``. ``qk``
        ``[B,H,Tq,K]``: the pairs' q . k / sqrt(depth) (``logit_variant="qk"`` only).
        """
        if on_kernels:   # its fast path: the same equations fused in one numba pass (attend_fused, below)
            return self.attend_fused(q_side, q_times, rows, idx, packed, want_trace)
        valid = idx != NO_KEY
        pre, key_times, values = self.gather_pairs(q_side, rows, idx)
        n_inter = self.layout.n_inter
        inter, command, motor = self.backbone(pre[..., :n_inter], packed)                  # eq. 14
        phi, tau = self.phi_tau(motor, packed)                                             # eqs. 15, 16
        t_interp = self.time_vector(pre[..., n_inter:], q_times, key_times)                # t_ij
        if self.clamp is not None:
            t_interp = set_heads(t_interp, self.clamp.t_interp)
        logits = self.logits(phi, tau, t_interp, valid)                                    # eqs. 2, 3, 18
        logits = self.beyond_paper(logits, qk)
        attention = self.attention_weights(logits, valid)                                  # softmax
        out = self.aggregate(attention, t_interp, values)                                  # eq. 19
        if not want_trace:
            return out, None
        stages = dict(inter=inter, command=command, motor=motor, phi=phi, tau=tau, t_interp=t_interp,
                      logits=logits)
        stages = {name: x.masked_fill(~valid[..., None] if x.ndim == 5 else ~valid, math.nan)
                  for name, x in stages.items()}
        return out, dict(stages, weights=attention)

    def attend_fused(self, q_side: torch.Tensor, q_times: torch.Tensor | None, rows: torch.Tensor,
                     idx: torch.Tensor, packed: PackedWeights, want_trace: bool):
        """:meth:`attend` on the numba kernels (:mod:`.kernels`): the same arguments and results,
        the pair stage fused in one pass over the pairs, and under autograd one pass back
        (:class:`~nac_drive.nac.kernels.PairStage`). Tests hold it equal to :meth:`attend`'s
        eager path, gradients included."""
        if kernels.needs_grad(q_side, rows, *packed.pair_stage()):   # training: and one pass back
            stages = None
            out, worst_dt_tau = kernels.attend_for_training(
                q_side, q_times, rows, idx, packed, self.layout,
                lambda: self.attend(q_side, q_times, rows, idx, packed, True, False), **self.pair_settings)
        else:
            out, worst_dt_tau, stages = kernels.attend(q_side, q_times, rows, idx, packed, self.layout,
                                                       trace=want_trace, **self.pair_settings)
        self.check_kernel_stability(worst_dt_tau)
        return out, stages

    @property
    def pair_settings(self) -> dict:
        """The settings of the pair stage, as the kernels take them."""
        return dict(mode=self.mode, euler_steps=self.euler_steps, tau_eps=self.tau_eps, time_input=self.time_input,
                    time_weighted_values=self.time_weighted_values)

    def check_kernel_stability(self, worst_dt_tau: float) -> None:
        """Mode euler: refuse what a kernel computed past the stable step size (:func:`check_euler_stability`)."""
        if self.mode == "euler":
            check_euler_stability(torch.tensor(worst_dt_tau), self.euler_steps)

    # ------------------------------------------------------- the equations
    def sensory_gates(self, x: torch.Tensor, packed: PackedWeights):
        """Eq. 13: x ``[B, T, input_dim]`` -> q, k, v ``[B, T, d_model]``, each an NCP-wired
        linear map of x (the three masked gates stacked into one product; clamped units set)."""
        q, k, v = F.linear(x, packed.qkv_weight, packed.qkv_bias).split(self.d_model, dim=-1)
        if self.clamp is not None:
            q, k, v = set_units(q, self.clamp.q), set_units(k, self.clamp.k), set_units(v, self.clamp.v)
        return q, k, v

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, H * n]`` -> ``[B, H, T, n]`` (a view)."""
        B, T, _ = x.shape
        return x.view(B, T, self.num_heads, -1).transpose(1, 2)

    def select_keys(self, qh: torch.Tensor, kh: torch.Tensor, vis: Visibility, on_kernels: bool) -> torch.Tensor:
        """Top-K (§2.2, input curation): qh ``[B, H, Tq, depth]``, kh ``[B, H, Tk, depth]`` ->
        idx ``[B, H, Tq, K]``, the K keys of best ``q_i . k_j`` among those the query may see
        (``vis``), best first, ties to the newest; -1 in an empty slot. ``select``: "exact",
        "block" (Alg. 2) or "all" (every visible key); under a clamp with ``keys``, K visible
        keys chosen without q . k instead. Never differentiated."""
        B, H, T, _ = qh.shape
        with torch.no_grad():
            if self.select == "all":
                return select_all(T, kh.shape[2], B, H, vis, qh.device)
            if self.clamp is not None and self.clamp.keys is not None:
                visible = select_all(T, kh.shape[2], B, H, vis, qh.device)
                return select_instead(visible, self.topk, self.clamp.keys, self.clamp.key_stream)
            if on_kernels:   # the fast path: the same keys in the same order
                return kernels.select(self.select, qh, kh, self.topk, vis)
            return (select_block if self.select == "block" else select_exact)(qh, kh, self.topk, vis)

    # Eq. 14's first layer and the time affine both read the pair [q_i; k_j], each through one
    # linear map: W [q_i; k_j] + b (n_inter outputs) and A [q_i; k_j] + c = (a_ij, b_ij). Linear in
    # the concatenation, each splits as (W_q q_i + b) + W_k k_j: the query half is computed once
    # per query (query_half), the key half once per key (key_rows), and the two are added per
    # selected pair (gather_pairs), so the [B, H, T, K, 2*depth] pair tensor is never built.
    # packing.pack cuts W and A into these halves once (PackedWeights.query_side, query_bias,
    # key_side: W's columns, then A's), block-diagonal over the heads so all take one product.
    def query_half(self, q: torch.Tensor, packed: PackedWeights) -> torch.Tensor:
        """q ``[B, T, d_model]`` -> ``[B, H, T, n_inter + 2]``: per head ``W_q q_i + b`` (eq. 14's
        first layer), then the time affine's query half ``A_q q_i + c``."""
        halves = torch.addmm(packed.query_bias, q.flatten(0, 1), packed.query_side)
        return self.split_heads(halves.view(*q.shape[:2], -1))

    def key_rows(self, k: torch.Tensor, vh: torch.Tensor, times: torch.Tensor | None,
                 packed: PackedWeights) -> torch.Tensor:
        """k ``[B, Tk, d_model]``, vh ``[B, H, Tk, depth]``, times ``[B, Tk]`` or None -> packed key
        rows ``[B, H, Tk, layout.width]`` (:class:`~nac_drive.nac.packing.KeyLayout`): per head
        ``W_k k_j`` (eq. 14's first layer), the time affine's key half ``A_k k_j``, the key's
        timestamp (0 without), its value."""
        B, H, Tk, _ = vh.shape
        stamp = vh.new_zeros(B, H, Tk, 1) if times is None else times[:, None, :, None].expand(B, H, Tk, 1)
        return torch.cat([self.split_heads(k @ packed.key_side), stamp, vh], dim=-1)

    def gather_pairs(self, q_half: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor):
        """The selected pairs' pre-activations: q_half ``[B,H,Tq,n_inter+2]``, rows
        ``[B,H,Tk,>=layout.width]``, idx ``[B,H,Tq,K]`` -> pre ``[B,H,Tq,K,n_inter+2]``
        (``W [q_i; k_j] + b``, then ``(a_ij, b_ij)``), the keys' timestamps ``[B,H,Tq,K]`` and
        values ``[B,H,Tq,K,depth]``. Empty slots (-1) hold key 0's row (masked later)."""
        B, H, Tk, width = rows.shape
        offset = (torch.arange(B * H, device=rows.device) * Tk).view(B, H, 1, 1)
        gathered = rows.reshape(B * H * Tk, width)[idx.clamp(min=0) + offset]              # [B,H,Tq,K,width]
        pre = q_half[:, :, :, None] + gathered[..., self.layout.pair]
        return pre, gathered[..., self.layout.stamp], gathered[..., self.layout.value]

    def backbone(self, inter_in: torch.Tensor, packed: PackedWeights):
        """Eq. 14 on the NCP wiring: the pairs' first-layer pre-activations ``W [q_i; k_j] + b``
        ``[B,H,Tq,K,n_inter]`` -> inter, command, motor activations ``[B,H,Tq,K,n]``
        (clamped neurons held, :class:`~nac_drive.nac.clamp.Clamp`)."""
        B, H, Tq, K, _ = inter_in.shape
        inter = self.held(torch.tanh(inter_in), "inter")
        command = torch.tanh(inter.reshape(B, H, Tq * K, -1) @ packed.command + packed.command_bias[:, None])
        command = self.held(command, "command")
        motor = self.held(torch.tanh(command @ packed.motor + packed.motor_bias[:, None]), "motor")
        return inter, command.view(B, H, Tq, K, -1), motor.view(B, H, Tq, K, -1)

    def held(self, neurons: torch.Tensor, population: str) -> torch.Tensor:
        """``neurons`` ``[B, H, ..., n]`` of the backbone's ``population`` ("inter", "command",
        "motor") with the ones the clamp holds set; as they are when nothing is clamped."""
        return neurons if self.clamp is None else set_head_units(neurons, getattr(self.clamp, population))

    def phi_tau(self, motor: torch.Tensor, packed: PackedWeights):
        """Eqs. 15, 16: motor ``[B,H,Tq,K,n_motor]`` -> phi = sigmoid(w_phi . motor + b_phi),
        tau = softplus(w_tau . motor + b_tau) + eps, each ``[B,H,Tq,K]``."""
        B, H, Tq, K, _ = motor.shape
        read = motor.view(B, H, Tq * K, -1) @ packed.phi_tau + packed.phi_tau_bias[:, None, :]
        phi = torch.sigmoid(read[..., 0]).view(B, H, Tq, K)
        tau = (F.softplus(read[..., 1]) + self.tau_eps).view(B, H, Tq, K)
        return phi, tau

    def time_vector(self, affine: torch.Tensor, q_times: torch.Tensor | None, key_times: torch.Tensor):
        """t_ij = sigmoid(a_ij t + b_ij): affine ``[B,H,Tq,K,2]`` = (a, b) of the pair, q_times
        ``[B,Tq]`` or None, key_times ``[B,H,Tq,K]``; t from ``time_input`` -> ``[B,H,Tq,K]``."""
        if self.time_input == "elapsed":
            t_in = q_times[:, None, :, None] - key_times
        elif q_times is None:
            t_in = 1.0
        else:
            t_in = q_times[:, None, :, None]
        return torch.sigmoid(affine[..., 0] * t_in + affine[..., 1])

    def logits(self, phi: torch.Tensor, tau: torch.Tensor, t_interp: torch.Tensor,
               valid: torch.Tensor) -> torch.Tensor:
        """The logit a_ij of da/dt = -tau a + phi, a(0) = 0, at the horizon t_ij, by ``mode``:
        eq. 18 (steady), eqs. 3/17 (exact) or eq. 2 (euler); all ``[B,H,Tq,K]`` (``valid``:
        the filled Top-K slots, whose step sizes the Euler guard checks)."""
        if self.mode == "steady":                                          # eq. 18
            return phi / tau
        if self.mode == "exact":                                           # eqs. 3, 17
            return phi / tau * -torch.expm1(-tau * t_interp)
        # eq. 2 from a(0) = 0: a <- a + dt (phi - tau a) = a (1 - dt tau) + dt phi, one fused op a step
        dt = t_interp / self.euler_steps
        dt_tau = dt * tau
        check_euler_stability(dt_tau.masked_fill(~valid, 0.0), self.euler_steps)
        decay, drive = 1.0 - dt_tau, dt * phi
        logit = drive
        for _ in range(self.euler_steps - 1):
            logit = torch.addcmul(drive, logit, decay)
        return logit

    def beyond_paper(self, logits: torch.Tensor, qk: torch.Tensor | None) -> torch.Tensor:
        """The logits ``[B,H,Tq,K]`` of ``logit_variant``: as they are ("paper"), times each
        head's learned exp(s_h) ("scaled"), or plus the pairs' ``qk`` ("qk")."""
        if self.logit_variant == "scaled":
            return logits * self.logit_log_scale.exp()[:, None, None]
        if self.logit_variant == "qk":
            return logits + qk
        return logits

    def attention_weights(self, logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """w_ij = softmax_j(logit_ij) over each query's selected keys ``[B,H,Tq,K]``: an empty
        slot gets -inf (never a multiplied logit), a query without any key weight 0; then
        dropout (training), or uniform weights under a clamp."""
        weights = self.attn_dropout(masked_softmax(logits, valid))
        if self.clamp is not None and self.clamp.uniform_weights:
            weights = (valid / valid.sum(dim=-1, keepdim=True).clamp(min=1)).to(logits.dtype)
        return weights

    def aggregate(self, weights: torch.Tensor, t_interp: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Eq. 19 per head: sum_j w_ij t_ij v_j (t_ij the quadrature weight, if
        ``time_weighted_values``). weights, t_interp ``[B,H,Tq,K]``, values ``[B,H,Tq,K,depth]``
        -> ``[B,H,Tq,depth]``."""
        coef = weights * t_interp if self.time_weighted_values else weights
        return (coef[..., None, :] @ values)[..., 0, :]

    def output(self, out_heads: torch.Tensor) -> torch.Tensor:
        """§2.2.1: the heads ``[B, H, T, depth]`` concatenated and projected -> ``[B, T, d_model]``
        (a clamped head's output replaced first)."""
        B, H, T, _ = out_heads.shape
        if self.clamp is not None:
            out_heads = set_heads(out_heads, self.clamp.heads)
        return self.out_proj(out_heads.transpose(1, 2).reshape(B, T, self.d_model))

    # ------------------------------------------- weights, backend, streaming
    def packed_weights(self) -> PackedWeights:
        """The named weights masked and packed for the products above (:mod:`.packing`);
        without autograd reused until one of them changes."""
        return self._weights_cache.get(self, lambda: packing.pack(
            (self.q_gate, self.k_gate, self.v_gate), self.inter, self.command, self.motor,
            (self.time_weight, self.time_bias), (self.phi_tau_weight, self.phi_tau_bias), self.out_proj))

    def backend(self, qh: torch.Tensor, kh: torch.Tensor, q_side: torch.Tensor, rows: torch.Tensor,
                packed: PackedWeights, want_trace: bool = False) -> Backend:
        """Whether the kernels serve this call's selection and pair stage (:func:`kernels.choose`):
        the pair stage only when no active dropout or clamp inside it is needed (and, under
        autograd, no trace)."""
        return kernels.choose(qh, kh, q_side, rows, packed, self.pairs_fusable(), want_trace)

    def pairs_fusable(self) -> bool:
        """Whether the pair stage may run fused: no active dropout or clamp inside it, the paper's logits."""
        return (not (self.training and self.attn_dropout.p > 0)
                and not (self.clamp is not None and self.clamp.in_pair_stage)
                and self.logit_variant == "paper")

    def streams_on_kernels(self, x_t: torch.Tensor, rows: torch.Tensor, packed: PackedWeights) -> bool:
        """Whether one numba call serves a streamed step (:func:`kernels.stream_step`): nothing
        clamped, the pair stage fusable, and the inputs :func:`kernels.handles_stream` takes."""
        return (self.clamp is None and self.pairs_fusable()
                and kernels.handles_stream(x_t, rows, packed))

    def init_cache(self, batch_size: int) -> NACCache:
        """An empty streaming cache: ``window`` slots, or growing if ``window`` is None."""
        return streaming.empty_cache(batch_size, self.num_heads, self.window, self.layout, self.out_proj.weight)

    def step(self, x_t: torch.Tensor, cache: NACCache, t: torch.Tensor | None = None,
             return_trace: bool = False):
        """Consume one frame: x_t ``[B, input_dim]``, t ``[B]`` -> (y_t ``[B, d_model]``, cache).

        Returns exactly what the causal :meth:`forward` (same ``window``) returns at
        this position, in O(window) work (:mod:`.streaming`). With ``return_trace`` a
        :class:`NACTrace` with T = 1 comes third. ``select="block"`` is refused: its
        partition is defined on a whole sequence, which a stream does not have.
        """
        return streaming.step(self, x_t, cache, t, return_trace)

    def trace(self, q, k, v, topk_idx, stages) -> NACTrace:
        """The :class:`NACTrace` of one call from its q, k, v, selected keys and pair stages."""
        return NACTrace(q=q, k=k, v=v, topk_idx=topk_idx, **stages)

    # ------------------------------------------------------- interventions
    @property
    def backbone_wiring(self) -> BackboneWiring:
        """The backbone's wiring, read from the mask buffers (which a state dict carries)."""
        return BackboneWiring(*(m.mask.detach().cpu().numpy() for m in (self.inter, self.command, self.motor)))

    @contextmanager
    def clamped(self, clamp: Clamp | None):
        """Inside this block every call runs with ``clamp`` (:class:`~nac_drive.nac.clamp.Clamp`;
        None: intact). Units out of range are refused with a ``ValueError`` before anything runs."""
        if clamp is not None:
            check_clamp(clamp, self.d_model, self.num_heads, self.depth, self.backbone_wiring.sizes, self.select)
        before, self.clamp = self.clamp, clamp
        try:
            yield self
        finally:
            self.clamp = before

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        rename_in_place(state_dict, prefix)   # checkpoints written before a rename (renames.py)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        n_inter, n_cmd, n_motor = self.backbone_wiring.sizes
        return (f"input_dim={self.input_dim}, d_model={self.d_model}, num_heads={self.num_heads}, "
                f"topk={self.topk}, mode={self.mode!r}, select={self.select!r}, causal={self.causal}, "
                f"window={self.window}, logit_variant={self.logit_variant!r}, backbone=(inter={n_inter}, command={n_cmd}, motor={n_motor})")


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


def masked_softmax(logits: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim where invalid entries count as -inf (never a multiplied
    logit): their weight is exactly 0, and a row with no valid entry is all 0, not NaN."""
    masked = logits.masked_fill(~valid, float("-inf"))
    top = masked.amax(dim=-1, keepdim=True).detach().clamp(min=torch.finfo(logits.dtype).min)  # -inf rows: finite
    e = torch.exp(masked - top)
    return e / e.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(e.dtype).tiny)


def check_euler_stability(dt_tau: torch.Tensor, euler_steps: int) -> None:
    """Explicit Euler on da/dt = -tau a + phi multiplies a by (1 - dt tau) each step: past
    dt tau = 2 that factor exceeds 1 in size and the logit oscillates with growing
    amplitude instead of settling at phi/tau. Refuse rather than return it."""
    worst = float(dt_tau.detach().max()) if dt_tau.numel() else 0.0
    if worst >= 2.0:
        raise ValueError(f"mode 'euler': tau * t / euler_steps reached {worst:.3g} >= 2, where explicit Euler is "
                         f"unstable; raise euler_steps (now {euler_steps}) above tau * t / 2 or use mode='exact'")
