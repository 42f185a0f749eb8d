"""A stack of layers run as one prepared plan in inference on the CPU, without its module calls.

A policy's encoder (convolutions, flatten, fc) and its head are stacks of small layers: in a
closed loop, one frame at a time, the module calls around them (each Module call, hook check
and argument lookup ~1-2 us of Python, the oneDNN weight reorder of every convolution call)
cost as much as the convolutions' own work (``benchmarks/policy_speed.py --breakdown``).

Called without autograd on a float32 CPU input, the module in eval mode and no hook on any of
its layers, :class:`FusedLayers` runs them as a plan made once per change of their weights,
their modes or the input's shape (:class:`~nac_drive.nac.packing.Derived`): each convolution
through oneDNN's fused operator (``mkldnn._convolution_pointwise``) with its weight reordered
once into oneDNN's layout for that input and a ReLU after it fused in; a Linear as ``F.linear``
(what its module calls); a Flatten as ``flatten``; eval-mode dropout skipped; any other layer
called as it is. Training, gradients, hooks, tracing and export take the modules' own forward,
as does every call inside ``nac_drive.nac.kernels.disabled()`` (the reference).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from nac_drive.nac import kernels
from nac_drive.nac.packing import Derived

# torch's fused CPU convolution (what torch.compile emits for conv + ReLU on the CPU), and the
# weight reorder it reads; absent from a torch built without oneDNN.
_FUSED_CONV = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")
# Layers a plan may skip in eval mode, and those it treats as elementwise (a convolution after
# them reads the shape the one before gave).
_SKIPPED = (nn.Dropout, nn.Identity)
_ELEMENTWISE = (nn.ReLU, nn.ELU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.LeakyReLU)


@dataclass(frozen=True)
class Plan:
    """What :class:`FusedLayers` runs: ``steps`` (function, its arguments after the input), in
    order; ``modules`` the layers it stands for (whose hooks are asked every call)."""

    steps: tuple[tuple[Callable, tuple], ...]
    modules: tuple[nn.Module, ...]
    fuses_convolutions: bool


class FusedLayers:
    """The plan of one module's stack of layers, kept while its weights and layers are unchanged.

        fused = FusedLayers()
        y = fused(module, lambda: [*module.convs, *module.fc], x)   # None: run the modules instead
    """

    def __init__(self):
        self._plan = Derived()
        self.ran = False   # whether a plan has served a call

    def __deepcopy__(self, memo) -> "FusedLayers":
        return FusedLayers()   # a copy's plan is made for its own weights

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def __call__(self, owner: nn.Module, layers: Callable[[], nn.Module | Sequence[nn.Module]],
                 x: torch.Tensor) -> torch.Tensor | None:
        """``owner``'s ``layers()`` (in order, :func:`as_layers`; asked when the plan is made) on x
        ``[B, ...]``, or None where the plan does not serve this call (the caller runs the modules)."""
        global _FUSED_CONV
        if (owner.training or torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu"
                or not kernels.enabled() or kernels.tracing()):
            return None
        plan = None
        try:
            plan = self._plan.get(owner, lambda: make_plan(as_layers(layers()), x.shape), *x.shape)
            if plan is None or kernels.observed(owner, *plan.modules):   # (the owner: a caller may run it instead)
                return None
            for step, args in plan.steps:
                x = step(x, *args)
            self.ran = True
            return x
        except (RuntimeError, TypeError) as e:
            fusing = plan.fuses_convolutions if plan is not None else \
                any(type(layer) is nn.Conv2d for layer in as_layers(layers()))   # (failed making the plan)
            if not fusing:
                raise   # not the fused convolutions' failure
            # torch's private operator changed: the plain convolutions from now on
            _FUSED_CONV = False
            self._plan.clear()
            warnings.warn(f"the fused CPU convolutions failed ({type(e).__name__}: {e}); the encoders take "
                          "torch's plain convolutions from now on", RuntimeWarning, stacklevel=2)
            return None


def as_layers(layers: nn.Module | Sequence[nn.Module]) -> list[nn.Module]:
    """A stack of layers as a list: a Sequential's (or any sequence's) layers in order, and a
    lone layer (a head that is one Linear) as a stack of one."""
    if isinstance(layers, nn.Module) and not isinstance(layers, (nn.Sequential, nn.ModuleList)):
        return [layers]
    return list(layers)


def make_plan(layers: list[nn.Module], input_shape: torch.Size) -> Plan | None:
    """The steps that run ``layers`` on a float32 CPU input of ``input_shape`` as their modules do in
    eval mode; None unless their parameters are float32 on the CPU too.

    A convolution fuses when oneDNN's operator is there, its padding is numeric zeros and its input's
    shape is known (only convolutions and :data:`_ELEMENTWISE` layers before it); else it, like
    any layer the plan does not know, is called as a module."""
    if not all(p.dtype == torch.float32 and p.device.type == "cpu" for layer in layers for p in layer.parameters()):
        return None
    conv = torch.ops.mkldnn._convolution_pointwise if _FUSED_CONV else None
    conv = getattr(conv, "default", conv)   # the overload itself: no overload resolution per call
    steps, shape, i = [], tuple(input_shape), 0
    while i < len(layers):
        layer, after = layers[i], layers[i + 1] if i + 1 < len(layers) else None
        kind = type(layer)
        i += 1
        if kind is nn.Conv2d and conv is not None and shape is not None and len(shape) == 4 \
                and isinstance(layer.padding, tuple) and layer.padding_mode == "zeros":
            relu = type(after) is nn.ReLU
            weight = torch.ops.mkldnn._reorder_convolution_weight(
                layer.weight, list(layer.padding), list(layer.stride), list(layer.dilation), layer.groups,
                [shape[0], layer.in_channels, *shape[2:]])
            steps.append((conv, (weight, layer.bias, list(layer.padding), list(layer.stride), list(layer.dilation),
                                 layer.groups, "relu" if relu else "none", [], "")))
            shape = (shape[0], layer.out_channels, *(_conv_out(size, layer, d) for d, size in enumerate(shape[2:])))
            i += relu
            continue
        if kind is nn.Linear:
            steps.append((F.linear, (layer.weight, layer.bias)))
        elif kind is nn.Flatten:
            steps.append((torch.flatten, (layer.start_dim, layer.end_dim)))
        elif kind is nn.ReLU:
            steps.append((torch.relu, ()))
        elif kind not in _SKIPPED or layer.training:
            steps.append((_call, (layer,)))
        if kind not in _ELEMENTWISE and kind not in _SKIPPED:
            shape = None   # what comes next reads a shape this plan does not follow
    return Plan(tuple(steps), tuple(layers), any(step is conv for step, _ in steps))


def _call(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    return layer(x)


def _conv_out(size: int, conv: nn.Conv2d, dim: int) -> int:
    """The output length of ``conv`` along spatial ``dim`` (0: height, 1: width) for an input of ``size``."""
    span = conv.dilation[dim] * (conv.kernel_size[dim] - 1) + 1
    return (size + 2 * conv.padding[dim] - span) // conv.stride[dim] + 1
