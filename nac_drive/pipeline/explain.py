"""Explaining a driving policy: it drives held-out tracks with a trace, then the analyses
of :mod:`nac_drive.interpret` measure what its neurons did.

Any core (NAC, lstm, gru, cfc, ltc, mha) is explained alike where a section does not need the
NAC's states (saliency, window, mirror, probes, dictionary, push, the drive);
:data:`NAC_STATES_NEEDED` says which do, and :func:`skipped_sections` decides, in this one place,
what a policy's report leaves out and why.

Two kinds of policy (:data:`EXPLAINABLE`): CarRacing's discrete one drives held-out CarRacing
tracks (:func:`~nac_drive.pipeline.drive.drive_carracing`), Udacity's steering regression
held-out tracks of the headless emulator (:func:`~nac_drive.pipeline.drive.drive_udacity_emulator`).
The sections are the same; where a regression policy differs, the interpret modules say how
(its decisions compared by steering side, its heads' push on the steering output), and the
closed loop scores the mean |cross-track error| instead of the return.

:func:`explain` writes ``RUN_DIR/explain.json``, one key per analysis section, each made by
one function here that returns a JSON-able dict: ``fig4`` (:func:`fig4_section`, the paper's
Fig. 4 claim), ``scenes`` (:func:`scenes_section`, the same claim on classes read from the road's
curvature, in the task's units), ``atlas`` (:func:`atlas_section`, the neuron atlas), ``saliency``
(:func:`saliency_section`, how faithful the saliency maps are), ``window``
(:func:`window_section`, which past frame each decision used; also
``RUN_DIR/window_attribution.npz``, which the dashboard shows), ``mirror``
(:func:`mirror_section`, whether the policy steers the other way on mirrored frames, and which
units swap), ``probes`` (:func:`probes_section`, which scene variables each representation holds
linearly on held-out episodes, and the steering pushed along the curvature probe),
``dictionary`` (:func:`dictionary_section`, a sparse dictionary of the core's output), ``closed_loop``
(:func:`closed_loop_section`, chosen neurons silenced while the policy drives) and ``push``
(:func:`push_section`, the core's output pushed along the curvature probe while the policy
drives), besides
``task``, ``core``, ``run``, ``policy``, ``trace_sha256``, ``drive`` (the traced drive's figures)
and ``skipped`` (section -> why it is null: the NAC-only sections of another core, a section
turned off by its argument, ``scenes`` of a trace without the road's scene, a section that found
nothing to measure; empty when every section ran). NaN is written as null. The closed loop's and
the push's drives are one function, :func:`intervened_drive`, under either kind of intervention
(:func:`intervened`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cache, partial
from pathlib import Path

import numpy as np

from nac_drive.agents.driver import PolicyDriver
from nac_drive.devices import device_arg
from nac_drive.fields import MAX_EPISODES, MAX_SEED, arg, check_fields
from nac_drive.interpret.explain_report import EXPLAIN_FILE
from nac_drive.io.strict_json import jsonable, write_report   # noqa: F401 (explain.json's writer, also compare's)
from nac_drive.pipeline.drive import UDACITY_FRAMES, UDACITY_SPEED
from nac_drive.pipeline.ray_tasks import ray_arg, ray_jobs
from nac_drive.simulators.carracing import EVAL_SEED_BASE

# (task, action) of the policies explain can explain, whatever their core
EXPLAINABLE = (("carracing", "discrete"), ("udacity", "continuous"))
# explain.json's analysis sections, in the order they are computed -> what of the NAC's states
# each needs (None: it reads frames and outputs only, so every core is explained alike)
NAC_STATES_NEEDED = {
    "fig4": "the tau and logits of the NAC's heads (the paper's Fig. 4)",
    "scenes": "the tau and logits of the NAC's heads (the paper's Fig. 4 on the road's scenes)",
    "atlas": "the NAC's q/k/v units, backbone neurons and heads, each silenced",
    "saliency": None,
    "window": None,
    "mirror": None,
    "probes": None,
    "dictionary": None,
    "closed_loop": "the atlas's NAC neurons clamped and parts of the NAC's attention replaced while driving",
    "push": None,
}
# the traced drive's figures explain.json keeps, per task
DRIVE_KEYS = {"carracing": ("seeds", "returns", "lengths", "mean_return", "laps_finished"),
              "udacity": ("tracks", "seeds", "lengths", "laps", "distance_m", "mean_abs_cte_m", "max_abs_cte_m",
                          "off_road", "mean_abs_cte", "off_road_tracks", "returns", "mean_return", "laps_finished",
                          "speed_mph")}


MEASURES = "measurements"
INTACT = "intact"   # the name of the drive without an intervention, beside the clamps' and the pushes'
PUSH_RANDOM = 4   # random directions the push drives beside the probe's (each a drive of every track)
# task -> (the closed loop's and the push's metric, its change's key, the per-track figure it is paired on)
METRIC_BY_TASK = {"carracing": ("return", "return_change", "returns"),
                  "udacity": ("mean_abs_cte", "cte_change", "mean_abs_cte_m")}
PARTIAL_FILE = "explain.partial.json"   # the sections finished so far; removed once explain.json is written


@dataclass
class DriveLog:
    """The drives of a section finished so far (name -> figures; ``done`` may hold a killed
    explain's, from its partial file) and ``save``, called after each new one: ``--resume`` then
    drives only the rest of a closed loop or a push (~20 drives of 30 tracks, half an hour)."""

    done: dict[str, dict] = field(default_factory=dict)
    save: Callable[[], None] = lambda: None

    def add(self, name: str, figures: dict) -> None:
        self.done[name] = figures
        self.save()


NO_SCENE = ("the trace records no road scene (curvature ahead): a CarRacing drive and a Udacity emulator drive "
            "in-process record it, the Unity simulator sends none")


@dataclass
class ExplainArgs:
    """Arguments of ``nac-drive explain``."""

    policy: str | None = arg(None, "checkpoint folder, its task read from its config.json (default: the shipped "
                                   "policy of --task)")
    task: str | None = arg(None, "explain the shipped policy of this task (default carracing); with --policy it "
                                 "must agree", choices=tuple(DRIVE_KEYS))
    episodes: int = arg(3, "held-out tracks driven with a trace (Udacity: every second one the loop before it, "
                           "mirrored and driven clockwise)", min=1, max=MAX_EPISODES)
    out: str = arg("runs/explain", "run folder for the trace and explain.json (RUN_DIR-2, -3, ... if RUN_DIR "
                                   "exists)", metavar="RUN_DIR")
    seed_base: int = arg(EVAL_SEED_BASE, "seed of the first track (Udacity: the emulator tracks random-<seed>, "
                                         "random-<seed>-cw, random-<seed+1>, ...: each loop counter-clockwise, then "
                                         "mirrored and driven clockwise, for right curves)", min=0, max=MAX_SEED)
    max_steps: int | None = arg(None, "cap each episode (env frames; default 1000; Udacity: frames per track, 15 a "
                                      "second)", min=1)
    speed: float | None = arg(None, "Udacity only: the set speed in mph of the bridge's speed controller "
                                    "(default 9)", above=0)
    device: str = device_arg()
    ray: str | None = ray_arg()   # the closed loop's drives as Ray tasks
    frames: int | None = arg(None, "replay at most this many recorded frames when silencing neurons, mirroring "
                                   "frames and probing representations (default all)",
                             min=1, group=MEASURES)
    closed_loop_tracks: int = arg(10, "held-out tracks the intact policy, each chosen neuron clamped, each part "
                                      "of the attention replaced and each push along the curvature probe (and "
                                      f"{PUSH_RANDOM} random directions) drive (0: no closed-loop check, no push); "
                                      "the verb's longest part: a CarRacing track ~2.5 s on one CPU core", min=0,
                                  max=MAX_EPISODES, group=MEASURES)
    closed_loop_top: int = arg(10, "neurons whose silencing costs most agreement, driven clamped", min=0,
                               group=MEASURES)
    closed_loop_random: int = arg(10, "other neurons drawn at random (seeded by --seed), driven clamped", min=0,
                                  group=MEASURES)
    saliency_frames: int = arg(500, "frames (spread over the run) on which saliency faithfulness is measured (0: "
                                    "skip it)", min=0, group=MEASURES)
    window_method: str = arg("integrated_gradients", "how each window frame's share of a decision is computed "
                                                     "('none': skip it)",
                             choices=("integrated_gradients", "ablation", "none"), group=MEASURES)
    window_every: int = arg(1, "attribute the window of every Nth traced step (1: every one; Integrated Gradients "
                               "costs ~2-4 s a step on a CPU core)", min=1, group=MEASURES)
    seed: int = arg(0, "seed of the random neurons, the random maps and the random keys", min=0, group=MEASURES,
                    max=MAX_SEED)
    resume: str | None = arg(None, "go on with the explain killed in this run folder: its drive, the sections "
                                   "it finished and the closed-loop drives of the one under way are kept (give "
                                   "the flags it was run with)", metavar="RUN_DIR")

    def __post_init__(self):
        check_fields(self)

    def ignored(self) -> dict[str, str]:
        """The fields this run would not use, each with why."""
        idle = {"out": "--resume goes on in the run folder it names"} if self.resume else {}
        if self.closed_loop_tracks:
            return idle
        return {**idle, **{name: "only with a closed-loop check (--closed-loop-tracks 0 skips it)"
                           for name in ("closed_loop_top", "closed_loop_random", "ray")}}


class SectionSkipped(Exception):
    """A section found, once it ran, nothing to measure: explain.json holds it null and its
    message in ``skipped``."""


def explain(args: ExplainArgs, progress: bool = True) -> dict:
    """Drive ``args.policy`` (default: the shipped policy of ``args.task``, "carracing" unless
    given; with a path, its ``config.json`` says the task and ``task``, if given, must agree)
    on ``episodes`` held-out tracks from ``seed_base`` with a trace into a fresh run folder
    (``out``, or ``out-2``, ...), measure it and write ``RUN_DIR/explain.json``; returns what
    it wrote.

    Held-out tracks: CarRacing's seeds from ``seed_base``; Udacity's emulator loops of the same
    seeds, each counter-clockwise and then clockwise (:func:`udacity_tracks`), driven at
    ``speed`` mph (Udacity only; default 9). ``max_steps``: frames per track (default 1000 on
    both). ``frames``: replay at most this many recorded steps for the
    atlas's silencing (default all). ``closed_loop_*``: the neurons whose silencing costs most
    (``top``) and ``random`` others (seeded by ``seed``) drive ``tracks`` held-out tracks
    clamped (0 tracks: skipped). ``saliency_frames``: frames scored for saliency faithfulness
    (0: skipped); ``window_method``: how the window attribution is computed ("none": skipped).

    Each finished section is saved to ``RUN_DIR/explain.partial.json`` (:data:`PARTIAL_FILE`),
    and each finished drive of the closed loop or the push under way (:class:`DriveLog`), so
    ``resume`` (a killed explain's run folder) keeps its drive, those sections and those
    drives; one explain writes a run folder at a time.
    """
    from nac_drive.io.atomic import one_writer
    from nac_drive.policy.loading import load_driving_policy

    policy_path, task, seed, seed_base, max_steps = args.policy, args.task, args.seed, args.seed_base, args.max_steps
    policy = load_driving_policy(policy_path, task=task or "carracing", device=args.device)
    config = policy.config
    if (config.task, config.action) not in EXPLAINABLE:
        raise ValueError(f"policy: explain needs a CarRacing policy with discrete actions or a Udacity policy "
                         f"(steering regression), got a {config.task} {config.core.core} policy with "
                         f"{config.action} actions")
    if task is not None and task != config.task:
        raise ValueError(f"--task: {policy_path} is a {config.task!r} policy, not a {task!r} one")
    if args.speed is not None and config.task != "udacity":
        raise ValueError(f"--speed: only a Udacity policy drives at a set speed, this is a {config.task!r} policy")
    speed = UDACITY_SPEED if args.speed is None else args.speed
    if args.resume:
        run_dir, run, report, drives = _resumed(args)
    else:
        (run_dir, run, report), drives = _driven(args, policy_path, config, speed, progress), {}

    def save_partial() -> None:   # the sections finished, and the drives of the one under way
        write_report(run_dir / PARTIAL_FILE, {"args": _recorded(args), "report": report, "drives": drives})

    def drive_log(name: str) -> DriveLog:
        return DriveLog(drives.setdefault(name, {}), save_partial)
    replayed = cache(lambda: replay_representations(run, policy, args.frames))   # probes and dictionary share it
    pushes = cache(lambda: curvature_probe(run, policy, seed, replayed()))       # so do both pushes
    # the closed loop and the push share one Ray session (--ray), started when the first drives
    ray_jobs_once = cache(lambda: ray_session.enter_context(ray_jobs(args.ray if args.closed_loop_tracks else None)))
    sections = {
        "fig4": lambda: fig4_section(run),
        "scenes": lambda: scenes_section(run, config.task, seed),
        "atlas": lambda: atlas_section(run, policy, args.frames, progress),
        "saliency": lambda: saliency_section(run, policy, args.saliency_frames, seed, progress),
        "window": lambda: window_section(run_dir, policy, args.window_method, progress, args.window_every),
        "mirror": lambda: mirror_section(run, policy, args.frames),
        "probes": lambda: probes_section(run, policy, seed, replayed(), pushes),
        "dictionary": lambda: dictionary_section(run, policy, seed, replayed()),
        "closed_loop": lambda: closed_loop_section(run, policy, report["atlas"], args.closed_loop_tracks,
                                                   args.closed_loop_top, args.closed_loop_random, seed, seed_base,
                                                   max_steps, progress, speed, ray_jobs_once(), policy_path,
                                                   log=drive_log("closed_loop")),
        "push": lambda: push_section(run, policy, report["probes"], args.closed_loop_tracks, seed, seed_base, max_steps,
                                     progress, speed, ray_jobs_once(), policy_path, pushes,
                                     intact=(report.get("closed_loop") or {}).get("intact"), log=drive_log("push")),
    }
    with one_writer(run_dir, "nac-drive explain"), contextlib.ExitStack() as ray_session:
        for name in NAC_STATES_NEEDED:
            if name in report:   # finished before a kill (--resume)
                continue
            try:
                report[name] = None if name in report["skipped"] else sections[name]()
            except SectionSkipped as why:
                report[name], report["skipped"][name] = None, str(why)
            drives.pop(name, None)
            save_partial()
        write_report(run_dir / EXPLAIN_FILE, report)
        (run_dir / PARTIAL_FILE).unlink()
    return jsonable(report)


def _recorded(args: ExplainArgs) -> dict:
    """What a resumed explain must be run with again: every flag but ``--out``, ``--resume`` and
    where it runs (``--device``, ``--ray``)."""
    return {k: v for k, v in asdict(args).items() if k not in ("out", "resume", "device", "ray")}


def _resumed(args: ExplainArgs):
    """(run folder, its trace, the report so far, the drives of the section it was killed in:
    section -> name -> figures) of the explain killed in ``args.resume``."""
    from nac_drive.interpret.trace import load_trace
    from nac_drive.io.checkpoint import read_json

    run_dir = Path(args.resume)
    partial = run_dir / PARTIAL_FILE
    if not partial.is_file():
        done = " (it finished: explain.json is there)" if (run_dir / EXPLAIN_FILE).is_file() else ""
        raise ValueError(f"--resume: {run_dir} has no {PARTIAL_FILE}: no explain was killed there{done}")
    saved = read_json(partial)
    drives = kept_drives(saved.get("drives", {})) if isinstance(saved, dict) else None
    if not isinstance(saved, dict) or not isinstance(saved.get("report"), dict) or "args" not in saved or drives is None:
        raise ValueError(f"--resume: {partial} is not an explain's record")
    differ = sorted(k for k, v in _recorded(args).items() if saved["args"].get(k) != v)
    if differ:
        raise ValueError(f"--resume: {run_dir} was explained with other {', '.join('--' + k.replace('_', '-') for k in differ)}"
                         f"; give the flags it was run with")
    run = load_trace(run_dir)
    if run.sha256 != saved["report"].get("trace_sha256"):
        raise ValueError(f"--resume: {run_dir}'s trace is not the one its explain began on")
    return run_dir, run, saved["report"], drives


def kept_drives(drives) -> dict | None:
    """The drives an explain's partial file kept (section -> name -> figures), each as
    :func:`intervened_drive` returned it (:func:`read_figures`); None if any cannot be."""
    if not (isinstance(drives, dict) and all(isinstance(kept, dict) for kept in drives.values())):
        return None
    read = {section: {name: read_figures(figures) for name, figures in kept.items()} for section, kept in drives.items()}
    return None if any(None in kept.values() for kept in read.values()) else read


def read_figures(figures) -> dict | None:
    """A kept drive's ``figures`` as :func:`intervened_drive` returned them, from the JSON they were
    saved in, or None if they cannot be theirs: an object whose every value is a number, a boolean,
    null or a list of them. Strict JSON wrote a NaN (a track's mean offset where no step could be
    read) as null, and a drive's figures hold no other: each null is read as NaN."""
    def plain(value) -> bool:
        return value is None or isinstance(value, (bool, int, float))

    def number(value):
        return math.nan if value is None else value

    if not (isinstance(figures, dict) and all(plain(v) or (isinstance(v, list) and all(map(plain, v)))
                                              for v in figures.values())):
        return None
    return {k: [number(x) for x in v] if isinstance(v, list) else number(v) for k, v in figures.items()}


def _driven(args: ExplainArgs, policy_path, config, speed: float, progress: bool):
    """(run folder, its trace, the report's head) of a new drive with a trace into ``args.out``."""
    from nac_drive.interpret.trace import load_trace
    from nac_drive.pipeline.drive import DriveArgs, drive_carracing, drive_udacity_emulator

    seed_base, max_steps = args.seed_base, args.max_steps
    if config.task == "udacity":
        drive = drive_udacity_emulator(policy_path, udacity_tracks(args.episodes, seed_base),
                                       max_steps or UDACITY_FRAMES, trace_dir=args.out, speed=speed, progress=progress,
                                       device=args.device)
    else:
        drive = drive_carracing(DriveArgs(policy=policy_path, episodes=args.episodes, seed_base=seed_base,
                                          max_steps=max_steps, trace=args.out, device=args.device), progress=progress)
    run_dir = Path(drive["trace"])
    if drive.get("trace_failure"):   # never measure a trace cut short by a full disk
        raise OSError(f"--out: {drive['trace_failure']}")
    run = load_trace(run_dir)
    skipped = skipped_sections(config.core.core, args, run)
    return run_dir, run, {
        "task": config.task, "core": config.core.core, "run": str(run_dir), "policy": drive["policy"],
        "trace_sha256": run.sha256, "drive": {k: drive[k] for k in DRIVE_KEYS[config.task]}, "skipped": skipped,
    }


def udacity_tracks(n: int, base: int = EVAL_SEED_BASE) -> list[str]:
    """explain's ``n`` Udacity emulator tracks: each held-out loop ``random-<seed>`` for seeds from
    ``base`` (:func:`~nac_drive.pipeline.drive.udacity_eval_tracks`) driven counter-clockwise, then
    as its ``-cw`` twin (mirrored, driven clockwise): ``random-900000``, ``random-900000-cw``,
    ``random-900001``, ... A loop driven counter-clockwise has next to no right curve of radius
    <= 60 m; its twin has one for each of its left curves, of the same radius, so ``scenes`` sets
    right curves against left ones on the same geometry (from 2 tracks on). A paired interval over
    tracks counts a loop's two ways round as two tracks. ``drive udacity`` and ``compare`` keep
    :func:`~nac_drive.pipeline.drive.udacity_eval_tracks`, all counter-clockwise."""
    from nac_drive.pipeline.drive import udacity_eval_tracks
    from nac_drive.simulators.udacity_track import CW_SUFFIX

    loops = udacity_eval_tracks((n + 1) // 2, base)
    return [loop + way for loop in loops for way in ("", CW_SUFFIX)][:n]


def skipped_sections(core: str, args: ExplainArgs | None = None, run=None) -> dict[str, str]:
    """The sections of explain.json a policy with this ``core`` (and these ``args``, on this
    ``run``'s trace) leaves null, each with why: those needing the NAC's states
    (:data:`NAC_STATES_NEEDED`) for any other core, those ``args`` turn off
    (``--saliency-frames 0``, ``--window-method none``, ``--closed-loop-tracks 0``: the push)
    and ``scenes`` when the trace has no road scene (:data:`NO_SCENE`)."""
    skipped = {} if core == "nac" else {
        section: f"needs {needs}; this policy's core is {core}"
        for section, needs in NAC_STATES_NEEDED.items() if needs is not None}
    if args is not None and not args.saliency_frames:
        skipped.setdefault("saliency", "--saliency-frames 0")
    if args is not None and args.window_method == "none":
        skipped.setdefault("window", "--window-method none")
    if args is not None and not args.closed_loop_tracks:
        skipped.setdefault("push", "--closed-loop-tracks 0")
    if run is not None and not run.has_scene:
        skipped.setdefault("scenes", NO_SCENE)
    return skipped


def fig4_section(run) -> dict:
    """The paper's Fig. 4 claim tested on the run (:func:`~nac_drive.interpret.fig4.fig4_claim`)."""
    from nac_drive.interpret.fig4 import fig4_claim

    return jsonable(fig4_claim(run))


def scenes_section(run, task: str = "carracing", seed: int = 0) -> dict:
    """The Fig. 4 claim on the road's scenes (curvature ahead from the track, recorded while
    driving), in ``task``'s units: :func:`~nac_drive.interpret.road_scenes.road_scenes`."""
    from nac_drive.interpret.road_scenes import road_scenes

    return jsonable(road_scenes(run, seed=seed, task=task))


def atlas_section(run, policy, frames: int | None = None, progress: bool = False) -> dict:
    """The neuron atlas of ``policy`` on the run (:func:`~nac_drive.interpret.neuron_atlas.neuron_atlas`)."""
    from nac_drive.interpret.neuron_atlas import neuron_atlas

    return jsonable(neuron_atlas(run, policy, max_frames=frames, progress=progress))


def saliency_section(run, policy, frames: int = 500, seed: int = 0, progress: bool = False) -> dict:
    """How faithful the saliency maps are on up to ``frames`` of the run: RISE deletion and
    insertion AUCs and the model-randomisation check of Grad-CAM, Integrated Gradients,
    Occlusion and random maps (:func:`~nac_drive.interpret.faithfulness.saliency_faithfulness`);
    for a CarRacing policy also each method's share of saliency on the road ahead
    (``road_share``, ``road_pixel_share``, ``road_mask``: :mod:`nac_drive.interpret.road_share`)."""
    from nac_drive.interpret.faithfulness import saliency_faithfulness
    from nac_drive.interpret.road_share import ROAD_RULE, road_ahead_mask

    carracing = policy.config.task == "carracing"   # the road rule is CarRacing's frame geometry and colours
    result = saliency_faithfulness(policy, run, max_frames=frames, seed=seed, progress=progress,
                                   road=road_ahead_mask if carracing else None)
    result.pop("frame_indices")   # spread evenly: the count says which
    result["road_mask"] = ROAD_RULE if carracing else None
    return jsonable(result)


def mirror_section(run, policy, frames: int | None = None) -> dict:
    """Whether the policy turns the other way on its run's frames mirrored left-right, on up
    to ``frames`` steps (:func:`~nac_drive.interpret.mirror.mirror_check`)."""
    from nac_drive.interpret.mirror import mirror_check

    return jsonable(mirror_check(policy, run, max_frames=frames))


def replay_representations(run, policy, frames: int | None = None):
    """(name -> ``[n, units]``, name -> why left out, the
    :class:`~nac_drive.interpret.representations.Streamed` pass) of the run's first ``frames``
    steps (default all): :func:`~nac_drive.interpret.representations.representations`."""
    from nac_drive.interpret.representations import representations

    return representations(policy, run, run.num_steps if frames is None else min(frames, run.num_steps))


def scene_targets(run, n: int) -> dict[str, np.ndarray]:
    """The scene variables of the run's first ``n`` steps (name -> ``[n]``, NaN where unknown):
    :data:`~nac_drive.interpret.road_scenes.VARIABLES`."""
    from nac_drive.interpret.road_scenes import VARIABLES

    return {name: getattr(run, name)[:n] for name in VARIABLES}


def probes_section(run, policy, seed: int = 0, replayed=None, pushes=None) -> dict:
    """Which scene variables each representation holds linearly, scored on held-out episodes
    beside a block-permuted control (:func:`~nac_drive.interpret.probes.linear_probes`;
    ``skipped``: the representations this core lacks, each with why), and ``intervention``:
    the steering as the core's output is pushed along the curvature probe
    (:func:`~nac_drive.interpret.probe_steering.push_steering`; None without a recorded
    curvature, ``intervention_skipped`` says why); blocks of the policy's task's
    :attr:`~nac_drive.interpret.road_scenes.RoadScale.block_steps`. ``replayed``:
    :func:`replay_representations`'s (default: of every step); ``pushes``: a function that
    returns :func:`curvature_probe`'s (shared with :func:`push_section`; default: fitted here)."""
    from nac_drive.interpret.probe_steering import push_steering
    from nac_drive.interpret.probes import linear_probes

    replayed = replayed or replay_representations(run, policy)
    found, skipped, stream = replayed
    n = len(stream.outputs)
    result = linear_probes(found, scene_targets(run, n), run.episode[:n], seed,
                           block_steps=task_block_steps(policy))
    result["skipped"] = skipped
    if "curvature" in result["variables"]:
        pushed = pushes() if pushes is not None else curvature_probe(run, policy, seed, replayed)
        result["intervention"] = push_steering(policy, found["core"], pushed, steering_names(run, policy))
    else:
        result["intervention"] = None
        result["intervention_skipped"] = f"needs the curve ahead: {result['variables_skipped']['curvature']}"
    return jsonable(result)


def dictionary_section(run, policy, seed: int = 0, replayed=None) -> dict:
    """A sparse dictionary of the core's output, its variance explained on held-out episodes
    and each atom named by the scene variable it follows
    (:func:`~nac_drive.interpret.dictionary.sparse_dictionary`; a single episode's stretches of
    the policy's task's :attr:`~nac_drive.interpret.road_scenes.RoadScale.block_steps`).
    ``replayed``: :func:`replay_representations`'s (default: of every step)."""
    from nac_drive.interpret.dictionary import sparse_dictionary

    found, _, stream = replayed or replay_representations(run, policy)
    n = len(stream.outputs)
    return jsonable(sparse_dictionary(found["core"], run.episode[:n], scene_targets(run, n), seed,
                                      block_steps=task_block_steps(policy)))


def task_block_steps(policy) -> int:
    """The steps of a stretch the policy's task resamples in (the probes, their pushes and the
    dictionary): :attr:`~nac_drive.interpret.road_scenes.RoadScale.block_steps`."""
    from nac_drive.interpret.road_scenes import road_scale

    return road_scale(policy.config.task).block_steps


def curvature_probe(run, policy, seed: int = 0, replayed=None) -> dict:
    """The curvature probe fitted on the core's outputs at the run's steps (``replayed``:
    :func:`replay_representations`'s, default of every step) and the pushes it gives, in
    stretches of the task's block steps: :func:`~nac_drive.interpret.probe_steering.curvature_pushes`.
    The probes' open-loop push and :func:`push_section`'s closed-loop one use the same."""
    from nac_drive.interpret.probe_steering import curvature_pushes

    found, _, stream = replayed or replay_representations(run, policy)
    n = len(stream.outputs)
    return curvature_pushes(found["core"], run.curvature[:n], run.episode[:n], seed,
                            block_steps=task_block_steps(policy))


def window_section(run_dir: Path, policy, method: str = "integrated_gradients", progress: bool = False,
                   every: int = 1) -> dict:
    """Which frame of the window each decision used: writes ``RUN_DIR/window_attribution.npz``
    (:func:`~nac_drive.interpret.temporal_attribution.compute_window_attribution`, every
    ``every``-th step) and returns the mean share of each frame (0 = the current one) over the
    attributed steps whose window is full,
    how often the current frame has the largest share, and ``completeness`` (Integrated
    Gradients: the steps each decision needed and how far its attribution's sum is from the
    output's change, :func:`~nac_drive.interpret.temporal_attribution.completeness_summary`;
    None for ablation)."""
    from nac_drive.interpret.temporal_attribution import compute_window_attribution, load_window_attribution
    from nac_drive.interpret.trace import load_trace

    path = compute_window_attribution(policy, run_dir, method, progress=progress, every=every)
    attribution = load_window_attribution(path, trace=load_trace(run_dir))
    shares = attribution.shares
    full = shares[np.isfinite(shares).all(axis=1) & (shares.sum(axis=1) > 0)]
    return jsonable({"method": method, "file": path.name, "window": shares.shape[1], "every": every,
                     "full_window_steps": len(full),
                     "mean_share_by_frames_ago": full.mean(axis=0) if len(full) else [],
                     "current_frame_largest": float((full.argmax(axis=1) == 0).mean()) if len(full) else None,
                     "completeness": attribution.metadata.get("completeness")})


def closed_loop_section(run, policy, atlas: dict, tracks: int, top: int, random: int, seed: int = 0,
                        seed_base: int = EVAL_SEED_BASE, max_steps: int | None = None, progress: bool = False,
                        speed: float = UDACITY_SPEED, jobs=None, policy_path: str | None = None,
                        log: DriveLog | None = None) -> dict:
    """The policy drives ``tracks`` held-out tracks intact, then with each chosen neuron of
    ``atlas`` (:func:`atlas_section`) clamped to its mean (the ``top`` whose silencing costs
    most agreement and ``random`` others drawn with ``seed``), then with each part of its
    attention replaced (:func:`attention_parts`): one :func:`intervened_drive` each, in this
    process, or with ``jobs`` each a Ray task (:func:`intervened_drives`; ``log``: the drives
    already finished, each new one added).

    Returns the seeds, ``metric`` and, intact, per neuron (``neurons``) and per attention part
    (``attention``), the drive's figures (with ``track_steering`` and ``track_offset``, as
    :func:`push_section`'s, which reuses the intact ones), the change of the metric from intact and ``paired``:
    the per-track changes' mean and 95% BCa interval (the same tracks driven both ways,
    :func:`~nac_drive.simulators.episode_stats.paired_change`). CarRacing: ``metric``
    "return", the ``returns``, their ``mean_return`` and ``return_change``. Udacity (the
    emulator's tracks of :func:`udacity_tracks`, ``track_names``, at ``speed`` mph): ``metric``
    "mean_abs_cte", the figures of :func:`~nac_drive.pipeline.drive.udacity_summary` (per
    track mean |cte|, laps, off-road, ...) and ``cte_change`` (the mean over tracks of each
    track's change of its mean |cte|, in metres: positive = the clamp drives further from the
    centre line; a track left early weighs as much as one driven whole)."""
    from nac_drive.interpret.neuron_atlas import traced_neurons
    from nac_drive.interpret.probe_steering import steering_values
    from nac_drive.simulators.carracing import eval_seeds

    task = policy.config.task
    metric = METRIC_BY_TASK[task][0]
    rows = atlas["neurons"]
    chosen = [(row, "top") for row in rows[:top]]
    rest = rows[top:]
    picks = np.random.default_rng(seed).choice(len(rest), size=min(random, len(rest)), replace=False)
    chosen += [(rest[i], "random") for i in sorted(picks)]
    if not tracks:
        return {"tracks": 0, "seeds": [], "metric": metric, "intact": None, "neurons": [], "attention": []}
    neurons = {n.name: n for n in traced_neurons(run)}
    parts = attention_parts(run, policy.core.nac, seed)
    seeds = eval_seeds(tracks, base=seed_base)
    clamps = {INTACT: None, **{row["name"]: neurons[row["name"]].clamp(row["mean"]) for row, _ in chosen}, **parts}
    # each drive keeps its tracks' steering and offset: the push (push_section) reads the intact one's
    driven = intervened_drives(policy, clamps, seeds, max_steps, speed, jobs, policy_path, progress, "closed loop",
                               steering_of=partial(steering_values, steering_names(run, policy)), log=log)
    intact = driven[INTACT]
    out = [{"name": row["name"], "chosen": why, "silencing_cost": row["silencing_cost"],
            **against_intact(intact, driven[row["name"]], task)} for row, why in chosen]
    attention = [{"name": name, **against_intact(intact, driven[name], task)} for name in parts]
    return jsonable({**tracks_driven(task, tracks, seeds, seed_base, speed), "seed": seed, "metric": metric,
                     "intact": intact, "neurons": out, "attention": attention})


def push_section(run, policy, probes: dict | None, tracks: int, seed: int = 0, seed_base: int = EVAL_SEED_BASE,
                 max_steps: int | None = None, progress: bool = False, speed: float = UDACITY_SPEED,
                 jobs=None, policy_path: str | None = None, pushes=None, intact: dict | None = None,
                 log: DriveLog | None = None) -> dict:
    """The push along the curvature probe in a closed loop (:mod:`~nac_drive.interpret.probe_steering`):
    the policy drives ``tracks`` (>= 1) held-out tracks intact, then with its core's output moved
    towards a left curve, towards a right one and as far (the same norm) along :data:`PUSH_RANDOM`
    random directions (the probe of ``probes``, :func:`probes_section`'s: ``pushes`` returns
    :func:`curvature_probe`'s, default fitted here), one :func:`intervened_drive` each, in
    this process or as Ray tasks (:func:`intervened_drives`). Any core: it needs no NAC state.
    ``intact``: the figures of the same tracks already driven intact with their steering and offset
    (:func:`closed_loop_section`'s ``intact``), then not driven again; ``log``, as the closed loop's.

    Returns the tracks driven as :func:`closed_loop_section` names them, ``seed``, ``sds``, ``control``
    (how long the random pushes are),
    ``steering`` (what it is), ``metric``, ``probe`` (its ``steps`` and ``in_sample_r2``),
    ``intact`` (the drive's figures, ``track_steering`` and ``track_offset`` among them: each
    track's mean steering and mean signed offset from the centre line), per push (``pushes``:
    ``left``, ``right``, ``random 1`` ...) its ``norm``, ``probe_change``, the drive's figures,
    ``mean_steering``, ``change`` (the steering's, paired per track with a 95% BCa interval),
    ``offset_change`` (the offset's, likewise: below 0, the car keeps further left) and the
    metric's change (``return_change`` or ``cte_change``, and ``paired``, as a clamp's in
    :func:`closed_loop_section`), ``offset`` (the offset's ``verdict`` and ``random_directions``,
    read as the steering's: a car that follows the push keeps left when pushed left), then
    ``random_directions`` and the ``verdict`` (:func:`~nac_drive.interpret.probe_steering.compare_pushes`).
    Without the probes' push (no curve ahead recorded, or constant): :class:`SectionSkipped`."""
    from nac_drive.interpret.probe_steering import compare_pushes, steering_kind, steering_values
    from nac_drive.simulators.carracing import eval_seeds
    from nac_drive.simulators.episode_stats import paired_change

    if not (probes or {}).get("intervention"):
        raise SectionSkipped((probes or {}).get("intervention_skipped") or "needs the probes' push along the "
                                                                          "curvature probe")
    task = policy.config.task
    pushed = pushes() if pushes is not None else curvature_probe(run, policy, seed)
    names = ["left", "right"] + [f"random {i + 1}" for i in range(PUSH_RANDOM)]
    shifts = {name: pushed["shifts"][name] for name in names}
    seeds, action_names = eval_seeds(tracks, base=seed_base), steering_names(run, policy)
    reused = intact is not None and {"track_steering", "track_offset"} <= intact.keys()
    by_push = intervened_drives(policy, ({} if reused else {INTACT: None}) | shifts, seeds, max_steps, speed, jobs,
                                policy_path, progress, "push", steering_of=partial(steering_values, action_names),
                                log=log)
    intact = intact if reused else by_push[INTACT]

    def compared_on(figure: str) -> dict:   # each track's mean steering, or mean offset, under each push
        return compare_pushes(shifts, {name: np.array(by_push[name][figure]) for name in names},
                              np.array(intact[figure]), pushed["reads"], paired_change, names, names[2:])

    compared, moved = compared_on("track_steering"), compared_on("track_offset")
    for row, offset in zip(compared["pushes"], moved["pushes"]):
        row.update(against_intact(intact, by_push[row["push"]], task), offset_change=offset["change"])
    compared["offset"] = {"verdict": moved["verdict"], "random_directions": moved["random_directions"]}
    return jsonable({"mode": "closed loop: the core's output pushed at every step while the policy drives",
                     **tracks_driven(task, tracks, seeds, seed_base, speed), "seed": seed, "sds": pushed["sds"],
                     "control": "random directions, each push as long as the probe's (the same |shift|)",
                     "steering": steering_kind(action_names),
                     "metric": METRIC_BY_TASK[task][0], "probe": pushed["probe"], "intact": intact, **compared})


def against_intact(intact: dict, figures: dict, task: str) -> dict:
    """A drive's ``figures`` with the change of the closed loop's metric from ``intact`` (the
    same tracks driven intact): ``return_change`` or ``cte_change`` (the paired one's mean, so
    it sits in its interval) and ``paired`` (:func:`~nac_drive.simulators.episode_stats.paired_change`)."""
    from nac_drive.simulators.episode_stats import paired_change

    _, change, per_track = METRIC_BY_TASK[task]
    paired = paired_change(intact[per_track], figures[per_track])
    return {**figures, change: paired["mean"], "paired": paired}


def tracks_driven(task: str, tracks: int, seeds: list[int], seed_base: int, speed: float) -> dict:
    """``tracks`` and ``seeds`` of a closed loop; Udacity's also its ``track_names`` (:func:`udacity_tracks`),
    ``seeds`` then each track's own (a loop's twice), and ``speed_mph``."""
    if task != "udacity":
        return {"tracks": tracks, "seeds": seeds}
    from nac_drive.simulators.udacity_track import track_spec

    names = udacity_tracks(tracks, seed_base)
    return {"tracks": tracks, "seeds": [track_spec(name).seed for name in names], "track_names": names,
            "speed_mph": speed}


def steering_names(run, policy) -> list[str] | None:
    """The action names a discrete policy's steering is read from (its run's), None for a
    steering policy (:func:`~nac_drive.interpret.probe_steering.steering`)."""
    return (run.metadata.get("action_names") or []) if policy.config.action == "discrete" else None


def intervened_drives(policy, interventions: dict, seeds: list[int], max_steps: int | None, speed: float,
                      jobs, policy_path: str | None, progress: bool, desc: str,
                      steering_of: Callable[[np.ndarray], np.ndarray] | None = None,
                      log: DriveLog | None = None) -> dict[str, dict]:
    """Name -> :func:`intervened_drive`'s figures under each of ``interventions`` (name ->
    intervention): in this process, or with ``jobs`` (a :class:`~nac_drive.pipeline.ray_tasks.RayJobs`,
    one Ray session for every section that drives) each a Ray task that loads the policy from
    ``policy_path`` (None: the shipped one of its task) on the CPU. The figures are the same
    either way. ``log``: the drives already finished (not driven again), each new one added as
    it finishes."""
    from tqdm import tqdm

    from nac_drive.pipeline.ray_tasks import everywhere

    log = DriveLog() if log is None else log
    task = policy.config.task
    drive = partial(intervened_drive, task=task, seeds=seeds, max_steps=max_steps, speed=speed,
                    steering_of=steering_of)
    bar = {"desc": desc, "unit": "run"}
    left = [name for name in interventions if name not in log.done]
    if jobs is None:
        for name in tqdm(left, disable=not progress, **bar):
            log.add(name, drive(policy, interventions[name]))
    else:
        path = None if policy_path is None else everywhere(policy_path)
        for i, figures in jobs.run(partial(_loaded_drive, drive, path, task), [interventions[name] for name in left],
                                   **(bar if progress else {})):
            log.add(left[i], figures)
    return {name: log.done[name] for name in interventions}


def intervened(policy, intervention):
    """The block in which ``policy`` drives under ``intervention``: a
    :class:`~nac_drive.nac.Clamp` on its NAC's units, a shift ``[core.out_dim]`` of its core's
    output (:meth:`~nac_drive.policy.DrivingPolicy.core_shifted`), or None (intact). Both
    pickle: a Ray task takes either."""
    from nac_drive.nac import Clamp

    if isinstance(intervention, Clamp):
        return policy.core.nac.clamped(intervention)
    return policy.core_shifted(intervention)


def intervened_drive(policy, intervention, *, task: str, seeds: list[int], max_steps: int | None = None,
                     speed: float = UDACITY_SPEED,
                     steering_of: Callable[[np.ndarray], np.ndarray] | None = None) -> dict:
    """``policy`` drives the held-out tracks of ``seeds`` under ``intervention`` (:func:`intervened`;
    None: intact), in envs of its own: CarRacing's tracks (``returns``, ``mean_return``), or the
    Udacity emulator's first ``len(seeds)`` tracks from ``seeds[0]`` (:func:`udacity_tracks`) at
    ``speed`` mph (the figures of :func:`~nac_drive.pipeline.drive.udacity_summary`). With ``steering_of`` (the head's outputs
    ``[n, A]`` -> the steering ``[n]``), also ``track_steering``: each track's mean steering, and
    ``track_offset``: each track's mean signed offset from the centre line (:class:`HeadOutputs`)."""
    driver = PolicyDriver(policy) if steering_of is None else HeadOutputs(policy, task)
    with intervened(policy, intervention):
        if task == "udacity":
            from nac_drive.pipeline.drive import udacity_emulator_env, udacity_emulator_episodes, udacity_summary

            envs = [udacity_emulator_env(name, speed) for name in udacity_tracks(len(seeds), seeds[0])]
            try:
                figures = udacity_summary(udacity_emulator_episodes(driver, envs, max_steps or UDACITY_FRAMES))
            finally:
                for env in envs:
                    env.close()
        else:
            from nac_drive.simulators.carracing import make_carracing, run_episodes

            env = make_carracing(gas=policy.config.gas)
            try:
                returns = [float(r) for r in run_episodes(driver, seeds, max_steps=max_steps, env=env).returns]
            finally:
                env.close()
            figures = {"returns": returns, "mean_return": float(np.mean(returns))}
    if steering_of is not None:
        figures["track_steering"] = [float(np.mean(steering_of(np.stack(outputs)))) for outputs in driver.outputs]
        figures["track_offset"] = [float(np.nanmean(offsets)) for offsets in driver.offsets]
    return figures


class HeadOutputs(PolicyDriver):
    """A :class:`~nac_drive.agents.driver.PolicyDriver` that keeps, at each step it acts on, the
    head's output (``policy.last_output``) and the car's signed offset from the centre line,
    positive right (CarRacing's from the teacher's reading of the track, in track units; the
    Udacity emulator's ``cte``, in metres): ``outputs`` (per episode a list of ``[A]``) and
    ``offsets`` (per episode a list of floats)."""

    def __init__(self, policy, task: str):
        super().__init__(policy)
        self.outputs: list[list[np.ndarray]] = []
        self.offsets: list[list[float]] = []
        self.reader = None
        if task == "carracing":
            from nac_drive.agents.teacher import PurePursuitTeacher

            self.reader = PurePursuitTeacher()

    def reset(self) -> None:
        super().reset()
        self.outputs.append([])
        self.offsets.append([])
        if self.reader is not None:
            self.reader.reset()

    def act(self, obs):
        action = super().act(obs)
        self.outputs[-1].append(self.policy.last_output.numpy())
        offset = obs.get("cte") if isinstance(obs, dict) else self.reader.cross_track_error(self._env)
        self.offsets[-1].append(np.nan if offset is None else float(offset))
        return action


def _loaded_drive(drive, policy_path: str | None, task: str, intervention) -> dict:
    """A Ray task's ``drive`` (:func:`intervened_drive`): the policy loaded where the task runs, on the CPU."""
    from nac_drive.policy.loading import load_driving_policy

    return drive(load_driving_policy(policy_path, task=task), intervention)


def attention_parts(run, nac, seed: int = 0) -> dict:
    """What each part of the NAC's attention carries, as interventions (name -> :class:`Clamp`):
    Top-K by q . k replaced by K keys drawn at random (seeded by ``seed``) and by the K most
    recent (both absent when the layer attends to every key), t_ij held at its mean per head
    over ``run``'s trace, and the weights made uniform."""
    from nac_drive.nac import Clamp

    parts = {}
    if nac.select != "all":
        parts["keys: random K"] = Clamp(keys="random", key_seed=seed)
        parts["keys: most recent K"] = Clamp(keys="recent")
    t_mean = np.nanmean(run.t_interp, axis=(0, 2))   # [H]: each head's mean over its filled slots
    parts["t_ij: its mean per head"] = Clamp(t_interp={h: float(v) for h, v in enumerate(t_mean)})
    parts["weights: uniform"] = Clamp(uniform_weights=True)
    return parts


