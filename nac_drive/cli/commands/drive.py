"""``nac-drive drive``: run a trained policy closed-loop.

    nac-drive drive carracing [--policy RUN/best] [--episodes 20] [--video out.webm] [--trace RUN_DIR] [--perturb NAME[=LEVEL]] [--json]
    nac-drive drive udacity [--policy RUN/best] [--host 127.0.0.1] [--port 4567] [--speed 9] [--record DIR] [--perturb frame-drop[=P]] [--json]

Either can be watched live in Rerun: ``--rerun`` starts a Rerun viewer, ``--rerun run.rrd``
saves the recording instead (``rerun run.rrd`` opens it later), ``--rerun-serve`` serves it
over gRPC on 127.0.0.1:9876 while the drive lasts (``rerun --connect
rerun+http://127.0.0.1:9876/proxy`` watches it, from another machine through ``ssh -L
9876:127.0.0.1:9876``). The view holds the frame, the
Grad-CAM saliency of the chosen action, the actions, reward, cross-track error and every
traced NAC state, on a ``step`` timeline.

CarRacing scores on the held-out tracks (seeds 900000, 900001, ...) by default, in the env
the policy learned (its ``config.json`` gas: gymnasium's discrete env, or DiscreteActions). Without
``--policy`` the shipped policy drives (CNN+NAC for CarRacing, PilotNet+NAC for Udacity); ``--policy
shipped:mha`` and ``--policy shipped:gru`` drive the CNN+MHA CarRacing and PilotNet+GRU Udacity policies
shipped beside them, which drive better. The policy streams through
``NAC.step()``; the printed latency is the policy's own time per frame. ``--perturb
frame-drop=P`` (either simulator) drops a share P of the frames, drawn per track: the policy
never sees them, the simulator steps on with its last action, and the summary counts them.
"""

from __future__ import annotations

import argparse

CARRACING = """Drive a policy on CarRacing-v3 and score it.

    nac-drive drive carracing [--policy RUN/best] [--episodes 20] [--video out.webm] [--trace RUN_DIR] [--json]

The policy (default: the shipped CNN+NAC policy; ``--policy shipped:mha``: the CNN+MHA policy
shipped beside it) drives the held-out tracks 900000,
900001, ... in the env it learned (its config.json's gas), streaming through ``NAC.step()``;
each track's return and frames are printed, then the mean with its 95% interval, the worst
track and the success rate at 900. ``--video`` writes a WebM, ``--trace`` the run's neuron
traces (``nac-drive dashboard`` shows them), ``--perturb`` changes the env, ``--rerun``
shows the drive live.
"""


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments
    from nac_drive.pipeline.drive import DriveArgs, DriveUdacityArgs, LiveOptions

    parser = subparsers.add_parser("drive", help="drive a trained policy closed-loop", description=__doc__)
    sub = parser.add_subparsers(dest="drive_target", metavar="SIMULATOR", required=True)
    car = sub.add_parser("carracing", help="CarRacing-v3", description=CARRACING)
    for cls in (DriveArgs, JsonOutput, LiveOptions):
        add_dataclass_arguments(car, cls)
    car.set_defaults(func=run_carracing)

    uda = sub.add_parser("udacity", help="the Udacity simulator, through the socket bridge")
    for cls in (DriveUdacityArgs, JsonOutput, LiveOptions):
        add_dataclass_arguments(uda, cls)
    uda.set_defaults(func=run_udacity)


def run_carracing(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.drive import DriveArgs, LiveOptions, drive_carracing

    args, output = from_namespace(DriveArgs, namespace), from_namespace(JsonOutput, namespace)
    summary = drive_carracing(args, from_namespace(LiveOptions, namespace))
    dropped = summary.get("frames_dropped")   # under frame-drop
    for i, (seed, ret, n) in enumerate(zip(summary["seeds"], summary["returns"], summary["lengths"])):
        print(f"seed {seed}: return {ret:8.1f}  frames {n:4d}" + (f"  dropped {dropped[i]:4d}" if dropped else ""))
    print(summary.pop("text"))
    if args.trace:
        trace = summary["trace"]
        video = f" --video {args.video}" if args.video else ""
        print(f"trace: {trace}/trace/ (open it with: nac-drive dashboard {trace}{video} -o dashboard.html)")
    output.emit(summary)
    for flag in ("trace", "rerun"):   # after the summary: the drive itself finished
        if f"{flag}_failure" in summary:
            raise OSError(f"--{flag}: {summary[f'{flag}_failure']}")
    return 0


def run_udacity(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.drive import DriveUdacityArgs, LiveOptions, drive_udacity_policy

    return drive_udacity_policy(from_namespace(DriveUdacityArgs, namespace), from_namespace(LiveOptions, namespace),
                                json_out=from_namespace(JsonOutput, namespace).json)
