"""Driving: a trained policy closed-loop, scored on CarRacing tracks or on held-out tracks of
the headless Udacity emulator (in-process, no sockets), or serving the Udacity simulator
through the bridge, optionally recording its NAC traces for the dashboard.

The policy streams through ``NAC.step()`` (:class:`~nac_drive.agents.driver.PolicyDriver`);
the latency it reports is the policy's own time per frame. Under ``frame-drop`` (every drive
here) the driver drops the frames its schedule says never arrive
(:mod:`~nac_drive.simulators.frame_drops`) and the summary counts them (``frames_dropped``, per
track).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import numpy as np

from nac_drive.devices import device_arg
from nac_drive.fields import MAX_EPISODES, MAX_SEED, arg, check_fields
from nac_drive.simulators.carracing import ACTION_NAMES, EVAL_SEED_BASE
from nac_drive.simulators.perturbations import (PERTURBATIONS, check_perturb_flag, frame_drops, perturb_arg,
                                                perturbation_record)
from nac_drive.torch_threads import torch_threads

UDACITY_FRAMES = 1000   # frames per emulator track: ~67 s at its 15 Hz, ~270 m at 9 mph (under a lap)
UDACITY_SPEED = 9.0     # mph: the set speed of `nac-drive drive udacity`
CARRACING_PERTURBATIONS = tuple(PERTURBATIONS)   # the env's, and frame-drop
UDACITY_PERTURBATIONS = ("frame-drop",)           # the others are CarRacing's pixels


@dataclass
class DriveArgs:
    """Arguments of ``nac-drive drive carracing``."""

    policy: str | None = arg(None, "checkpoint folder, a .onnx of nac-drive export, or shipped:mha (the CNN+MHA "
                                   "policy shipped beside the NAC one; default: the shipped CNN+NAC policy)")
    episodes: int = arg(20, "number of tracks", min=1, max=MAX_EPISODES)
    seed_base: int = arg(EVAL_SEED_BASE, "seed of the first track", min=0, max=MAX_SEED)
    max_steps: int | None = arg(None, "cap each episode (env frames; default 1000)", min=1)
    render: str | None = arg(None, "show a window while driving", choices=("human",))
    video: str | None = arg(None, "write the episodes to a WebM (VP8) video, which browsers and the dashboard play",
                            metavar="WEBM")
    trace: str | None = arg(None, "record frames, actions, teacher actions and NAC traces to RUN_DIR/trace/ "
                                  "(RUN_DIR-2, -3, ... if RUN_DIR exists)", metavar="RUN_DIR")
    perturb: str | None = perturb_arg(CARRACING_PERTURBATIONS)
    device: str = device_arg()

    def __post_init__(self):
        check_fields(self)
        check_perturb_flag(self.perturb, CARRACING_PERTURBATIONS)
        if self.video is not None and self.trace is not None and frame_drops(self.perturb) is not None:
            raise ValueError("--video: under frame-drop the video shows every frame and the trace only those the "
                             "policy saw, which the dashboard cannot pair; give --trace or --video")

    def ignored(self) -> dict[str, str]:
        """The fields this drive would not use, each with why (:func:`onnx_ignores_device`)."""
        return onnx_ignores_device(self.policy)


def onnx_ignores_device(policy: str | None) -> dict[str, str]:
    """``{"device": why}`` for an ONNX policy, which onnxruntime runs on the CPU; else nothing."""
    from nac_drive.policy.onnx_policy import is_onnx_path

    if policy is not None and is_onnx_path(policy):
        return {"device": "an ONNX policy runs on onnxruntime's CPU provider"}
    return {}


def drive_carracing(args: DriveArgs, live: LiveOptions | None = None, progress: bool = True,
                    recorded: int | None = None) -> dict:
    """Drive and score a policy on CarRacing; returns the summary dict (``trace``: the run
    folder the trace went to, ``args.trace`` or, if that exists, ``args.trace-2``, ...).

    ``recorded``: only the first this many episodes go into the video, the trace and the
    ``live`` view (all are scored, and the latency covers all, traced or not); default all."""
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.io.video import check_video_path

    policy_path, trace_dir = args.policy, args.trace
    if recorded is not None and recorded < 1:
        raise ValueError(f"recorded: must be >= 1, got {recorded}")
    if args.video is not None:
        check_video_path(args.video)   # before driving
    live = live.checked() if live is not None else None
    policy = task_policy(policy_path, "carracing", args.device)
    recorder, oracle = None, None
    continuous = policy.config.action == "continuous"
    if trace_dir is not None or live is not None:
        from nac_drive.agents.teacher import PurePursuitTeacher

        oracle = PurePursuitTeacher(continuous=continuous)
    if trace_dir is not None:
        names = list(ACTION_NAMES) if not continuous else ["steer", "gas", "brake"]
        recorder = policy_recorder(trace_dir, policy, policy_path, "CarRacing-v3", names, args.perturb)
    with live_view(live, policy, raise_failure=False) as view:
        driver = PolicyDriver(policy, recorder=recorder, oracle=oracle, live=view, drops=frame_drops(args.perturb))
        summary = _drive_and_score(policy, driver, args, progress, recorded)
    if recorder is not None and driver.trace_failure is None:
        recorder.metadata["laps"] = summary["laps"][:len(summary["laps"]) if recorded is None else recorded]
        try:
            recorder.save()   # the laps of the traced episodes: the dashboard's episode table shows them
        except OSError as e:
            driver.trace_failure = str(e)
    summary.update(policy=str(policy_path or "shipped"), core=policy.config.core.core,
                   perturbation=perturbation_record(args.perturb))
    if recorder is not None:
        summary["trace"] = str(recorder.run_dir)
        if driver.trace_failure is not None:   # the caller reports it after the summary
            summary["trace_failure"] = driver.trace_failure
    if view is not None:
        summary["rerun"] = view.where
        if view.failure is not None:   # the caller reports it after the summary
            summary["rerun_failure"] = view.failure
    return summary


def _drive_and_score(policy, driver, args: DriveArgs, progress: bool, recorded: int | None) -> dict:
    """Drive the recorded episodes with ``driver``, the rest with a plain driver; the summary."""
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.simulators.carracing import eval_seeds, run_episodes

    seeds = eval_seeds(args.episodes, base=args.seed_base)
    first = len(seeds) if recorded is None else recorded
    shown, scored_only = seeds[:first], seeds[first:]
    drive = partial(run_episodes, continuous=policy.config.action == "continuous", max_steps=args.max_steps,
                    render_mode=args.render, perturb=None if driver.drops is not None else args.perturb)
    results = drive(driver, shown, on_step=driver.on_step, video_path=args.video,
                    progress=progress and ("recorded episodes" if scored_only else "episodes"))
    if scored_only:
        plain = PolicyDriver(policy, drops=driver.drops)   # records nothing
        results.extend(drive(plain, scored_only, progress=progress and "other episodes"))
        driver.latencies_ms += plain.latencies_ms
        driver.dropped += plain.dropped
    results.latencies_ms = driver.latencies_ms   # the policy's own time, without the oracle's
    summary = dict(results.summary(), text=results.format())
    if driver.drops is not None:
        summary["frames_dropped"] = driver.dropped
        summary["text"] += f", {dropped_text(driver.dropped, results.lengths)}"
    return summary


def dropped_text(dropped: list[int], lengths: list[int]) -> str:
    """``"1234 of 5000 frames dropped (24.7%)"``: a frame-drop drive's count, for its summary line."""
    return f"{sum(dropped)} of {sum(lengths)} frames dropped ({100 * sum(dropped) / max(sum(lengths), 1):.1f}%)"


def drive_checkpoint(policy_path, task: str, episodes: int, max_steps: int | None = None,
                     progress: bool = True, perturb: str | None = None, seed_base: int = EVAL_SEED_BASE) -> dict:
    """A checkpoint of ``task`` drives the first ``episodes`` tracks from ``seed_base`` (by
    default the held-out ones: CarRacing 900000, ...; the Udacity emulator's ``random-900000``,
    ...), each capped at ``max_steps`` frames (default: a whole CarRacing episode,
    :data:`UDACITY_FRAMES`), under ``perturb`` (``NAME[=LEVEL]``; Udacity: ``frame-drop``
    only); the summary of :func:`drive_carracing` or :func:`drive_udacity_emulator`."""
    if task == "udacity":
        return drive_udacity_emulator(policy_path, udacity_eval_tracks(episodes, seed_base),
                                      frames=max_steps or UDACITY_FRAMES, progress=progress, perturb=perturb)
    return drive_carracing(DriveArgs(policy=str(policy_path), episodes=episodes, max_steps=max_steps, perturb=perturb,
                                     seed_base=seed_base), progress=progress)


def udacity_eval_tracks(n: int, base: int = EVAL_SEED_BASE) -> list[str]:
    """The first ``n`` held-out emulator tracks, ``random-<seed>`` for seeds from ``base``.

    The shipped Udacity policy learned from the named tracks gentle, lakeside and canyon and
    from random-11 to random-14 (BENCHMARKS.md §4); the random tracks from 900000, the
    held-out seeds of CarRacing too, are held out (as is serpentine)."""
    from nac_drive.simulators.carracing import eval_seeds

    return [f"random-{seed}" for seed in eval_seeds(n, base)]


def udacity_emulator_env(track: str, speed: float = UDACITY_SPEED):
    """``nac_drive/UdacityEmulator-v0`` on ``track``, its throttle from the bridge's speed
    controller at ``speed`` mph (:class:`~nac_drive.simulators.udacity_env.SpeedControl`)."""
    import gymnasium

    from nac_drive.simulators.udacity_env import ENV_ID, SpeedControl

    return SpeedControl(gymnasium.make(ENV_ID, track=track), speed_mph=speed)


@torch_threads(1)   # a forward on one frame is fastest on one thread
def udacity_emulator_episodes(driver, envs: list, frames: int = UDACITY_FRAMES, progress: bool = False) -> list[dict]:
    """``driver`` (a :class:`~nac_drive.agents.driver.PolicyDriver`) drives each env of
    :func:`udacity_emulator_env` from the start of its track for ``frames`` frames, or until
    the car leaves the road (the env terminates). It is fed what the bridge feeds it: ``{"image",
    "timestamp" (simulated seconds), "speed" (mph), "cte" (m)}``, and if it ``records`` its steps
    (a :class:`~nac_drive.agents.driver.PolicyDriver` with a trace),
    ``"scene"``, the road's scene read from the emulator's track
    (:func:`~nac_drive.simulators.udacity_scene.scene_variables`; through the bridge there is none).
    Each env is reset with its
    track's seed (the start is fixed; the seed is what a driver's frame-drop schedule is drawn
    from), then the driver (``reset``, ``reset_env``).

    Returns per env ``track``, ``frames`` (driven), ``laps``, ``distance_m``,
    ``mean_abs_cte_m`` / ``max_abs_cte_m`` (the cross-track error of the states the car
    reached), ``off_road`` (it left the road) and ``return`` (the env's reward: metres of
    progress, less off-centre). It runs on one torch thread, the count of before restored after."""
    from tqdm import tqdm

    from nac_drive.simulators.udacity_scene import scene_variables

    if frames < 1:
        raise ValueError(f"frames: must be >= 1, got {frames}")
    results = []
    for env in envs:
        spec = env.unwrapped.track.spec
        obs, info = env.reset(seed=spec.seed)
        driver.reset()
        driver.reset_env(env)
        track = spec.name
        dt, ctes, total, off_road = env.unwrapped.dt, [], 0.0, False
        for i in tqdm(range(frames), desc=track, unit="frame", disable=not progress, leave=False):
            seen = {"image": obs, "timestamp": i * dt, "speed": info["speed_mph"], "cte": info["cte_m"]}
            if getattr(driver, "records", False):   # 38 us a frame, for the trace alone
                seen["scene"] = scene_variables(env)
            steering = driver.act(seen)
            obs, reward, off_road, truncated, info = env.step([steering])
            ctes.append(abs(info["cte_m"]))
            total += float(reward)
            if off_road or truncated:
                break
        results.append({"track": track, "frames": len(ctes), "laps": int(info["laps"]),
                        "distance_m": float(info["distance_m"]), "mean_abs_cte_m": float(np.mean(ctes)),
                        "max_abs_cte_m": float(np.max(ctes)), "off_road": bool(off_road), "return": total})
    return results


def udacity_summary(results: list[dict]) -> dict:
    """The results of :func:`udacity_emulator_episodes` as lists, one value per track:
    ``lengths`` (frames driven), ``laps``, ``distance_m``, ``mean_abs_cte_m``,
    ``max_abs_cte_m``, ``off_road``, ``returns``; and ``mean_abs_cte`` (m, over every frame
    driven), ``off_road_tracks``, ``mean_return``, ``laps_finished``."""
    per = {key: [r[name] for r in results] for key, name in (
        ("lengths", "frames"), ("laps", "laps"), ("distance_m", "distance_m"), ("mean_abs_cte_m", "mean_abs_cte_m"),
        ("max_abs_cte_m", "max_abs_cte_m"), ("off_road", "off_road"), ("returns", "return"))}
    return {**per, "mean_abs_cte": float(np.average(per["mean_abs_cte_m"], weights=per["lengths"])),
            "off_road_tracks": int(sum(per["off_road"])), "mean_return": float(np.mean(per["returns"])),
            "laps_finished": int(sum(per["laps"]))}


def drive_udacity_emulator(policy_path=None, tracks: list[str] | None = None, frames: int = UDACITY_FRAMES,
                           trace_dir=None, speed: float = UDACITY_SPEED, progress: bool = True,
                           perturb: str | None = None, device: str = "cpu") -> dict:
    """A Udacity policy (default: the shipped one) drives ``tracks`` (default: the first 3
    held-out ones, :func:`udacity_eval_tracks`) of the headless emulator in-process, through
    :class:`~nac_drive.agents.driver.PolicyDriver` as the bridge feeds it, the throttle from
    the bridge's speed controller at ``speed`` mph (:func:`udacity_emulator_episodes`);
    ``perturb``: ``frame-drop[=P]`` or None; ``device``: where the policy's network runs.

    ``trace_dir``: record the run for the dashboard (``trace_dir`` or, if that exists,
    ``trace_dir-2``, ...). Returns the summary: ``tracks``, ``seeds`` (each track's), the
    figures of :func:`udacity_summary` (per track: frames driven, laps, mean |cte|,
    off-road, ...), the policy's latency, ``trace`` (the run folder) and under frame-drop
    ``perturbation`` and ``frames_dropped`` (per track)."""
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.simulators.udacity_env import ENV_ID
    from nac_drive.simulators.udacity_track import track_spec

    check_perturb_flag(perturb, UDACITY_PERTURBATIONS)
    tracks = udacity_eval_tracks(3) if tracks is None else list(tracks)
    if not tracks or frames < 1:
        raise ValueError(f"tracks and frames: expected at least one track and frames >= 1, got {tracks} and {frames}")
    seeds = [track_spec(t).seed for t in tracks]   # a bad name fails here, before any folder exists
    policy = task_policy(policy_path, "udacity", device)
    recorder = None
    if trace_dir is not None:
        recorder = policy_recorder(trace_dir, policy, policy_path, ENV_ID, ["steering"], perturb)
        recorder.metadata.update(tracks=tracks, speed_mph=speed)
    driver = PolicyDriver(policy, recorder=recorder, drops=frame_drops(perturb))
    envs = [udacity_emulator_env(t, speed) for t in tracks]
    try:
        results = udacity_emulator_episodes(driver, envs, frames, progress)
    finally:
        for env in envs:
            env.close()
    if recorder is not None:
        recorder.metadata["laps"] = [r["laps"] >= 1 for r in results]   # the dashboard's lap column
        recorder.save()
    lat = np.asarray(driver.latencies_ms)
    summary = {"tracks": tracks, "seeds": seeds, **udacity_summary(results), "speed_mph": speed,
               "latency_ms_p50": float(np.percentile(lat, 50)), "latency_ms_p95": float(np.percentile(lat, 95)),
               "policy": str(policy_path or "shipped"), "core": policy.config.core.core}
    summary["text"] = (f"{len(tracks)} tracks, {sum(summary['lengths'])} frames: mean |cte| "
                       f"{summary['mean_abs_cte']:.3f} m, off the road on {sum(summary['off_road'])}, laps "
                       f"{summary['laps_finished']}, actor latency p50 {summary['latency_ms_p50']:.3f} ms")
    if driver.drops is not None:
        summary.update(perturbation=perturbation_record(perturb), frames_dropped=driver.dropped)
        summary["text"] += f", {dropped_text(driver.dropped, summary['lengths'])}"
    if recorder is not None:
        summary["trace"] = str(recorder.run_dir)
    return summary


LIVE = "live view (Rerun; the 'live' extra)"


@dataclass(frozen=True)
class LiveOptions:
    """Where a drive is shown live in Rerun (:mod:`nac_drive.interpret.live_view`): the flags of the live view."""

    rerun: str | None = arg(None, "show the drive live in a Rerun viewer; with a file name ending in .rrd, save the "
                                  "recording there instead (headless)", const="viewer", metavar="FILE.rrd",
                            group=LIVE)
    rerun_serve: int | None = arg(None, "serve the recording over gRPC on 127.0.0.1 (default port 9876) while the "
                                        "drive lasts: rerun --connect rerun+http://127.0.0.1:PORT/proxy watches it "
                                        "(Rerun's web viewer is not offered: it sends usage analytics from the "
                                        "browser)", const=9876, metavar="PORT", min=1, max=65535, group=LIVE)
    live_saliency: bool = arg(True, "the per-frame Grad-CAM overlay of the live view (it costs a backward pass a "
                                    "frame)", group=LIVE)

    def __post_init__(self):
        check_fields(self)

    @property
    def file(self) -> str | None:
        """the .rrd file the recording is saved to"""
        return None if self.rerun in (None, "viewer") else self.rerun

    @property
    def viewer(self) -> bool:
        """whether a native Rerun viewer is started"""
        return self.rerun == "viewer"

    def ignored(self) -> dict[str, str]:
        """Without a view, its options."""
        if self.rerun is None and self.rerun_serve is None:
            return {"live_saliency": "only with --rerun or --rerun-serve (without them there is no live view)"}
        return {}

    def checked(self) -> "LiveOptions | None":
        """Itself, its file checked and rerun-sdk present (before any work), or None if it names no sink."""
        if self.rerun is None and self.rerun_serve is None:
            return None
        if self.viewer and self.rerun_serve is not None:
            raise ValueError("--rerun-serve: a viewer started for the drive already serves it; give one of the two")
        from nac_drive.interpret.live_view import check_rrd_path, require_rerun

        require_rerun()
        if self.file is not None:
            check_rrd_path(self.file, overwrite=False)   # as --trace, a drive never overwrites another's recording
        return self


@contextmanager
def live_view(live: LiveOptions | None, policy, raise_failure: bool = True):
    """The :class:`~nac_drive.interpret.live_view.RerunView` of ``live`` (None: none), closed on exit.
    A recording that failed on the way (its ``failure``: a full disk) raises a one-line ``OSError``
    once closed, unless ``raise_failure`` is False (the caller reports it)."""
    if live is None:
        yield None
        return
    from nac_drive.interpret.live_view import open_view

    nac = policy_nac(policy)
    view = open_view(live.file, viewer=live.viewer, serve_port=live.rerun_serve, saliency=live.live_saliency,
                     num_heads=nac.num_heads if nac is not None else 0, name=f"{policy.config.task}-drive")
    print(f"live view: {view.where}", file=sys.stderr)
    try:
        yield view
    finally:
        view.close()
    if raise_failure and view.failure is not None:
        raise OSError(f"--rerun: {view.failure}")


def task_policy(policy_path, task: str, device: str = "cpu"):
    """The policy of ``policy_path`` (default: the shipped one of ``task``) on ``device``,
    refused in one line if it drives another task."""
    from nac_drive.policy.loading import load_driving_policy

    policy = load_driving_policy(policy_path, task=task, onnx=True, device=device)
    if policy.config.task != task:
        raise ValueError(f"policy: {policy_path} is a {policy.config.task!r} policy, not a {task!r} one")
    return policy


def policy_nac(policy):
    """The policy's NAC layer, or None for another core; an ONNX policy, which has no layers to
    trace or show, is refused in one line."""
    if not hasattr(policy, "core"):
        raise ValueError("policy: an ONNX policy records and shows no neuron traces; --trace and --rerun need "
                         "its checkpoint folder")
    return policy.core.nac if policy.config.core.core == "nac" else None


def policy_recorder(trace_dir, policy, policy_path, env: str, action_names: list[str], perturb: str | None = None):
    """A RunRecorder for a policy's closed-loop run (its NAC's wiring included) into a new run
    folder, ``trace_dir`` or, if that exists, ``trace_dir-2``, ... (a run never overwrites
    another run's trace), created only once the policy can be traced. Its metadata names the
    run's ``perturbation`` (``--perturb``; None for a plain drive)."""
    from dataclasses import asdict

    from nac_drive.interpret.trace import RunRecorder
    from nac_drive.io.atomic import fresh_dir

    nac = policy_nac(policy)   # an ONNX policy is refused before any folder exists
    return RunRecorder(fresh_dir(trace_dir), metadata={"env": env, "policy": str(policy_path or "shipped"),
                                                       "policy_config": asdict(policy.config),
                                                       "perturbation": perturbation_record(perturb)},
                       nac=nac, action_names=action_names, expert_action_names=action_names)


@dataclass
class DriveUdacityArgs:
    """Arguments of ``nac-drive drive udacity``."""

    policy: str | None = arg(None, "checkpoint folder of a Udacity policy, or shipped:gru (the PilotNet+GRU policy "
                                   "shipped beside the NAC one; default: the shipped PilotNet+NAC policy)")
    host: str = arg("127.0.0.1", "address to bind (the simulator connects to it)")
    port: int = arg(4567, "port the simulator connects to", min=1, max=65535)
    speed: float = arg(UDACITY_SPEED, "set speed for the PI throttle controller (mph)", above=0, max=30)   # top speed
    record: str | None = arg(None, "also record driving_log.csv + IMG/ to DIR", metavar="DIR")
    trace: str | None = arg(None, "record frames, steering and NAC traces to RUN_DIR/trace/ (for the dashboard; "
                                  "RUN_DIR-2, -3, ... if RUN_DIR exists)", metavar="RUN_DIR")
    perturb: str | None = perturb_arg(UDACITY_PERTURBATIONS)
    device: str = device_arg()

    def __post_init__(self):
        check_fields(self)
        check_perturb_flag(self.perturb, UDACITY_PERTURBATIONS)

    def ignored(self) -> dict[str, str]:
        """The fields this drive would not use, each with why (:func:`onnx_ignores_device`)."""
        return onnx_ignores_device(self.policy)


def drive_udacity_policy(args: DriveUdacityArgs, live: LiveOptions | None = None, json_out: bool = False) -> int:
    """Serve the Udacity simulator with a Udacity policy (default: the shipped one) until
    Ctrl-C, then print its summary (``json_out``: as one line of JSON); ``args.trace``: also record the run for the dashboard; ``live``: show it in
    Rerun; under frame-drop a dropped telemetry frame is not shown to the policy and its last
    steering is sent again (the summary adds ``perturbation`` and ``frames_dropped``, per
    connection). Returns an exit code."""
    from nac_drive.agents.driver import PolicyDriver
    from nac_drive.simulators.udacity_session import drive_udacity, require_udacity_extra

    require_udacity_extra()   # before the trace folder exists
    live = live.checked() if live is not None else None
    policy = task_policy(args.policy, "udacity", args.device)
    recorder = None
    if args.trace:
        recorder = policy_recorder(args.trace, policy, args.policy, "udacity", ["steering"], args.perturb)
        print(f"trace folder: {recorder.run_dir}", file=sys.stderr)
    try:
        with live_view(live, policy) as view:
            driver = PolicyDriver(policy, recorder=recorder, live=view, drops=frame_drops(args.perturb))
            report = None if driver.drops is None else lambda: {"perturbation": perturbation_record(args.perturb),
                                                                "frames_dropped": driver.dropped}
            return drive_udacity(driver, host=args.host, port=args.port, speed=args.speed, record_dir=args.record,
                                 json_out=json_out, report=report)
    finally:
        if recorder is not None and len(recorder):
            recorder.save()
            print(f"trace: {recorder.path}", file=sys.stderr)
