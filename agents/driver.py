"""The closed-loop driver: a trained :class:`DrivingPolicy` as an episode-runner actor.

It streams frames through the policy (``NAC.step``: no recompute of the window),
times every decision, drops the frames a ``frame-drop`` schedule says never arrive (the policy
is not asked, its last action goes to the simulator again), and can hand each step to its sinks: a
:class:`~nac_drive.interpret.trace.RunRecorder` (``trace/``, for the dashboard) and a
live :class:`~nac_drive.interpret.live_view.RerunView`. A step is the frame, the policy's
action, a privileged oracle's action, cross-track error and road scene for the same state, the reward,
the NAC trace and, live, the saliency of the chosen action.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


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
        self.trace_failure: str | None = None   # why the trace stopped being written (a full disk)
        self._saliency = None
        self._frame, self._action = 0, None

    @property
    def gas(self) -> float:
        """What GAS presses in the env the policy learned (see :func:`~nac_drive.simulators.carracing.actor_gas`)."""
        return self.policy.config.gas

    @property
    def records(self) -> bool:
        """Whether the steps it acts on are recorded (a trace, the live view): only then does it
        read an observation's ``cte`` and ``scene``."""
        return bool(self.sinks)

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
        """The expert's action, the cross-track error and the road's scene for the state the
        policy acts in: from the oracle (CarRacing's teacher reads the env's track, and with it
        :func:`~nac_drive.simulators.carracing_scene.scene_variables`), or the observation's
        ``cte`` and ``scene`` (what the Udacity emulator reports: its ``cte`` through the bridge
        too, its scene in-process only, :func:`~nac_drive.pipeline.drive.udacity_emulator_episodes`;
        the Unity simulator sends neither)."""
        if self.oracle is None or self._env is None:
            known = obs if isinstance(obs, dict) else {}
            return {"expert_action": None, "cross_track_error": known.get("cte"), "scene": known.get("scene")}
        scene = None
        if hasattr(self.oracle, "locate"):   # it reads CarRacing's track
            from nac_drive.simulators.carracing_scene import scene_variables

            scene = scene_variables(self._env, self.oracle)
            cte = scene["cross_track_error"]
        else:
            cte = self.oracle.cross_track_error(self._env) if hasattr(self.oracle, "cross_track_error") else None
        return {"expert_action": self.oracle.action_for(self._env), "cross_track_error": cte, "scene": scene}

    def on_step(self, episode: int, frame: int, obs, action, reward: float, info: dict) -> None:
        """Runner callback: completes the step's record with its reward."""
        self._flush(reward=reward, timestamp=frame * self.policy.config.frame_dt)

    def _flush(self, reward, timestamp) -> None:
        if not self.sinks or not self._pending:
            return
        step = dict(self._pending, reward=reward, timestamp=timestamp)
        self._pending = {}
        if self.live is not None:   # (the live view shows no scene)
            self.live.add(saliency=self._saliency, **{k: v for k, v in step.items() if k != "scene"})
        if self.recorder is not None:
            try:
                self.recorder.add(**step)
            except OSError as e:   # a trace that cannot be written ends; the drive goes on (the caller reports it)
                self.sinks = [s for s in self.sinks if s is not self.recorder]
                self.trace_failure, self.recorder = str(e), None
