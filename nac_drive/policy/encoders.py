"""Per-frame image encoders: a frame ``[B, C, H, W]`` -> a feature vector ``[B, F]``.

* :class:`CarRacingCNN` - the paper's CarRacing conv stack (3 conv layers with 10, 20
  and 30 channels, kernels 5-5-3; Table 4, after Razzaq et al. 2023) for 96x96 RGB.
* :class:`PilotNet` - NVIDIA's PilotNet (Bojarski et al. 2016) for 66x200 YUV frames:
  5 conv layers (24, 36, 48 @5x5 stride 2; 64, 64 @3x3), ELU.

Both take uint8 or float frames; uint8 frames are scaled to [0, 1] inside, so a
policy can be fed raw simulator images. Frames go through the convolutions in the
channels-last layout (the simulators' own HWC order), which oneDNN runs 1.5x faster on
CPU than NCHW for these small stacks (BENCHMARKS.md §2). In inference on the CPU the
conv stack (:class:`ConvStack`) skips the per-call work around oneDNN's kernels: its
weights reordered once, each ReLU fused into its convolution.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from nac_drive.nac import kernels
from nac_drive.nac.packing import Derived

# torch's fused CPU convolution (what torch.compile emits for conv + ReLU on the CPU), and the
# weight reorder it reads; absent from a torch built without oneDNN.
_FUSED_CONV = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def _conv_input(frames: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, C, H, W]`` uint8 or float -> ``dtype``, the first convolution's (a policy moved to
    bfloat16 convolves in bfloat16), in channels-last memory (no copy if already)."""
    frames = frames.contiguous(memory_format=torch.channels_last)
    if frames.dtype == torch.uint8:
        return frames.to(dtype).div_(255.0)
    return frames.to(dtype)


class ConvStack(nn.Sequential):
    """Convolutions, each followed by its activation: an ``nn.Sequential`` (its parameters and
    their names are a Sequential's) with a fast path for inference on the CPU.

    Called without autograd, in eval mode, on a float32 CPU batch, with no hook on its layers,
    it runs each convolution through oneDNN's fused operator (``mkldnn._convolution_pointwise``)
    with the weight reordered once into oneDNN's layout for that input shape, and a ReLU fused
    into its convolution: the same convolutions, without the weight's reorder and the
    activation's pass of every call (``benchmarks/policy_speed.py --breakdown``). The reordered
    weights are rebuilt whenever a weight changes (:class:`~nac_drive.nac.packing.Derived`);
    training, gradients, hooks, tracing and export take the Sequential's own forward, as does
    every call inside ``nac_drive.nac.kernels.disabled()`` (the reference).
    """

    def __init__(self, *args):
        super().__init__(*args)
        self._reordered = Derived()   # per convolution: its weight in oneDNN's layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[B, C, H, W]`` (channels-last memory) -> the last activation's output."""
        global _FUSED_CONV
        if self._fast_path_serves(x):
            try:
                return self._fused(x)
            except (RuntimeError, TypeError) as e:   # torch's private operator changed: the Sequential from now on
                _FUSED_CONV = False
                warnings.warn(f"the fused CPU convolutions failed ({type(e).__name__}: {e}); the encoders take "
                              "torch's plain convolutions from now on", RuntimeWarning, stacklevel=2)
        return super().forward(x)

    def _fused(self, x: torch.Tensor) -> torch.Tensor:
        layers = list(self)   # (slicing a Sequential would build a new one)
        weights = self._reordered.get(self, lambda: _reordered_weights(layers, x.shape), len(layers), *x.shape)
        if weights is None:
            return super().forward(x)
        for conv, weight, activation in zip(layers[::2], weights, layers[1::2]):
            relu = type(activation) is nn.ReLU
            x = torch.ops.mkldnn._convolution_pointwise(x, weight, conv.bias, conv.padding, conv.stride, conv.dilation,
                                                         conv.groups, "relu" if relu else "none", [], "")
            if not relu:
                x = activation(x)
        return x

    def _fast_path_serves(self, x: torch.Tensor) -> bool:
        return (_FUSED_CONV and not self.training and not torch.is_grad_enabled() and x.device.type == "cpu"
                and x.dtype == torch.float32 and x.ndim == 4 and kernels.enabled() and not kernels.tracing()
                and not kernels.observed(*self))


def _reordered_weights(layers: list[nn.Module], input_shape: torch.Size) -> list[torch.Tensor] | None:
    """Each convolution's weight in the layout oneDNN's kernel reads for its input (the first's
    ``input_shape`` ``[B, C, H, W]``, each next one's the output of the one before); None unless
    ``layers`` are convolutions with numeric zero padding, each followed by an activation."""
    convs = layers[::2]
    if len(layers) != 2 * len(convs) or not all(type(conv) is nn.Conv2d and isinstance(conv.padding, tuple)
                                                and conv.padding_mode == "zeros" for conv in convs):
        return None
    weights, (B, _, H, W) = [], input_shape
    for conv in convs:
        weights.append(torch.ops.mkldnn._reorder_convolution_weight(
            conv.weight, list(conv.padding), list(conv.stride), list(conv.dilation), conv.groups,
            [B, conv.in_channels, H, W]))
        H, W = (_conv_out(size, conv, i) for i, size in enumerate((H, W)))
    return weights


def _conv_out(size: int, conv: nn.Conv2d, dim: int) -> int:
    """The output length of ``conv`` along spatial ``dim`` (0: height, 1: width) for an input of ``size``."""
    span = conv.dilation[dim] * (conv.kernel_size[dim] - 1) + 1
    return (size + 2 * conv.padding[dim] - span) // conv.stride[dim] + 1


class CarRacingCNN(nn.Module):
    """96x96 RGB -> ``feature_dim`` features. ``last_conv`` is the Grad-CAM target."""

    frame_shape = (3, 96, 96)

    def __init__(self, feature_dim: int = 64):
        super().__init__()
        self.convs = ConvStack(
            nn.Conv2d(3, 10, kernel_size=5, stride=2), nn.ReLU(),    # 46x46
            nn.Conv2d(10, 20, kernel_size=5, stride=2), nn.ReLU(),   # 21x21
            nn.Conv2d(20, 30, kernel_size=3, stride=2), nn.ReLU(),   # 10x10
        )
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(30 * 10 * 10, feature_dim), nn.ReLU())
        self.feature_dim = feature_dim

    @property
    def last_conv(self) -> nn.Module:
        return self.convs[4]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(_conv_input(frames, self.convs[0].weight.dtype)))


class PilotNet(nn.Module):
    """66x200 YUV -> ``feature_dim`` features (PilotNet's conv stack and first dense layers)."""

    frame_shape = (3, 66, 200)

    def __init__(self, feature_dim: int = 64):
        super().__init__()
        self.convs = ConvStack(
            nn.Conv2d(3, 24, 5, stride=2), nn.ELU(),
            nn.Conv2d(24, 36, 5, stride=2), nn.ELU(),
            nn.Conv2d(36, 48, 5, stride=2), nn.ELU(),
            nn.Conv2d(48, 64, 3), nn.ELU(),
            nn.Conv2d(64, 64, 3), nn.ELU(),                           # 64 x 1 x 18
        )
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(64 * 1 * 18, 100), nn.ELU(),
                                nn.Linear(100, feature_dim), nn.ELU())
        self.feature_dim = feature_dim

    @property
    def last_conv(self) -> nn.Module:
        return self.convs[8]

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(_conv_input(frames, self.convs[0].weight.dtype)))


ENCODERS = {"carracing_cnn": CarRacingCNN, "pilotnet": PilotNet}
