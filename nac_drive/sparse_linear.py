"""Linear maps whose weights are multiplied by a fixed 0/1 wiring mask on every call.

Masked entries of the effective weight are exactly zero and, because the mask is a
constant factor, their underlying parameters receive exactly zero gradient.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _fan_in_bound(mask: torch.Tensor, in_dim: int) -> float:
    """Uniform init bound 1/sqrt(mean number of live inputs per output neuron)."""
    live_inputs = mask.sum(dim=in_dim).clamp(min=1).mean().item()
    return 1.0 / math.sqrt(live_inputs)


class MaskedLinear(nn.Module):
    """``y = x @ (W * mask)^T + b`` with ``mask`` given as ``[in_features, out_features]``.

    x ``[..., in_features]`` -> y ``[..., out_features]``.
    """

    def __init__(self, mask: np.ndarray, bias: bool = True):
        super().__init__()
        in_features, out_features = mask.shape
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("mask", torch.as_tensor(np.ascontiguousarray(mask.T), dtype=torch.float32))
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        bound = _fan_in_bound(self.mask, in_dim=1)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    @property
    def effective_weight(self) -> torch.Tensor:
        """``[out_features, in_features]``, zero wherever the wiring has no synapse."""
        return self.weight * self.mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.effective_weight, self.bias)

    def extra_repr(self) -> str:
        density = self.mask.mean().item()
        return f"in_features={self.in_features}, out_features={self.out_features}, density={density:.2f}"


class HeadwiseMaskedLinear(nn.Module):
    """One masked linear map per attention head, all heads sharing one wiring mask.

    x ``[B, H, N, in_features]`` -> y ``[B, H, N, out_features]``; weight
    ``[H, in_features, out_features]``, mask ``[in_features, out_features]``.
    """

    def __init__(self, num_heads: int, mask: np.ndarray, bias: bool = True):
        super().__init__()
        in_features, out_features = mask.shape
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("mask", torch.as_tensor(mask, dtype=torch.float32))
        self.weight = nn.Parameter(torch.empty(num_heads, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(num_heads, out_features)) if bias else None
        bound = _fan_in_bound(self.mask, in_dim=0)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    @property
    def effective_weight(self) -> torch.Tensor:
        """``[H, in_features, out_features]``."""
        return self.weight * self.mask

    def forward(self, x: torch.Tensor, bias: bool = True) -> torch.Tensor:
        y = torch.matmul(x, self.effective_weight)
        if bias and self.bias is not None:
            y = y + self.bias[:, None, :]
        return y

    def extra_repr(self) -> str:
        return (f"heads={self.weight.shape[0]}, in_features={self.in_features}, "
                f"out_features={self.out_features}, density={self.mask.mean().item():.2f}")
