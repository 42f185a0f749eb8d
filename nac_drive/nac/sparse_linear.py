"""Wired weights: linear maps whose weights are multiplied by a fixed 0/1 wiring mask.

The modules here hold parameters and a mask; :class:`~nac_drive.nac.layer.NAC` reads their
``effective_weight`` (``weight * mask``) and packs several of them into one product, so
they have no ``forward`` of their own. Masked entries of the effective weight are
exactly zero and, because the mask is a constant factor, their underlying parameters
receive exactly zero gradient.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


def _wired_parameters(module: nn.Module, mask: np.ndarray, weight_shape: tuple, bias_shape: tuple | None,
                      in_dim: int) -> None:
    """Register ``mask`` (as a float32 buffer) and uniformly initialised ``weight`` /
    ``bias`` on ``module``.

    The bound is 1/sqrt(mean number of live inputs per output neuron): the usual
    fan-in rule, counting only the synapses the wiring has. It is taken from the NumPy
    mask, so the module can also be built on PyTorch's "meta" device (shapes only).
    """
    mask = np.asarray(mask, dtype=np.float32)
    module.register_buffer("mask", torch.as_tensor(mask))
    live_inputs = float(np.maximum(mask.sum(axis=in_dim), 1).mean(dtype=np.float32))
    bound = 1.0 / math.sqrt(live_inputs)
    module.weight = nn.Parameter(torch.empty(weight_shape).uniform_(-bound, bound))
    module.bias = nn.Parameter(torch.empty(bias_shape).uniform_(-bound, bound)) if bias_shape else None


class MaskedLinear(nn.Module):
    """The weight and bias of ``y = F.linear(x, W * mask, b)``, ``mask`` given as
    ``[in_features, out_features]``: x ``[..., in_features]`` -> y ``[..., out_features]``."""

    def __init__(self, mask: np.ndarray, bias: bool = True):
        super().__init__()
        in_features, out_features = mask.shape
        self.in_features, self.out_features = in_features, out_features
        _wired_parameters(self, np.ascontiguousarray(mask.T), (out_features, in_features),
                          (out_features,) if bias else None, in_dim=1)

    @property
    def effective_weight(self) -> torch.Tensor:
        """``[out_features, in_features]``, zero wherever the wiring has no synapse."""
        return self.weight * self.mask

    def extra_repr(self) -> str:
        density = self.mask.mean().item()
        return f"in_features={self.in_features}, out_features={self.out_features}, density={density:.2f}"


class HeadwiseMaskedLinear(nn.Module):
    """One masked linear map per attention head, all heads sharing one wiring mask:
    ``y[h] = x[h] @ (W[h] * mask) + b[h]``, x ``[B, H, N, in_features]`` -> y
    ``[B, H, N, out_features]``; weight ``[H, in_features, out_features]``, mask
    ``[in_features, out_features]``."""

    def __init__(self, num_heads: int, mask: np.ndarray, bias: bool = True):
        super().__init__()
        in_features, out_features = mask.shape
        self.in_features, self.out_features = in_features, out_features
        _wired_parameters(self, mask, (num_heads, in_features, out_features),
                          (num_heads, out_features) if bias else None, in_dim=0)

    @property
    def effective_weight(self) -> torch.Tensor:
        """``[H, in_features, out_features]``."""
        return self.weight * self.mask

    def extra_repr(self) -> str:
        return (f"heads={self.weight.shape[0]}, in_features={self.in_features}, "
                f"out_features={self.out_features}, density={self.mask.mean().item():.2f}")
