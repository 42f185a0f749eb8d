"""Where a network runs: the ``--device`` of every verb that runs one (:func:`device_arg`),
resolved to a ``torch.device`` before any work (:func:`resolve_device`).

``auto`` takes CUDA when torch sees a GPU, else Apple's MPS when torch has it, else the CPU.
On the CPU the NAC layer's numba kernels serve inference and training
(:func:`nac_drive.nac.kernels.choose` hands them CPU tensors only); on CUDA or MPS the eager
torch code of the layer runs. Light imports: the CLI builds its flags from this module.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from nac_drive.fields import arg

if TYPE_CHECKING:
    import torch

DEVICE_SYNTAX = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def device_problem(spec: object) -> str | None:
    """Why ``spec`` is not a device this package takes (None if it is one)."""
    if isinstance(spec, str) and DEVICE_SYNTAX.fullmatch(spec):
        return None
    return f"expected auto, cpu, cuda, cuda:N or mps, got {spec!r}"


def device_arg():
    """The ``device`` field of an argument dataclass (its ``--device`` flag): one definition
    for every verb that runs a network."""
    return arg("auto", "where the network runs: auto (CUDA when torch sees a GPU, else MPS, else the CPU), cpu, "
                       "cuda, cuda:N or mps. On the CPU the NAC layer runs its numba kernels, elsewhere its eager "
                       "torch code.", check=device_problem, metavar="DEVICE")


def resolve_device(spec: str) -> "torch.device":
    """``spec`` (``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``) -> the ``torch.device``
    to run on; a malformed spec, or a device this machine lacks, raises ValueError in one
    line (the CLI's exit 2)."""
    import torch

    problem = device_problem(spec)
    if problem:
        raise ValueError(f"--device: {problem}")
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if _mps_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"--device {spec}: torch sees no CUDA GPU on this machine (torch.cuda.is_available() "
                             f"is False); use --device cpu or auto")
        if device.index is not None and device.index >= count:
            raise ValueError(f"--device {spec}: torch sees {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    if device.type == "mps" and not _mps_available():
        raise ValueError(f"--device {spec}: torch has no MPS (Apple GPU) backend on this machine; use --device cpu "
                         f"or auto")
    return device


def _mps_available() -> bool:
    import torch

    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def module_device(module: "torch.nn.Module") -> "torch.device":
    """The device of a module's parameters (the CPU for one without parameters)."""
    import torch

    parameter = _first_parameter(module)
    return torch.device("cpu") if parameter is None else parameter.device


def _first_parameter(module: "torch.nn.Module"):
    """``next(module.parameters(), None)``, read from the modules' own dicts: a policy asks it
    every frame, and ``parameters()``'s generators cost more than the rest of that question."""
    for parameter in module._parameters.values():
        if parameter is not None:
            return parameter
    for child in module._modules.values():
        parameter = None if child is None else _first_parameter(child)
        if parameter is not None:
            return parameter
    return None
