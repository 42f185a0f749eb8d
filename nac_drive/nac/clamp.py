"""Interventions on the NAC layer: chosen units held at given values (:class:`Clamp`).

Inside ``with layer.clamped(Clamp(...))`` every call of the layer holds the chosen units
(q/k/v, backbone neurons, whole heads, t_ij, or the weights made uniform) at the given
values, or chooses its keys otherwise than Top-K, which is how the neuron atlas silences a
neuron and how explain measures what each part of the attention carries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Clamp:
    """An intervention on the layer (:meth:`NAC.clamped`): chosen units held at given values
    wherever they are computed, in :meth:`NAC.forward` and :meth:`NAC.step` alike.

    q, k, v: ``{unit: value}``, outputs of the sensory gates, unit in ``[0, d_model)``
    (head ``unit // depth``); inter, command, motor: ``{(head, unit): value}``, a backbone
    neuron of one head, held in every (query, key) pair; heads: ``{head: values [depth]}``,
    that head's output (eq. 19, before the output projection) replaced whole;
    t_interp: ``{head: value}``, that head's t_ij held at ``value`` for every pair (in the
    logits and as the quadrature weight of eq. 19);
    uniform_weights: each query's attention weights replaced by 1 / (its selected keys);
    keys: ``"recent"`` (the K most recent visible keys) or ``"random"`` (K visible keys drawn
    at random, from a stream seeded by ``key_seed``) instead of the K of best q . k: what
    the Top-K selection carries (refused by a layer that selects every key).

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
    t_interp: Mapping[int, float] = field(default_factory=dict)
    uniform_weights: bool = False
    keys: str | None = None
    key_seed: int = 0
    key_stream: torch.Generator | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.keys not in KEY_CHOICES:
            raise ValueError(f"clamp.keys: expected one of {KEY_CHOICES}, got {self.keys!r}")
        if self.keys == "random":
            self.key_stream = torch.Generator().manual_seed(self.key_seed)

    @property
    def in_pair_stage(self) -> bool:
        """Whether the clamp reaches inside the pair stage (then it runs eager torch code)."""
        return bool(self.inter or self.command or self.motor or self.t_interp or self.uniform_weights)


KEY_CHOICES = (None, "recent", "random")


def set_units(x: torch.Tensor, units: Mapping[int, float]) -> torch.Tensor:
    """x ``[..., n]`` with ``x[..., u] = value`` for each clamped unit (a new tensor)."""
    if not units:
        return x
    x = x.clone()
    x[..., torch.tensor(list(units), device=x.device)] = torch.tensor(list(units.values()), dtype=x.dtype,
                                                                      device=x.device)
    return x


def set_head_units(x: torch.Tensor, units: Mapping[tuple[int, int], float]) -> torch.Tensor:
    """x ``[B, H, ..., n]`` with ``x[:, head, ..., unit] = value`` for each clamped neuron (a new tensor)."""
    if not units:
        return x
    x = x.clone()
    for (head, unit), value in units.items():
        x[:, head, ..., unit] = value
    return x


def set_heads(out_heads: torch.Tensor, heads: Mapping[int, Sequence[float] | float]) -> torch.Tensor:
    """out_heads ``[B, H, ...]`` with each clamped head's slice replaced (a new tensor): a head's
    output ``[..., depth]`` by its values, or a per-pair quantity ``[B, H, T, K]`` by one value."""
    if not heads:
        return out_heads
    out_heads = out_heads.clone()
    for head, values in heads.items():
        out_heads[:, head] = torch.as_tensor(values, dtype=out_heads.dtype, device=out_heads.device)
    return out_heads


def check_clamp(clamp: Clamp, d_model: int, num_heads: int, depth: int, sizes: tuple[int, int, int],
                select: str) -> None:
    """A ValueError naming the first unit of ``clamp`` that this layer does not have, or the
    key intervention a layer that selects every key (``select="all"``) cannot take."""
    if clamp.keys is not None and select == "all":
        raise ValueError(f"clamp.keys={clamp.keys!r}: this layer attends to every visible key (select='all'); "
                         f"there is no Top-K selection to replace")
    for head in clamp.t_interp:
        if not 0 <= head < num_heads:
            raise ValueError(f"clamp.t_interp: head {head} is outside [0, num_heads={num_heads})")
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
