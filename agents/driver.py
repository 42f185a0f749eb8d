"""The closed-loop driver: a trained :class:`DrivingPolicy` as an episode-runner actor.

It streams frames through the policy (``NAC.step``: no recompute of the window),
times every decision, drops the frames a ``frame-drop`` schedule says never arrive (the policy
is not asked, its last action goes to the simulator again), and can hand each step to its sinks: a
:class:`~nac_drive.interpret.trace.RunRecorder` (``trace/``, for the dashboard) and a
live :class:`~nac_drive.interpret.live_view.RerunView`. A step is the frame, the policy's
action, a privileged oracle's action and cross-track error for the same state, the reward,
the NAC trace and, live, the saliency of the chosen action.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

def shipped_policy_path(task: str = "carracing") -> Path:
    """The policy that ships with the package: CNN+NAC for CarRacing, PilotNet+NAC for Udacity."""
    from importlib.resources import files

    return Path(str(files("nac_drive") / "assets" / f"policy_{task}_nac"))


def load_driving_policy(path: str | Path | None = None, task: str = "carracing", onnx: bool = False,
                        device: str = "cpu"):
    """A :class:`DrivingPolicy` from a checkpoint folder (default: the shipped one for
    ``task``; a training run folder: its ``best/``, :func:`checkpoint_folder`), in eval mode.
    With ``onnx``, a ``.onnx`` file of ``nac-drive export`` gives an
    :class:`~nac_drive.policy.onnx_policy.OnnxPolicy` (onnxruntime; it drives, it has no torch
    modules to look inside); without, such a file is refused in one line. ``device``: where the
    policy's network runs (:func:`~nac_drive.devices.resolve_device`; an ONNX file runs on
    onnxruntime's CPU provider whatever it says)."""
    import torch

    from nac_drive.devices import resolve_device
    from nac_drive.policy.driving_policy import DrivingPolicy
    from nac_drive.policy.onnx_policy import is_onnx_path

    device = resolve_device(device)   # before any file is read
    torch.set_num_threads(1)
    if path is not None and is_onnx_path(path):
        if not onnx:
            raise ValueError(f"policy: {path} is an ONNX export, which only drives (nac-drive drive); "
                             f"this needs the policy's checkpoint folder")
        from nac_drive.policy.onnx_policy import OnnxPolicy

        return OnnxPolicy(path)
    policy = DrivingPolicy.from_pretrained(shipped_policy_path(task) if path is None else checkpoint_folder(path))
    return policy.to(device)


def checkpoint_folder(path: str | Path) -> str | Path:
    """``path`` itself, or, for the run folder of ``nac-drive train`` (no ``config.json`` in
    it, one in its ``best/``), that ``best/`` checkpoint, said on stderr. A Hub id passes as it is."""
    import sys

    run = Path(path)
    if run.is_dir() and not (run / "config.json").exists() and (run / "best" / "config.json").is_file():
        print(f"policy: {run} is a training run folder; using its best/ checkpoint ({run / 'best'})", file=sys.stderr)
        return run / "best"
    return path


class PolicyDriver:
    """A policy as an actor (:mod:`nac_drive.policy.actor`) that can also time and record what it
    does: ``reset``, ``reset_env``, ``act``, and the CarRacing runner's ``on_step`` (which
    completes a step's record with its reward; a Udacity step, which has none, is recorded
    as soon as it is acted on).

    Args:
        policy: the trained policy.
        recorder: optional :class:`nac_drive.interpret.trace.RunRecorder`. CarRacing: pass
            :meth:`on_step` as the runner's ``on_step``, which adds the reward. The recorder
            writes a chunk of its trace every ``chunk_steps`` steps (in a background thread), so
            a run that is killed (the bridge runs until Ctrl-C) keeps all but its last steps (at
            most ``2 * chunk_steps``).
        oracle: optional privileged expert with ``reset_env(env)`` and
            ``action_for(env)`` (the teacher), recorded as the expert action, and, if it
            has ``cross_track_error(env)``, the step's cross-track error.
        live: optional :class:`~nac_drive.interpret.live_view.RerunView`; with its
            ``saliency`` set, each step's Grad-CAM overlay is computed before the policy acts
            (outside the timed latency).
        drops: optional :class:`~nac_drive.simulators.frame_drops.FrameDrops`, asked once per
            frame: a dropped frame is not shown to the policy (nor timed, nor recorded), and
            its last action is returned again. The schedule restarts at :meth:`reset` (the bridge:
            the same fixed stream at every connection) and again from the env's reset seed at
            :meth:`reset_env` (a gymnasium env reset with the track's seed, then ``reset``, then
            ``reset_env``). A frame that arrives goes to the policy with its real time: a Udacity
            observation's own ``timestamp``, or for a CarRacing frame, which carries none, its
            index in the episode times the policy's ``frame_dt``, the time the policy counts
            itself when no frame is dropped. ``dropped``: frames dropped per episode.
    """

    def __init__(self, policy, recorder=None, oracle=None, live=None, drops=None):
        self.policy, self.recorder, self.oracle = policy, recorder, oracle
        self.live, self.drops = live, drops
        self.sinks = [s for s in (recorder, live) if s is not None]
        self.name = f"policy:{policy.config.core.core}"
        self.traces = bool(self.sinks) and policy.config.core.core == "nac"   # the sinks want NAC traces
        self.policy.trace_enabled = self.traces
        self.latencies_ms: list[float] = []
        self.dropped: list[int] = []
        self._env = None
        self._pending: dict[str, Any] = {}
        self._saliency = None
        self._frame, self._action = 0, None

    @property
    def gas(self) -> float:
        """What GAS presses in the env the policy learned (see :func:`~nac_drive.simulators.carracing.actor_gas`)."""
        return self.policy.config.gas

    def reset(self) -> None:
        self.policy.trace_enabled = self.traces   # per episode: another driver may share the policy
        self.policy.reset()
        self._frame, self._action = 0, None
        if self.drops is not None:
            self.drops.restart(None)
            self.dropped.append(0)
        if self.oracle is not None:
            self.oracle.reset()
        for sink in self.sinks:
            sink.new_episode()

    def reset_env(self, env) -> None:
        self.policy.check_env(env)   # a clear error before a wrong-kind action reaches env.step
        self._env = env
        if self.drops is not None:
            self.drops.restart(env.unwrapped.np_random_seed)   # gymnasium's: the seed of the env's last seeded reset
        if self.oracle is not None:
            self.oracle.reset_env(env)

    def act(self, obs: np.ndarray):
        index, self._frame = self._frame, self._frame + 1
        seen = obs
        if self.drops is not None:
            if not self.drops.delivers():
                self.dropped[-1] += 1
                return self._action   # the simulator steps on with the last action
            if not isinstance(obs, dict):
                seen = {"image": obs, "timestamp": index * self.policy.config.frame_dt}
        frame = obs["image"] if isinstance(obs, dict) else obs
        saliency = None
        if self.live is not None and self.live.saliency:
            from nac_drive.interpret.policy_saliency import live_saliency

            timestamp = seen.get("timestamp") if isinstance(seen, dict) else None
            saliency = live_saliency(self.policy, frame, timestamp=timestamp)
        t0 = time.perf_counter()
        action = self._action = self.policy.select_action(seen)
        self.latencies_ms.append((time.perf_counter() - t0) * 1e3)
        if self.sinks:
            self._pending = {"frame": frame, "policy_action": action, "nac_trace": self.policy.last_trace,
                             **self._oracle_view(obs)}
            self._saliency = saliency
            if isinstance(obs, dict):   # the Udacity bridge: no reward to wait for
                self._flush(reward=None, timestamp=obs.get("timestamp"))
        return action

    def _oracle_view(self, obs) -> dict[str, Any]:
        """The expert's action and the cross-track error for the state the policy acts in:
        from the oracle (CarRacing's teacher reads the env), or the observation's ``cte``
        (what the Udacity emulator reports through the bridge)."""
        if self.oracle is None or self._env is None:
            cte = obs.get("cte") if isinstance(obs, dict) else None
            return {"expert_action": None, "cross_track_error": cte}
        cte = self.oracle.cross_track_error(self._env) if hasattr(self.oracle, "cross_track_error") else None
        return {"expert_action": self.oracle.action_for(self._env), "cross_track_error": cte}

    def on_step(self, episode: int, frame: int, obs, action, reward: float, info: dict) -> None:
        """Runner callback: completes the step's record with its reward."""
        self._flush(reward=reward, timestamp=frame * self.policy.config.frame_dt)

    def _flush(self, reward, timestamp) -> None:
        if not self.sinks or not self._pending:
            return
        step = dict(self._pending, reward=reward, timestamp=timestamp)
        self._pending = {}
        if self.live is not None:
            self.live.add(saliency=self._saliency, **step)
        if self.recorder is not None:
            self.recorder.add(**step)
