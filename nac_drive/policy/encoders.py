"""Per-frame image encoders: a frame ``[B, C, H, W]`` -> a feature vector ``[B, F]``.

* :class:`CarRacingCNN` - the paper's CarRacing conv stack (3 conv layers with 10, 20
  and 30 channels, kernels 5-5-3; Table 4, after Razzaq et al. 2023) for 96x96 RGB.
* :class:`PilotNet` - NVIDIA's PilotNet (Bojarski et al. 2016) for 66x200 YUV frames:
  5 conv layers (24, 36, 48 @5x5 stride 2; 64, 64 @3x3), ELU.

Both take uint8 or float frames; uint8 frames are scaled to [0, 1] inside, so a
policy can be fed raw simulator images. Frames go through the convolutions in the
channels-last layout (the simulators' own HWC order), which oneDNN runs 1.5x faster on
CPU than NCHW for these small stacks (BENCHMARKS.md §2). In inference on the CPU an
encoder's layers run as one prepared plan (:class:`~nac_drive.policy.fused.FusedLayers`:
the convolutions through oneDNN's fused operator, weights reordered once, each ReLU fused
in, and none of the module calls around them).
"""

from __future__ import annotations

import torch
from torch import nn

from nac_drive.policy.fused import FusedLayers


def _conv_input(frames: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, C, H, W]`` uint8 or float -> ``dtype``, the first convolution's (a policy moved to
    bfloat16 convolves in bfloat16), in channels-last memory (no copy if already)."""
    frames = frames.contiguous(memory_format=torch.channels_last)
    if frames.dtype != torch.uint8:
        return frames.to(dtype)
    if dtype == torch.float32 == torch.get_default_dtype():
        return frames.div(255.0)   # one pass, the same float32 division as the two below
    return frames.to(dtype).div_(255.0)


class FrameEncoder(nn.Module):
    """An encoder's frames ``[B, C, H, W]`` -> ``convs`` -> ``fc`` -> features ``[B, feature_dim]``;
    in inference on the CPU its layers run as one plan (:class:`~nac_drive.policy.fused.FusedLayers`)."""

    frame_shape: tuple[int, int, int]

    def __init__(self, convs: nn.Sequential, fc: nn.Sequential, feature_dim: int):
        super().__init__()
        self.convs, self.fc, self.feature_dim = convs, fc, feature_dim
        self.fused = FusedLayers()

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = _conv_input(frames, torch.float32)   # what a plan takes (its make_plan refuses other weights)
        features = self.fused(self, self.layers, x)
        if features is not None:
            return features
        dtype = self.convs[0].weight.dtype   # (asked only here: ~2 us a frame)
        return self.fc(self.convs(x if dtype == torch.float32 else _conv_input(frames, dtype)))

    def layers(self) -> list[nn.Module]:
        """The layers in the order a frame goes through them."""
        return [*self.convs, *self.fc]


class CarRacingCNN(FrameEncoder):
    """96x96 RGB -> ``feature_dim`` features. ``last_conv`` is the Grad-CAM target."""

    frame_shape = (3, 96, 96)

    def __init__(self, feature_dim: int = 64):
        super().__init__(nn.Sequential(
            nn.Conv2d(3, 10, kernel_size=5, stride=2), nn.ReLU(),    # 46x46
            nn.Conv2d(10, 20, kernel_size=5, stride=2), nn.ReLU(),   # 21x21
            nn.Conv2d(20, 30, kernel_size=3, stride=2), nn.ReLU(),   # 10x10
        ), nn.Sequential(nn.Flatten(), nn.Linear(30 * 10 * 10, feature_dim), nn.ReLU()), feature_dim)

    @property
    def last_conv(self) -> nn.Module:
        return self.convs[4]


class PilotNet(FrameEncoder):
    """66x200 YUV -> ``feature_dim`` features (PilotNet's conv stack and first dense layers)."""

    frame_shape = (3, 66, 200)

    def __init__(self, feature_dim: int = 64):
        super().__init__(nn.Sequential(
            nn.Conv2d(3, 24, 5, stride=2), nn.ELU(),
            nn.Conv2d(24, 36, 5, stride=2), nn.ELU(),
            nn.Conv2d(36, 48, 5, stride=2), nn.ELU(),
            nn.Conv2d(48, 64, 3), nn.ELU(),
            nn.Conv2d(64, 64, 3), nn.ELU(),                           # 64 x 1 x 18
        ), nn.Sequential(nn.Flatten(), nn.Linear(64 * 1 * 18, 100), nn.ELU(),
                         nn.Linear(100, feature_dim), nn.ELU()), feature_dim)

    @property
    def last_conv(self) -> nn.Module:
        return self.convs[8]


ENCODERS = {"carracing_cnn": CarRacingCNN, "pilotnet": PilotNet}
