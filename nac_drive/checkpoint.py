"""Checkpoints as ``config.json`` + ``model.safetensors``: loading one never executes code.

Writes are atomic (temporary file, then ``os.replace``), so a process killed mid-write
leaves the previous checkpoint intact. Optimizer state is flattened into a second
safetensors file plus JSON, so ``--resume`` needs no pickle either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from nac_drive.atomic import atomic_write

CONFIG, WEIGHTS = "config.json", "model.safetensors"
OPTIM_TENSORS, TRAIN_STATE = "optimizer.safetensors", "train_state.json"


class CheckpointError(ValueError):
    """A checkpoint file is missing, corrupt, or does not match the model."""


def write_json(path: Path, data: dict) -> None:
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n"))


def read_json(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write(Path(path), lambda tmp: save_file(tensors, tmp, metadata=metadata))


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def load_state_into(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """``load_state_dict`` with errors that name the file and the first bad tensor."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise CheckpointError(f"{source}: does not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, tensor in state.items():
        if tensor.shape != own[name].shape:
            raise CheckpointError(f"{source}: {name} has shape {list(tensor.shape)}, the model expects "
                                  f"{list(own[name].shape)}")
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise CheckpointError(f"{source}: {name} contains NaN or inf")
    module.load_state_dict(state)


def save_model(directory: Path, config: dict[str, Any], module: torch.nn.Module) -> None:
    directory = Path(directory)
    write_tensors(directory / WEIGHTS, module.state_dict(), metadata={"format": "pt"})
    write_json(directory / CONFIG, config)


def save_optimizer(directory: Path, optimizer: torch.optim.Optimizer, train_state: dict[str, Any]) -> None:
    """Optimizer tensors -> optimizer.safetensors, everything else -> train_state.json."""
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, slot in sd["state"].items():
        for name, value in slot.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{name}"] = value
            else:
                scalars[f"{idx}.{name}"] = value
    write_tensors(Path(directory) / OPTIM_TENSORS, tensors)
    write_json(Path(directory) / TRAIN_STATE, {**train_state, "optimizer": {"param_groups": sd["param_groups"],
                                                                             "scalars": scalars}})


def load_optimizer(directory: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore ``optimizer`` in place; returns the rest of the saved training state."""
    directory = Path(directory)
    train_state = read_json(directory / TRAIN_STATE)
    saved = train_state.pop("optimizer", None)
    if not isinstance(saved, dict) or "param_groups" not in saved:
        raise CheckpointError(f"{directory / TRAIN_STATE}: no optimizer state")
    state: dict[int, dict[str, Any]] = {}
    for key, value in list(read_tensors(directory / OPTIM_TENSORS).items()) + list(saved["scalars"].items()):
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    try:
        optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"{directory}: optimizer state does not match ({e})") from None
    return train_state
