"""Expert zips (stable-baselines3's format) read and written without unpickling anything.

An SB3 zip holds ``data`` (JSON; some of its values are base64 pickles, which SB3's
``PPO.load`` runs) and torch files (``policy.pth``, ``policy.optimizer.pth``), which are
pickles too. A zip can come from anywhere (``--init-from``, a run folder), so this
module reads only the JSON values and, with ``torch.load(weights_only=True)``, the
tensors; it never calls ``PPO.load``. Every member is size-checked before it is inflated
(:mod:`nac_drive.io.untrusted_zip`), the network is built from checked JSON fields, first
on PyTorch's "meta" device (shapes, no memory) to be compared with the tensors, and
:func:`export_for_shipping` writes a new zip from the checked parts only.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from nac_drive.agents.ppo_lab.env import Preprocessing
from nac_drive.fields import in_unit_interval
from nac_drive.io.atomic import atomic_write
from nac_drive.io.checkpoint import check_values, parse_json_object
from nac_drive.simulators.carracing import DISCRETE_GAS
from nac_drive.io.untrusted_zip import ZipMemberError, open_zip, read_member

DATA_LIMIT = 64 * 2**20       # the JSON ``data`` of an expert zip is ~60 kB
TENSORS_LIMIT = 512 * 2**20   # a torch file of an expert zip is a few MB
MAX_LAYERS = 16   # hidden layers of a head (the recipe has 1)
# policy_kwargs an expert zip may carry (what `expert train` sets, and SB3 flags that
# change no shapes); anything else is refused.
_POLICY_KWARGS = {"net_arch": (dict, list), "log_std_init": (int, float), "ortho_init": (bool,),
                  "normalize_images": (bool,), "share_features_extractor": (bool,)}
# Plain hyper-parameters a shipped zip carries over from its source.
_SHIPPED_FIELDS = ("num_timesteps", "_total_timesteps", "seed", "n_envs", "n_steps", "batch_size", "n_epochs",
                   "gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm", "normalize_advantage", "target_kl",
                   "use_sde", "sde_sample_freq", "_n_updates")


class LoadedPolicy(NamedTuple):
    """An expert zip's policy and how it drives the raw env."""

    policy: Any  # SB3 ActorCriticCnnPolicy
    continuous: bool  # drives the continuous env (Box(3) actions), else the 5 discrete ones
    preprocessing: Preprocessing  # what its observations are made of (the zip's record)

    @property
    def action_repeat(self) -> int:
        return self.preprocessing.action_repeat


def read_data(path: str | Path) -> dict[str, Any]:
    """The JSON ``data`` member of an SB3 zip (its pickled values are left as text)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"expert zip not found: {path}")
    with open_zip(path) as zf:
        return parse_json_object(read_member(zf, "data", DATA_LIMIT), f"{path}: member 'data'")


def trained_agent_steps(path: str | Path) -> int:
    """Agent steps (of all workers) an SB3 zip had trained for, from its JSON ``data``."""
    steps = read_data(path).get("num_timesteps")
    if not (isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0):
        raise ValueError(f"{path}: field 'num_timesteps' is {steps!r}, expected an integer >= 0")
    return steps


def trained_gamma(path: str | Path) -> float:
    """The discount (per agent step) an SB3 zip was trained with, from its JSON ``data``."""
    gamma = read_data(path).get("gamma")
    if not in_unit_interval(gamma):
        raise ValueError(f"{path}: field 'gamma' is {gamma!r}, expected a number in (0, 1]")
    return float(gamma)


def read_tensors(path: str | Path, member: str) -> Any:
    """A torch file inside an SB3 zip (``policy.pth``, ``policy.optimizer.pth``), loaded with
    ``weights_only=True``: tensors and plain containers only, no code runs."""
    import torch

    with open_zip(path) as zf:
        raw = read_member(zf, member, TENSORS_LIMIT)
    try:
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, EOFError, ...
        raise ValueError(f"{path}: member {member!r} is not a plain tensor file "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def load_expert_zip(path: str | Path, gas: float | None = None) -> LoadedPolicy:
    """Build the SB3 actor-critic of an expert zip without unpickling anything.

    ``gas``: the expert is to drive with GAS pressing this instead of its zip's
    (``expert compare --gas``, ``expert ship --gas``). Raises ``ValueError`` naming the file
    and field when the zip is not a CarRacing expert of this project.
    """
    import torch
    from stable_baselines3.common.policies import ActorCriticCnnPolicy

    path = Path(path)
    data = read_data(path)
    preprocessing = read_preprocessing(data, path)
    observation_space, action_space, continuous = _spaces(data, path, preprocessing)
    if gas is not None:
        if continuous and gas != DISCRETE_GAS:
            raise ValueError(f"gas {gas}: {path} is a continuous expert; only a discrete expert's GAS has a fixed gas")
        preprocessing = replace(preprocessing, gas=gas)
    kwargs = _policy_kwargs(data.get("policy_kwargs", {}), path)
    state = read_tensors(path, "policy.pth")
    if not (isinstance(state, dict) and all(isinstance(k, str) and torch.is_tensor(v) for k, v in state.items())):
        raise ValueError(f"{path}: member 'policy.pth' is not a state dict of named tensors")
    check_values(state, f"{path}: policy.pth")
    try:
        with torch.device("meta"):   # shapes only: a huge net_arch costs nothing here
            skeleton = ActorCriticCnnPolicy(observation_space, action_space, lambda _: 0.0,
                                            **{**kwargs, "ortho_init": False})
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{path}: field 'policy_kwargs' does not build a policy ({exc})") from None
    expected = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    found = {name: tuple(t.shape) for name, t in state.items()}
    if expected != found:
        bad = sorted(set(expected) ^ set(found)) or sorted(n for n in expected if expected[n] != found[n])
        raise ValueError(f"{path}: policy.pth does not fit the network its 'data' describes (first difference: "
                         f"{bad[0]}: {list(found.get(bad[0], ()))} in the file, "
                         f"{list(expected.get(bad[0], ()))} in the network)")
    policy = ActorCriticCnnPolicy(observation_space, action_space, lambda _: 0.0, **kwargs)
    policy.load_state_dict(state)
    policy.set_training_mode(False)
    return LoadedPolicy(policy, continuous, preprocessing)


def read_preprocessing(data: dict[str, Any], path: Path) -> Preprocessing:
    """The zip's ``preprocessing`` record (see :class:`Preprocessing`). Zips written before
    it existed hold at most ``action_repeat`` (4 if absent), and the frame stack is their
    observation space's."""
    record = data.get("preprocessing")
    if record is None:
        obs = data.get("observation_space")
        shape = (obs.get("_shape") or obs.get("shape")) if isinstance(obs, dict) else None
        record = {"action_repeat": data.get("action_repeat", Preprocessing.action_repeat)}
        if isinstance(shape, list) and shape:
            record["frame_stack"] = shape[0]
    if not isinstance(record, dict) or not set(record) <= set(Preprocessing.__dataclass_fields__):
        raise ValueError(f"{path}: field 'preprocessing' is {str(record)[:200]}, expected "
                         f"{Preprocessing().to_json()}")
    try:
        return Preprocessing(**record)
    except ValueError as exc:
        raise ValueError(f"{path}: field 'preprocessing': {exc}") from None


def _spaces(data: dict[str, Any], path: Path, preprocessing: Preprocessing):
    """(observation space, action space, continuous) from ``data``'s plain JSON fields."""
    obs = data.get("observation_space", {})
    shape = obs.get("_shape") or obs.get("shape") if isinstance(obs, dict) else None
    if shape != list(preprocessing.observation_shape):
        raise ValueError(f"{path}: field 'observation_space' has shape {str(shape)[:100]}, its preprocessing "
                         f"makes {list(preprocessing.observation_shape)}")
    act = data.get("action_space", {})
    act_type = str(act.get(":type:", "")) if isinstance(act, dict) else ""
    if "Discrete" in act_type:
        if str(act.get("n")) != "5":  # SB3 writes it as a string
            raise ValueError(f"{path}: field 'action_space' has n={act.get('n')}, expected 5")
        action_space, continuous = gym.spaces.Discrete(5), False
    elif "Box" in act_type and preprocessing.gas != DISCRETE_GAS:
        raise ValueError(f"{path}: field 'preprocessing' has gas {preprocessing.gas}; only a discrete expert's "
                         f"GAS has a fixed gas")
    elif "Box" in act_type:
        box = gym.spaces.Box(np.array([-1.0, 0.0, 0.0], np.float32), np.array([1.0, 1.0, 1.0], np.float32))
        action_space, continuous = box, True
    else:
        raise ValueError(f"{path}: field 'action_space' is {act_type or 'missing'}, "
                         "expected Discrete(5) or Box(3)")
    return gym.spaces.Box(0, 255, preprocessing.observation_shape, np.uint8), action_space, continuous


def _policy_kwargs(kwargs: Any, path: Path) -> dict[str, Any]:
    """``data['policy_kwargs']`` if it holds only plain values of :data:`_POLICY_KWARGS`."""
    if not isinstance(kwargs, dict) or ":serialized:" in kwargs:
        raise ValueError(f"{path}: field 'policy_kwargs' is not plain JSON")
    for name, value in kwargs.items():
        if name not in _POLICY_KWARGS:
            raise ValueError(f"{path}: field 'policy_kwargs' has {name!r}; an expert zip may set only "
                             f"{sorted(_POLICY_KWARGS)}")
        if not isinstance(value, _POLICY_KWARGS[name]) or (bool not in _POLICY_KWARGS[name]
                                                             and isinstance(value, bool)):
            raise ValueError(f"{path}: field 'policy_kwargs.{name}' is {value!r}")
    arch = kwargs.get("net_arch", [])
    layers = [arch] if isinstance(arch, list) else list(arch.values())
    if isinstance(arch, dict) and not set(arch) <= {"pi", "vf"} or not all(
            isinstance(layer, list) and len(layer) <= MAX_LAYERS
            and all(isinstance(u, int) and not isinstance(u, bool) and u >= 1 for u in layer) for layer in layers):
        raise ValueError(f"{path}: field 'policy_kwargs.net_arch' is {str(arch)[:200]}, expected lists of at most "
                         f"{MAX_LAYERS} layer sizes (a list, or {{'pi': [...], 'vf': [...]}})")
    return kwargs


def average_weights(paths: Sequence[str | Path], gas: float | None = None) -> LoadedPolicy:
    """The policy whose every tensor is the mean of those of several zips of one network.

    Meant for the checkpoints one PPO run kept over its last stretch: their average
    (tail averaging, as in stochastic weight averaging, Izmailov et al. 2018) sits in the
    middle of the region the iterates wander through and drives more steadily than any of
    them (BENCHMARKS.md). Each zip is read by :func:`load_expert_zip`; they must record the
    same preprocessing, action space and network, else ``ValueError`` names the first
    that differs.
    """
    import torch

    if not paths:
        raise ValueError("no zips to average")
    loaded = [load_expert_zip(path, gas) for path in paths]
    first = loaded[0]
    kwargs = read_data(paths[0]).get("policy_kwargs", {})
    for path, other in zip(paths[1:], loaded[1:]):
        if (other.preprocessing, other.continuous) != (first.preprocessing, first.continuous) \
                or read_data(path).get("policy_kwargs", {}) != kwargs:
            raise ValueError(f"{path} cannot be averaged with {paths[0]}: its preprocessing, action space or "
                             "network differs")
    states = [item.policy.state_dict() for item in loaded]
    with torch.no_grad():
        first.policy.load_state_dict({name: torch.stack([state[name].float() for state in states]).mean(0)
                                      .to(tensor.dtype) for name, tensor in states[0].items()})
    return first


def export_for_shipping(src: str | Path | Sequence[str | Path], dst: str | Path,
                        gas: float | None = None) -> Path:
    """Write ``src``'s policy as a new SB3 zip ``dst`` without optimizer state (~3x smaller),
    to drive with GAS pressing ``gas`` if given (else as ``src`` does). Several zips as
    ``src`` ship their :func:`average_weights`, with the hyper-parameters of the last and
    ``averaged_checkpoints`` (each one's agent steps) in ``data``.

    Nothing of ``src`` is unpickled or copied as is: the policy is read by
    :func:`load_expert_zip`, and the zip is written from it, its checked JSON fields and a
    handful of plain hyper-parameters. The result loads with :class:`PPOExpert` and with
    SB3's ``PPO.load`` (a fresh optimizer, learning rate and clip range 0).
    """
    from stable_baselines3.common.policies import ActorCriticCnnPolicy
    from stable_baselines3.common.save_util import save_to_zip_file
    from stable_baselines3.common.utils import ConstantSchedule

    sources = [src] if isinstance(src, (str, Path)) else list(src)
    loaded = average_weights(sources, gas)   # one zip: its own weights
    source = read_data(sources[-1])
    policy = loaded.policy
    data: dict[str, Any] = {name: source[name] for name in _SHIPPED_FIELDS
                            if isinstance(source.get(name), (bool, int, float))}
    data.update(policy_class=ActorCriticCnnPolicy,
                policy_kwargs=_policy_kwargs(source.get("policy_kwargs", {}), sources[-1]),
                observation_space=policy.observation_space, action_space=policy.action_space,
                learning_rate=0.0, lr_schedule=ConstantSchedule(0.0), clip_range=0.0,
                preprocessing=loaded.preprocessing.to_json())
    if len(sources) > 1:
        data["averaged_checkpoints"] = [trained_agent_steps(path) for path in sources]
    data.setdefault("n_envs", 1)
    optimizer = policy.optimizer_class(policy.parameters(), lr=0.0, **policy.optimizer_kwargs)
    params = {"policy": policy.state_dict(), "policy.optimizer": optimizer.state_dict()}
    dst = Path(dst)
    atomic_write(dst, lambda tmp: save_to_zip_file(tmp, data=data, params=params))
    return dst


__all__ = ["LoadedPolicy", "ZipMemberError", "average_weights", "export_for_shipping", "load_expert_zip", "read_data",
           "read_preprocessing", "read_tensors", "trained_agent_steps"]
