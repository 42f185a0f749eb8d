"""The driving policy: per-frame encoder -> temporal core over a causal window -> head.

    policy = DrivingPolicy(PolicyConfig(core=CoreConfig(core="nac", window=16)))
    outputs = policy(frames, t)            # frames [B, T, C, H, W] uint8/float -> [B, T, num_outputs]

    policy.reset()                         # closed loop, one frame at a time (LeRobot style)
    action = policy.select_action(obs)     # nac: streams through NAC.step; baselines re-run their window

    actions, _ = policy.predict(obs_batch, episode_start=starts)   # stable-baselines3 protocol
    policy.check_env(env)                  # ValueError naming the space where env and policy disagree

Checkpoints are a folder with ``config.json`` + ``model.safetensors`` + a model card
``README.md`` (:meth:`save_pretrained`); :meth:`from_pretrained` takes such a folder or a
Hugging Face Hub id, :meth:`push_to_hub` publishes one (huggingface_hub's
``PyTorchModelHubMixin``). Loading never unpickles.
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub import ModelCard, PyTorchModelHubMixin
from torch import nn

from nac_drive.devices import module_device
from nac_drive.fields import in_unit_interval
from nac_drive.io import hub
from nac_drive.io.atomic import readable_dir
from nac_drive.io.checkpoint import (CONFIG, WEIGHTS, CheckpointError, check_shapes, dataclass_from_json, load_state_into,
                                  read_json, read_tensors, save_model, tensor_shapes)
from nac_drive.policy.cores import CoreConfig, build_core
from nac_drive.policy.encoders import ENCODERS
from nac_drive.policy.fused import FusedLayers
from nac_drive.policy.model_card import CARD_TEMPLATE, model_card
from nac_drive.nac import upgrade_state_names
from nac_drive.policy.tasks import DISCRETE_GAS, TASKS, Task

FORMAT_VERSION = 1
# Largest value a loaded config may give each size (far above any policy trained here):
# a config.json naming a huge size is refused before anything is built from it.
SIZE_LIMITS = {"feature_dim": 1024, "num_outputs": 256, "core.window": 2048, "core.d_model": 1024,
               "core.num_heads": 64, "core.topk": 2048, "core.euler_steps": 1000, "core.backbone_units": 1024}


@dataclass
class PolicyConfig:
    """Everything needed to rebuild a policy; saved as ``config.json``."""

    task: str = "carracing"
    """"carracing" (96x96 RGB frames) or "udacity" (66x200 YUV after preprocessing)."""
    encoder: str = "carracing_cnn"
    """per-frame encoder: "carracing_cnn" or "pilotnet"."""
    feature_dim: int = 64
    """encoder output features per frame."""
    action: str = "discrete"
    """"discrete" (cross-entropy over num_outputs classes) or "continuous" (regression)."""
    num_outputs: int = 5
    """CarRacing: 5 discrete actions or 3 continuous (steer, gas, brake); Udacity: 1 (steering)."""
    gas: float = DISCRETE_GAS
    """CarRacing, discrete actions: what GAS presses in the env the policy learned to drive
    (gymnasium's discrete env: 0.2; another: :class:`~nac_drive.simulators.carracing.DiscreteActions`)."""
    head_dropout: float = 0.2
    """dropout before the head (the paper's 0.2 for CarRacing)."""
    frame_dt: float = 0.02
    """seconds between frames when observations carry no timestamp (CarRacing runs at 50 FPS)."""
    core: CoreConfig = field(default_factory=CoreConfig)
    format_version: int = FORMAT_VERSION

    def __post_init__(self):
        if isinstance(self.core, dict):
            self.core = dataclass_from_json(CoreConfig, self.core, "core")
        for name, allowed in (("task", tuple(TASKS)), ("encoder", tuple(ENCODERS)), ("action", ("discrete", "continuous"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: must be one of {allowed}, got {getattr(self, name)!r}")
        if self.num_outputs < 1:
            raise ValueError(f"num_outputs: must be >= 1, got {self.num_outputs}")
        if not in_unit_interval(self.gas):
            raise ValueError(f"gas: must be a number in (0, 1], got {self.gas!r}")
        if self.gas != DISCRETE_GAS and (self.task, self.action) != ("carracing", "discrete"):
            raise ValueError(f"gas: only a discrete CarRacing policy's GAS has a fixed gas, got {self.gas}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PolicyConfig":
        """From JSON: unknown keys, ill-typed values and sizes above :data:`SIZE_LIMITS` are refused."""
        config = dataclass_from_json(cls, data, "config")
        for name, limit in SIZE_LIMITS.items():
            owner, _, field_name = name.rpartition(".")
            value = getattr(config.core if owner else config, field_name)
            if not 1 <= value <= limit:
                raise ValueError(f"config.{name}: {value} is outside 1..{limit}")
        for name, value in (("frame_dt", config.frame_dt), ("head_dropout", config.head_dropout),
                            ("core.sparsity", config.core.sparsity), ("core.dropout", config.core.dropout)):
            # frame_dt: a frame period, (0, 1] s (1e308 once drove on NaN timestamps); the rest fractions
            if not (math.isfinite(value) and (0 < value <= 1 if name == "frame_dt" else 0 <= value <= 1)):
                valid = "(0, 1] s" if name == "frame_dt" else "[0, 1]"
                raise ValueError(f"config.{name}: {value} is out of range {valid}")
        return config


class ClosedLoop:
    """What a driving policy does in a closed loop, whatever runs its network: observations
    in, actions out, with its episode's streaming state (LeRobot's ``reset`` /
    ``select_action``, stable-baselines3's ``predict``, the gymnasium spaces).

    A subclass has ``config`` (:class:`PolicyConfig`) and ``frame_shape``, and implements
    :meth:`step_output` (one observation -> the head's output ``[num_outputs]``), keeping its
    state in ``_state`` (None at an episode's start), ``_frames_seen`` and ``_t0``:
    :class:`DrivingPolicy` (torch) and :class:`~nac_drive.policy.onnx_policy.OnnxPolicy`
    (onnxruntime).
    """

    config: PolicyConfig
    trace_enabled: bool = False

    @property
    def task(self) -> Task:
        """What the task makes of observations and outputs (:mod:`nac_drive.policy.tasks`)."""
        return TASKS[self.config.task]

    def reset(self) -> None:
        """Start a new episode: forget the window."""
        self._state = None
        self._frames_seen = 0
        self._t0 = None
        self.last_output: torch.Tensor | None = None
        self.last_trace = None

    def observation_to_frame(self, obs) -> tuple[torch.Tensor, float | None]:
        """A raw observation -> (frame ``[C, H, W]`` tensor, timestamp or None).

        CarRacing: an RGB ``[96, 96, 3]`` uint8 array. Udacity: a dict with ``image``
        (RGB ``[160, 320, 3]`` uint8, preprocessed here) and ``timestamp`` (seconds).
        Anything else is refused in one line (``ValueError``): a float frame would be read
        on the wrong scale (is 1.0 white, or nearly black?), a NaN timestamp poisons the episode.
        """
        timestamp = None
        if isinstance(obs, dict):
            if "image" not in obs:
                raise ValueError(f"obs: expected a frame, or a dict with 'image' (and 'timestamp'); got a dict with "
                                 f"keys {sorted(map(str, obs))[:6]} (a batch of a dataset is not one observation)")
            timestamp = obs.get("timestamp")
            obs = obs["image"]
        image = np.asarray(obs)
        if image.dtype != np.uint8:
            raise ValueError(f"obs: expected a uint8 RGB image (0-255, the observation space), got {image.dtype}: "
                             f"convert it first (np.uint8(frame * 255) from [0, 1], frame.astype(np.uint8) from "
                             f"[0, 255])")
        if timestamp is not None:
            timestamp = _finite_seconds(timestamp)
        image = self.task.frame(image)
        if image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"obs: expected an RGB image [H, W, 3], got shape {image.shape}")
        frame = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
        if tuple(frame.shape) != self.frame_shape:
            raise ValueError(f"obs: expected a {self.frame_shape[1]}x{self.frame_shape[2]} image, "
                             f"got {image.shape[0]}x{image.shape[1]}")
        return frame, timestamp

    def episode_time(self, timestamp: float | None) -> torch.Tensor:
        """A frame's time as the network reads it: ``[1]`` float32 seconds since the episode's
        first frame (subtracted in float64 first), ``frame_dt`` apart without timestamps."""
        if timestamp is None:
            timestamp = self._frames_seen * self.config.frame_dt
        if self._t0 is None:
            self._t0 = timestamp
        return torch.from_numpy(np.array([timestamp - self._t0], np.float32))   # (torch.tensor: 3x the time)

    def step_output(self, obs) -> torch.Tensor:
        """Consume one observation; returns the head's raw output ``[num_outputs]``."""
        raise NotImplementedError

    def output_to_action(self, output: torch.Tensor):
        """The head's output ``[num_outputs]`` -> an action of :attr:`action_space`."""
        return self.task.action(output.float().numpy(), self.config.action)   # bfloat16 has no numpy dtype

    def select_action(self, obs):
        """One frame in, one action out (an int for discrete policies, else an array;
        Udacity: the steering angle in [-1, 1] as a float)."""
        return self.task.actor_action(self.output_to_action(self.step_output(obs)))

    def act(self, obs):
        """:meth:`select_action` under the name of the actor contract (:mod:`nac_drive.policy.actor`)."""
        return self.select_action(obs)

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = True):
        """stable-baselines3's protocol, so ``evaluate_policy`` can score the policy.

        observation ``[n_envs, H, W, 3]`` (or one ``[H, W, 3]``); ``state`` is the list of
        per-env streaming states this method returned last time; ``episode_start``
        ``[n_envs]`` bool resets an env's window. Always deterministic. Actions are
        :attr:`action_space`'s: ints, or ``[n_envs, num_outputs]`` (Udacity: ``[n_envs, 1]``).
        """
        obs = np.asarray(observation)
        single = obs.ndim == 3
        batch = obs[None] if single else obs
        states = list(state) if isinstance(state, (list, tuple)) and len(state) == len(batch) else [None] * len(batch)
        starts = np.ones(len(batch), bool) if episode_start is None else np.asarray(episode_start, bool).reshape(-1)
        actions = []
        for i, frame in enumerate(batch):
            own = (None, 0, None) if starts[i] or states[i] is None else states[i]
            self._state, self._frames_seen, self._t0 = own
            actions.append(self.output_to_action(self.step_output(frame)))
            states[i] = (self._state, self._frames_seen, self._t0)
        actions = np.asarray(actions)
        return (actions[0] if single else actions), states

    # ------------------------------------------------------------------- spaces
    @property
    def observation_space(self):
        """The gymnasium space of one raw observation: CarRacing's RGB ``[96, 96, 3]`` uint8
        frame, or the Udacity simulator's RGB camera frame ``[160, 320, 3]`` uint8."""
        from gymnasium import spaces

        return spaces.Box(0, 255, self.task.camera_shape, np.uint8)

    @property
    def action_space(self):
        """The gymnasium space of what :meth:`predict` returns per env: ``Discrete(num_outputs)``
        for discrete policies; continuous CarRacing: ``Box([-1, 0, 0], [1, 1, 1])`` (steer,
        gas, brake); Udacity: ``Box(-1, 1, (num_outputs,))`` (the steering angle)."""
        return self.task.action_space(self.config.action, self.config.num_outputs)

    def check_env(self, env) -> None:
        """Raise ``ValueError`` naming the space on which ``env`` (a gymnasium env or an SB3
        VecEnv) and this policy disagree, instead of a bare error deep inside ``env.step``."""
        kind = f"{self.config.action} {self.config.task} policy"
        for name in ("observation", "action"):
            ours, theirs = getattr(self, f"{name}_space"), getattr(env, f"{name}_space", None)
            if theirs != ours:
                hint = self.task.env_hint(self.config.action) if name == "action" else ""
                raise ValueError(f"env and policy disagree on the {name} space: the env's is {theirs}, "
                                 f"this {kind}'s is {ours}{hint}")
        if self.config.task == "carracing" and self.config.action == "discrete" and hasattr(env, "get_wrapper_attr"):
            try:
                env_gas = env.get_wrapper_attr("gas")   # DiscreteActions sets it
            except AttributeError:
                env_gas = DISCRETE_GAS
            if env_gas != self.config.gas:
                maker = f"make_carracing({'' if self.config.gas == DISCRETE_GAS else f'gas={self.config.gas!r}'})"
                raise ValueError(f"env and policy disagree on the gas: the env's GAS presses {env_gas}, this "
                                 f"policy learned {self.config.gas} ({maker} makes its env)")


_CLOSED_LOOP_STATE = frozenset({"_state", "_frames_seen", "_t0", "last_output", "last_trace"})


class DrivingPolicy(ClosedLoop, nn.Module, PyTorchModelHubMixin, library_name="nac-drive", license="mit",
                    pipeline_tag="reinforcement-learning", tags=["behaviour-cloning", "driving", "nac-drive"],
                    paper_url="https://arxiv.org/abs/2512.10282", model_card_template=CARD_TEMPLATE):
    def __init__(self, config: PolicyConfig | None = None):
        super().__init__()
        self.config = config = config or PolicyConfig()
        with torch.random.fork_rng():
            torch.manual_seed(config.core.seed)
            self.encoder = ENCODERS[config.encoder](config.feature_dim)
            self.core = build_core(config.feature_dim, config.core, config.frame_dt)
            self.head = nn.Sequential(nn.Dropout(config.head_dropout),
                                      nn.Linear(self.core.out_dim, config.num_outputs))
        self.fused_head = FusedLayers()   # the head without its module calls, in a closed loop on the CPU
        self.trace_enabled = False
        self.reset()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _CLOSED_LOOP_STATE:   # never a parameter, buffer or module: set without Module's checks
            object.__setattr__(self, name, value)   # (~1 us each, and a frame sets three)
        else:
            super().__setattr__(name, value)

    # ------------------------------------------------------------------ training
    @property
    def frame_shape(self) -> tuple[int, int, int]:
        return self.encoder.frame_shape

    def forward(self, frames: torch.Tensor, t: torch.Tensor | None = None, return_trace: bool = False):
        """frames ``[B, T, C, H, W]``, t ``[B, T]`` seconds -> outputs ``[B, T, num_outputs]``."""
        if frames.ndim != 5 or tuple(frames.shape[2:]) != self.frame_shape:
            raise ValueError(f"frames: expected [B, T, {', '.join(map(str, self.frame_shape))}], "
                             f"got {list(frames.shape)}")
        B, T = frames.shape[:2]
        return self.outputs_from_features(self.encoder(frames.flatten(0, 1)).view(B, T, -1), t, return_trace)

    def outputs_from_features(self, features: torch.Tensor, t: torch.Tensor | None = None,
                              return_trace: bool = False):
        """The core and head on encoded frames: features ``[B, T, feature_dim]`` (the encoder's,
        frame by frame), t ``[B, T]`` -> outputs ``[B, T, num_outputs]``."""
        if return_trace:
            y, trace = self.core(features, t, return_trace=True)
            return self.head(y), trace
        return self.head(self.core(features, t))

    # ---------------------------------------------------------------- closed loop
    @torch.inference_mode()
    def step_output(self, obs) -> torch.Tensor:
        """Consume one observation; returns the head's raw output ``[num_outputs]`` (on the
        CPU, as is the trace, wherever the policy runs)."""
        device = module_device(self)
        frame, timestamp = self.observation_to_frame(obs)
        t = self.episode_time(timestamp)
        if device.type != "cpu":   # (a move to where a tensor is still costs a call every frame)
            frame, t = frame.to(device), t.to(device)
        if self._state is None:
            self._state = self.core.init_state(1)
        features = self.encoder(frame[None])
        if self.trace_enabled:
            y, self._state, trace = self.core.step(features, self._state, t=t, return_trace=True)
            self.last_trace = trace if device.type == "cpu" else type(trace)(   # a NACTrace, read as numpy
                **{f.name: getattr(trace, f.name).cpu() for f in dataclasses.fields(trace)})
        else:
            y, self._state = self.core.step(features, self._state, t=t)
        self._frames_seen += 1
        output = self.head_output(y)[0]
        self.last_output = output if device.type == "cpu" else output.cpu()
        return self.last_output

    def head_output(self, y: torch.Tensor) -> torch.Tensor:
        """The head on the core's output y ``[B, core.out_dim]`` -> ``[B, num_outputs]``, as a
        closed loop runs it (without its module calls where its plan serves: :mod:`.fused`)."""
        output = self.fused_head(self.head, lambda: self.head, y)
        return self.head(y) if output is None else output

    def frame_model(self, timestamp: float | None = None) -> nn.Module:
        """An image model ``[B, C, H, W] -> [B, num_outputs]`` for the NEXT frame, with the
        temporal context (the window so far) held fixed: what Grad-CAM needs. ``timestamp``:
        that frame's time in seconds, as its observation carries it (under dropped frames the
        only right one); default one frame period after the last."""
        if timestamp is None:
            timestamp = (self._t0 or 0.0) + self._frames_seen * self.config.frame_dt
        return _FrameModel(self, self._state, _finite_seconds(timestamp))

    # ---------------------------------------------------------------- interventions
    @contextmanager
    def core_shifted(self, shift):
        """Inside this block the core's output reaches the head moved by ``shift``
        ``[core.out_dim]``: the head reads ``y + shift`` wherever it runs (:meth:`forward`,
        :meth:`step_output`, :meth:`frame_model`), while the core, its streaming state
        included, computes as before. None: intact. (:mod:`nac_drive.interpret.probe_steering`.)"""
        if shift is None:
            yield
            return
        shift = torch.as_tensor(shift, dtype=torch.float32, device=module_device(self))
        if tuple(shift.shape) != (self.core.out_dim,) or not torch.isfinite(shift).all():
            raise ValueError(f"shift: expected {self.core.out_dim} finite numbers (the core's output), got "
                             f"shape {list(shift.shape)}")
        hook = self.head.register_forward_pre_hook(lambda head, args: (args[0] + shift.to(args[0].dtype),))
        try:
            yield
        finally:
            hook.remove()

    # ---------------------------------------------------------------- checkpoints
    def save_pretrained(self, save_directory: str | Path, *, config: dict | None = None, repo_id: str | None = None,
                        push_to_hub: bool = False, model_card_kwargs: dict[str, Any] | None = None,
                        **push_to_hub_kwargs) -> Path | str:
        """Write ``config.json``, ``model.safetensors`` and a model card ``README.md`` (kept if
        the folder already has one: the mixin's rule) into ``save_directory``; returns the
        folder, or with ``push_to_hub=True`` the commit URL of :meth:`push_to_hub` to
        ``repo_id`` (default: the folder's name).

        model_card_kwargs: ``data`` (what the policy learnt from), ``held_out_score`` (a
        number; also written as Hub model-index metadata), ``held_out_metric``.
        """
        if config is not None:
            raise ValueError("config: a DrivingPolicy always saves its own PolicyConfig (policy.config)")
        super().save_pretrained(save_directory, model_card_kwargs=model_card_kwargs)
        if push_to_hub:   # not through the mixin's, which hands push_to_hub a config of its own
            return self.push_to_hub(repo_id or Path(save_directory).name, model_card_kwargs=model_card_kwargs,
                                    **push_to_hub_kwargs)
        return Path(save_directory)

    def push_to_hub(self, repo_id: str, *, model_card_kwargs: dict[str, Any] | None = None, **kwargs) -> str:
        """Save into a temporary folder and upload it as one commit (the mixin's
        ``push_to_hub``); the card's loading example names ``repo_id``. Returns the commit URL."""
        return super().push_to_hub(repo_id, model_card_kwargs={"repo_id": repo_id, **(model_card_kwargs or {})},
                                   **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        save_model(save_directory, asdict(self.config), self)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        info = self._hub_mixin_info
        return model_card(self.config, info.model_card_data, info.model_card_template, info.paper_url, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, force_download: bool = False,
                        token: str | bool | None = None, cache_dir: str | Path | None = None,
                        local_files_only: bool = False, revision: str | None = None) -> "DrivingPolicy":
        """A policy from a checkpoint folder or a Hub id (``owner/name``, downloaded into the
        huggingface_hub cache first; the keyword arguments are ``hf_hub_download``'s).

        The mixin's own ``from_pretrained`` is not used: it parses ``config.json`` unchecked
        (any size, any shape) before calling :meth:`_from_pretrained`, which does it all here."""
        return cls._from_pretrained(model_id=str(pretrained_model_name_or_path), revision=revision,
                                    cache_dir=cache_dir, force_download=force_download,
                                    local_files_only=local_files_only, token=token)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None, cache_dir: str | Path | None,
                         force_download: bool, local_files_only: bool, token: str | bool | None,
                         config: Any = None, **unexpected) -> "DrivingPolicy":
        """The mixin's loading hook: a Hub id becomes its cached snapshot folder, then
        :meth:`load_folder` checks it (a ``config`` the mixin parsed is ignored: the file is
        read again, checked)."""
        if unexpected:
            raise ValueError(f"from_pretrained: unexpected arguments {sorted(unexpected)}")
        folder = model_id
        if hub.is_hub_id(model_id):
            folder = hub.download_checkpoint(model_id, revision=revision, cache_dir=cache_dir,
                                             force_download=force_download, local_files_only=local_files_only,
                                             token=token)
        return cls.load_folder(folder)

    @classmethod
    def load_folder(cls, directory: str | Path) -> "DrivingPolicy":
        """Load a checkpoint folder. Nothing is unpickled, and nothing is allocated for
        sizes the files disagree on: the config's sizes are bounded, and the network is
        first built on PyTorch's "meta" device (shapes, no memory) and checked against the
        tensor shapes in the weights file's header."""
        directory = readable_dir(directory)
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: not a checkpoint folder (expected {CONFIG} + {WEIGHTS})")
        raw = read_json(directory / CONFIG)
        try:
            config = PolicyConfig.from_dict(raw)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{directory / CONFIG}: {e}") from None
        if config.format_version != FORMAT_VERSION:
            raise CheckpointError(f"{directory / CONFIG}: format_version {config.format_version}, "
                                  f"this nac-drive reads {FORMAT_VERSION}")
        try:
            with torch.device("meta"):
                skeleton = cls(config)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{directory / CONFIG}: {e}") from None
        check_shapes({k: tuple(v.shape) for k, v in skeleton.state_dict().items()},
                     upgrade_state_names(tensor_shapes(directory / WEIGHTS)), directory / WEIGHTS)
        policy = cls(config)
        load_state_into(policy, read_policy_weights(directory / WEIGHTS), directory / WEIGHTS)
        return policy.eval()


def read_policy_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A policy's ``model.safetensors``, with parameters renamed since it was written
    given their current names (:data:`nac_drive.nac.RENAMED_PARAMETERS`)."""
    return upgrade_state_names(read_tensors(path))


class _FrameModel(nn.Module):
    """:meth:`DrivingPolicy.frame_model`'s image model: it runs on the policy's device and
    gives its outputs on the frames' own, so an attribution method that builds its inputs on
    the CPU reads them there (gradients flow through the move)."""

    def __init__(self, policy: DrivingPolicy, state, timestamp: float):
        super().__init__()
        self.policy, self.state, self.timestamp = policy, state, timestamp

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        B, device, given = frames.shape[0], module_device(self.policy), frames.device
        frames = frames.to(device)
        core = self.policy.core
        state = core.init_state(B) if self.state is None else _repeat_batch(self.state, B)
        t0 = 0.0 if self.policy._t0 is None else self.policy._t0
        t = torch.full((B,), self.timestamp - t0, dtype=torch.float32, device=device)
        y, _ = core.step(self.policy.encoder(frames), state, t=t)
        return self.policy.head(y).to(given)


def _repeat_batch(state, batch: int):
    """Repeat a batch-1 streaming state (a dataclass of tensors) ``batch`` times."""
    changes = {}
    for f in dataclasses.fields(state):
        value = getattr(state, f.name)
        if torch.is_tensor(value) and value.ndim >= 2 and value.shape[0] == 1:
            changes[f.name] = value.expand(batch, *value.shape[1:])
    return dataclasses.replace(state, **changes)


def _finite_seconds(timestamp) -> float:
    """An observation's timestamp as float seconds; a NaN, an infinity or a non-number is refused."""
    try:
        seconds = float(timestamp)
    except (TypeError, ValueError):
        raise ValueError(f"obs['timestamp']: expected seconds as a number, got {timestamp!r}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"obs['timestamp']: expected a finite number of seconds, got {seconds}")
    return seconds
