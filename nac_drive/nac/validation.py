"""The NAC layer's settings and what it refuses: each bad argument or input gets a one-line
``ValueError`` that names it."""

from __future__ import annotations

import torch

MODES = ("exact", "euler", "steady")
SELECTIONS = ("exact", "block", "all")
TIME_INPUTS = ("query", "elapsed")
# "paper": the paper's logits; the others go beyond it (NAC.logit_variant)
LOGIT_VARIANTS = ("paper", "scaled", "qk")


def check_hyperparameters(*, input_dim, d_model, num_heads, topk, mode, euler_steps, select, sparsity,
                          window, dropout, backbone_units, time_input, tau_eps, logit_variant="paper") -> None:
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
    need(logit_variant in LOGIT_VARIANTS, "logit_variant", f"must be one of {LOGIT_VARIANTS}, got {logit_variant!r}")
    need(isinstance(sparsity, (int, float)) and 0.1 <= sparsity <= 0.9, "sparsity",
         f"must be in [0.1, 0.9], got {sparsity!r}")
    need(window is None or (isinstance(window, int) and window >= 1), "window",
         f"must be None or an integer >= 1, got {window!r}")
    need(0.0 <= dropout < 1.0, "dropout", f"must be in [0, 1), got {dropout!r}")
    need(isinstance(backbone_units, int) and backbone_units >= 6, "backbone_units",
         f"must be an integer >= 6, got {backbone_units!r}")
    need(tau_eps > 0, "tau_eps", f"must be > 0, got {tau_eps!r}")


def check_sequence_inputs(x, t, mask, input_dim: int) -> None:
    """What :meth:`NAC.forward` takes: x ``[B, T, input_dim]``, t ``[B, T]``, mask ``[B, T]`` bool."""
    if not isinstance(x, torch.Tensor) or x.ndim != 3 or x.shape[-1] != input_dim:
        shape = list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected [B, T, input_dim={input_dim}], got {shape}")
    B, T, _ = x.shape
    if B == 0 or T == 0:
        raise ValueError(f"x: expected at least one sequence of at least one step, got {list(x.shape)}")
    if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (B, T)):
        raise ValueError(f"t: expected [B={B}, T={T}] timestamps, got {list(getattr(t, 'shape', []))}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (B, T)
                             or mask.dtype != torch.bool):
        raise ValueError(f"mask: expected a bool tensor [B={B}, T={T}], got "
                         f"{getattr(mask, 'dtype', type(mask).__name__)} {list(getattr(mask, 'shape', []))}")


def check_step_inputs(x_t, cache_batch: int, t, input_dim: int, causal: bool, select: str) -> None:
    """What :meth:`NAC.step` takes: a causal layer that does not select by blocks, x_t
    ``[B, input_dim]`` for a cache built for batch B, t ``[B]``."""
    if not causal:
        raise ValueError("causal: step() streams a causal layer; build it with causal=True")
    if select == "block":
        raise ValueError("select: step() cannot stream select='block' (its blocks are cut from a whole "
                         "sequence); stream with select='exact' or 'all', or call forward() on the sequence")
    if x_t.ndim != 2 or x_t.shape[1] != input_dim:
        raise ValueError(f"x_t: expected [B, input_dim={input_dim}], got {list(x_t.shape)}")
    B = x_t.shape[0]
    if B == 0:
        raise ValueError(f"x_t: expected at least one sequence, got {list(x_t.shape)}")
    if cache_batch != B:
        raise ValueError(f"cache: built for batch {cache_batch}, got a batch of {B}")
    if t is not None and tuple(t.shape) != (B,):
        raise ValueError(f"t: expected [B={B}], got {list(t.shape)}")
