"""Checkpoints as ``config.json`` + ``model.safetensors``: loading one never executes code.

Writes are atomic (temporary file, then ``os.replace``), so a process killed mid-write
leaves the previous checkpoint intact. Optimizer state is flattened into a second
safetensors file plus JSON, so ``--resume`` needs no pickle either.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from nac_drive.io import bounded_json
from nac_drive.io.atomic import atomic_write
from nac_drive.io.capped_read import FileRefused, read_capped

CONFIG, WEIGHTS = "config.json", "model.safetensors"
OPTIM_TENSORS, TRAIN_STATE = "optimizer.safetensors", "train_state.json"
MAX_ABS_WEIGHT = 1e4   # the shipped networks' largest weight is ~1; 3e38 is a crafted or broken file
MAX_JSON_BYTES = 16 * 2**20   # a config or training state is a few kB; refuse to parse anything near this


class CheckpointError(ValueError):
    """A checkpoint file is missing, corrupt, or does not match the model."""


def write_json(path: Path, data: dict) -> None:
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n"))


def read_json(path: Path) -> dict:
    """A JSON object from ``path`` (at most :data:`MAX_JSON_BYTES`)."""
    try:
        raw = read_capped(path, MAX_JSON_BYTES)
    except FileRefused as e:
        raise CheckpointError(str(e)) from None
    return parse_json_object(raw, path)


def parse_json_object(raw: bytes, source: Path | str) -> dict:
    """``raw`` as a JSON object; a :class:`CheckpointError` naming ``source`` otherwise."""
    try:
        data = bounded_json.loads(raw)
    except ValueError as e:   # json.JSONDecodeError and UnicodeDecodeError among them
        raise CheckpointError(f"{source}: not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{source}: expected a JSON object")
    return data


def dataclass_from_json(cls, data: dict[str, Any], where: str):
    """Build the dataclass ``cls`` from JSON ``data``; a ``ValueError`` names any unknown
    key or a value whose JSON type differs from the field default's."""
    defaults = cls()
    unknown = sorted(set(data) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}")
    for name, value in data.items():
        default = getattr(defaults, name)
        if isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif isinstance(default, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif isinstance(default, (str, list, dict)):
            ok = isinstance(value, type(default))
        elif is_dataclass(default):   # a nested one: an object, which its own class then checks
            ok = isinstance(value, dict)
        else:   # None (optional)
            ok = True
        if not ok:
            expected = "JSON object" if is_dataclass(default) else type(default).__name__
            raise ValueError(f"{where}.{name}: expected a {expected}, got {value!r}")
    return cls(**data)


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


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a safetensors file, from its header alone (no data read)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None


def check_shapes(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]], source: Path) -> None:
    """Every tensor name of ``expected`` (the model's) is in ``found`` (the file's) with the
    same shape, and nothing else is; otherwise a :class:`CheckpointError` naming the first."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{source}: does not match the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, shape in found.items():
        if tuple(shape) != tuple(expected[name]):
            raise CheckpointError(f"{source}: {name} has shape {list(shape)}, the model expects "
                                  f"{list(expected[name])}")


def load_state_into(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    """``load_state_dict`` with errors that name the file and the first bad tensor."""
    check_shapes({k: tuple(v.shape) for k, v in module.state_dict().items()},
                 {k: tuple(v.shape) for k, v in state.items()}, source)
    check_values(state, source)
    module.load_state_dict(state)


def check_values(state: dict[str, torch.Tensor], source: Path | str) -> None:
    """Every floating tensor of ``state`` finite and within :data:`MAX_ABS_WEIGHT`; otherwise a
    :class:`CheckpointError` naming the file and the first bad tensor (such weights load, then
    fail or drive on NaN mid-run)."""
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            continue
        if not torch.isfinite(tensor).all():
            raise CheckpointError(f"{source}: {name} contains NaN or inf")
        largest = float(tensor.abs().max()) if tensor.numel() else 0.0
        if largest > MAX_ABS_WEIGHT:
            raise CheckpointError(f"{source}: {name} holds {largest:.3g}, past the {MAX_ABS_WEIGHT:g} a trained "
                                  f"network's weight stays within")


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
    if not (isinstance(saved, dict) and isinstance(saved.get("param_groups"), list)
            and isinstance(saved.get("scalars"), dict)):
        raise CheckpointError(f"{directory / TRAIN_STATE}: no optimizer state")
    state: dict[int, dict[str, Any]] = {}
    for key, value in list(read_tensors(directory / OPTIM_TENSORS).items()) + list(saved["scalars"].items()):
        idx, _, name = key.partition(".")
        if not (idx.isdigit() and name):
            raise CheckpointError(f"{directory}: optimizer state {key!r} is not '<parameter index>.<name>'")
        state.setdefault(int(idx), {})[name] = value
    restore_optimizer(optimizer, {"state": state, "param_groups": saved["param_groups"]}, directory)
    return train_state


def restore_optimizer(optimizer: torch.optim.Optimizer, state_dict: Any, source: Path | str) -> None:
    """``optimizer.load_state_dict(state_dict)`` once every state is checked to belong to a
    parameter and to have its shape (torch checks neither, and a mismatch would surface
    only at the next step); a :class:`CheckpointError` naming ``source`` otherwise."""
    if not (isinstance(state_dict, dict) and isinstance(state_dict.get("state"), dict)
            and isinstance(state_dict.get("param_groups"), list)):
        raise CheckpointError(f"{source}: not an optimizer state (state + param_groups)")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    try:   # torch pairs the saved groups' parameter ids with the optimizer's parameters in order
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
    except (TypeError, KeyError):
        raise CheckpointError(f"{source}: optimizer param_groups without parameter lists") from None
    if not all(isinstance(i, int) for i in saved_ids):
        raise CheckpointError(f"{source}: optimizer param_groups name parameters by other than integers")
    if len(saved_ids) != len(params):
        raise CheckpointError(f"{source}: optimizer state for {len(saved_ids)} parameters, the model has "
                              f"{len(params)}")
    param_of = dict(zip(saved_ids, params))
    for idx, slot in state_dict["state"].items():
        param = param_of.get(idx) if isinstance(idx, int) else None
        if param is None or not isinstance(slot, dict):
            raise CheckpointError(f"{source}: optimizer state {idx!r} names no parameter of the model")
        for name, value in slot.items():
            if torch.is_tensor(value) and value.numel() > 1 and value.shape != param.shape:
                raise CheckpointError(f"{source}: optimizer state {idx}.{name} has shape {list(value.shape)}, "
                                      f"the parameter {list(param.shape)}")
    try:
        optimizer.load_state_dict(state_dict)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{source}: optimizer state does not match ({type(e).__name__}: {e})") from None
