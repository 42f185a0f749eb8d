"""Loading a trained policy by where it is: a checkpoint folder, a training run folder (its
``best/``), a Hugging Face Hub id, an ONNX export, or nothing (the policy shipped for a task).
What every ``--policy`` flag goes through.
"""

from __future__ import annotations

import sys
from pathlib import Path


SHIPPED = "shipped:"   # --policy shipped:mha names a shipped policy by its core


def shipped_policy_path(task: str = "carracing", core: str = "nac") -> Path:
    """The policy that ships with the package for ``task`` with temporal core ``core``: CNN+NAC
    for CarRacing and PilotNet+NAC for Udacity (the defaults), and beside them CNN+MHA for
    CarRacing (``core="mha"``) and PilotNet+GRU for Udacity (``core="gru"``), which drive them
    better (the README says by how much)."""
    cores = shipped_cores(task)
    if core not in cores:   # a name, never a path: only a folder that ships is read
        shipped = ", ".join(f"{SHIPPED}{c}" for c in cores)
        raise ValueError(f"policy: no {task} policy with a {core!r} core ships with nac-drive; {task} has {shipped}")
    return _assets() / f"policy_{task}_{core}"


def shipped_cores(task: str = "carracing") -> list[str]:
    """The temporal cores of the policies shipped for ``task``, e.g. ``["mha", "nac"]``."""
    prefix = f"policy_{task}_"
    return sorted(p.name[len(prefix):] for p in _assets().iterdir()
                  if p.name.startswith(prefix) and (p / "config.json").is_file())


def _assets() -> Path:
    from importlib.resources import files

    return Path(str(files("nac_drive") / "assets"))


def load_driving_policy(path: str | Path | None = None, task: str = "carracing", onnx: bool = False,
                        device: str = "cpu"):
    """A :class:`DrivingPolicy` from a checkpoint folder (default: the shipped one for
    ``task``; a training run folder: its ``best/``, :func:`checkpoint_folder`), in eval mode.
    With ``onnx``, a ``.onnx`` file of ``nac-drive export`` gives an
    :class:`~nac_drive.policy.onnx_policy.OnnxPolicy` (onnxruntime; it drives, it has no torch
    modules to look inside); without, such a file is refused in one line. ``device``: where the
    policy's network runs (:func:`~nac_drive.devices.resolve_device`; an ONNX file runs on
    onnxruntime's CPU provider whatever it says). It leaves torch's threads alone: the control
    loops drive on one (:func:`~nac_drive.simulators.carracing.run_episodes`, :mod:`nac_drive.torch_threads`)."""
    from nac_drive.devices import resolve_device
    from nac_drive.policy.driving_policy import DrivingPolicy
    from nac_drive.policy.onnx_policy import is_onnx_path

    device = resolve_device(device)   # before any file is read
    if path is not None and is_onnx_path(path):
        if not onnx:
            raise ValueError(f"policy: {path} is an ONNX export, which only drives (nac-drive drive); "
                             f"this needs the policy's checkpoint folder")
        from nac_drive.policy.onnx_policy import OnnxPolicy

        return OnnxPolicy(path)
    policy = DrivingPolicy.from_pretrained(shipped_policy_path(task) if path is None else checkpoint_folder(path, task))
    return policy.to(device)


def checkpoint_folder(path: str | Path, task: str = "carracing") -> str | Path:
    """``path`` itself, or, for the run folder of ``nac-drive train`` (no ``config.json`` in
    it, one in its ``best/``), that ``best/`` checkpoint, said on stderr; for ``shipped:CORE``,
    the policy shipped for ``task`` with that core. A Hub id passes as it is."""
    if isinstance(path, str) and path.startswith(SHIPPED):
        return shipped_policy_path(task, path[len(SHIPPED):])
    run = Path(path)
    if run.is_dir() and not (run / "config.json").exists() and (run / "best" / "config.json").is_file():
        print(f"policy: {run} is a training run folder; using its best/ checkpoint ({run / 'best'})", file=sys.stderr)
        return run / "best"
    return path
