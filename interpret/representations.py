"""What a policy's layers hold at each step of a recorded run, as ``[n, units]`` arrays.

* ``core``: the temporal core's output, what enters the head (every core);
* ``heads``: the NAC heads' outputs (eq. 19, the heads concatenated before the output
  projection; a NAC core only);
* ``q``, ``k``, ``v``: the NAC's sensory gates, read from the run's trace (a NAC core only).

:func:`streamed` streams the run's frames through the policy as it drove
(:meth:`~nac_drive.policy.DrivingPolicy.step_output`, a fresh window at each episode's
start), each frame optionally transformed first (mirrored: :mod:`~nac_drive.interpret.mirror`),
and captures the core's and the heads' outputs with
forward pre-hooks on the policy's head and on the NAC's output projection: the values the
policy computed, not a second code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from nac_drive.interpret.trace import RunTrace

REPRESENTATIONS = ("q", "k", "v", "heads", "core")   # in the order of the layers, input first
NAC_ONLY = {"q": "the NAC's sensory gate q", "k": "the NAC's sensory gate k", "v": "the NAC's sensory gate v",
            "heads": "the NAC heads' outputs"}


@dataclass
class Streamed:
    """A policy's outputs and representations at each streamed step."""

    outputs: np.ndarray          # [n, num_outputs] the head's raw output
    core: np.ndarray             # [n, core.out_dim] the core's output
    heads: np.ndarray | None     # [n, d_model] the NAC heads' outputs concatenated (None: another core)


def has_nac(policy) -> bool:
    """Whether ``policy``'s core holds a NAC layer (its heads and gates can be read)."""
    return getattr(policy.core, "nac", None) is not None


def streamed(policy, run: RunTrace, n: int, transform: Callable[[np.ndarray], np.ndarray] | None = None) -> Streamed:
    """:class:`Streamed` at the run's first ``n`` steps, its frames streamed episode by episode
    (each frame ``[H, W, 3]`` passed through ``transform`` first, if given)."""
    import torch

    captured: dict[str, list[np.ndarray]] = {"core": [], "heads": []}

    def capture(name: str):
        def hook(module, args):
            x = args[0]
            captured[name].append(x.reshape(-1, x.shape[-1]).float().cpu().numpy())
        return hook

    hooks = [policy.head.register_forward_pre_hook(capture("core"))]
    if has_nac(policy):
        hooks.append(policy.core.nac.out_proj.register_forward_pre_hook(capture("heads")))
    outputs = []
    policy.eval()
    try:
        with torch.no_grad():
            for i in range(n):
                if i == 0 or run.episode[i] != run.episode[i - 1]:
                    policy.reset()
                frame = run.frame(i)
                outputs.append(policy.step_output(frame if transform is None else transform(frame)).float().numpy())
    finally:
        for hook in hooks:
            hook.remove()
        policy.reset()
    heads = np.concatenate(captured["heads"]) if captured["heads"] else None
    return Streamed(np.array(outputs), np.concatenate(captured["core"]) if n else np.zeros((0, 0)), heads)


def representations(policy, run: RunTrace, n: int) -> tuple[dict[str, np.ndarray], dict[str, str], Streamed]:
    """(name -> ``[n, units]`` of :data:`REPRESENTATIONS` this policy has, name -> why one is
    left out, the :class:`Streamed` pass) at the run's first ``n`` steps."""
    stream = streamed(policy, run, n)
    found, skipped = {"core": stream.core}, {}
    core = policy.config.core.core
    if not has_nac(policy):
        skipped = {name: f"needs {what}; this policy's core is {core}" for name, what in NAC_ONLY.items()}
    elif not run.has_nac[:n].all():
        skipped = {name: "the trace holds no NAC states on some of these steps" for name in ("q", "k", "v")}
    else:
        found.update({name: getattr(run, name)[:n] for name in ("q", "k", "v")})
    if stream.heads is not None:
        found["heads"] = stream.heads
    return {name: found[name] for name in REPRESENTATIONS if name in found}, skipped, stream
