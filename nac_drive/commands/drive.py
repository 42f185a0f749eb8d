"""``nac-drive drive``: run a trained policy closed-loop.

    nac-drive drive carracing [--policy RUN/best] [--episodes 20] [--video out.webm] [--trace RUN_DIR] [--json]
    nac-drive drive udacity [--policy RUN/best] [--host 127.0.0.1] [--port 4567] [--speed 9] [--record DIR] [--json]

Either can be watched live in Rerun: ``--rerun`` starts a Rerun viewer, ``--rerun run.rrd``
saves the recording instead (``rerun run.rrd`` opens it later), ``--rerun-serve`` serves it
over gRPC on 127.0.0.1:9876 while the drive lasts (``rerun --connect
rerun+http://127.0.0.1:9876/proxy`` watches it, from another machine through ``ssh -L
9876:127.0.0.1:9876``). The view holds the frame, the
Grad-CAM saliency of the chosen action, the actions, reward, cross-track error and every
traced NAC state, on a ``step`` timeline.

CarRacing scores on the held-out tracks (seeds 900000, 900001, ...) by default, in the env
the policy learned (its ``config.json`` gas: gymnasium's discrete env, or DiscreteActions). Without
``--policy`` the shipped policy drives (CNN+NAC for CarRacing, PilotNet+NAC for Udacity). The policy streams through
``NAC.step()``; the printed latency is the policy's own time per frame.
"""

from __future__ import annotations

import argparse
import json

from nac_drive.arguments import COUNT, PORT, POSITIVE, SEED
from nac_drive.simulators.carracing import EVAL_SEED_BASE


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("drive", help="drive a trained policy closed-loop", description=__doc__)
    sub = parser.add_subparsers(dest="drive_target", metavar="SIMULATOR", required=True)
    car = sub.add_parser("carracing", help="CarRacing-v3")
    add_carracing_arguments(car)
    car.set_defaults(func=run_carracing)

    uda = sub.add_parser("udacity", help="the Udacity simulator, through the socket bridge")
    uda.add_argument("--policy", default=None,
                     help="checkpoint folder of a Udacity policy (default: the shipped PilotNet+NAC policy)")
    uda.add_argument("--host", default="127.0.0.1", help="address to bind (the simulator connects to it)")
    uda.add_argument("--port", type=PORT, default=4567, help="port the simulator connects to")
    uda.add_argument("--speed", type=POSITIVE, default=9.0, help="set speed for the PI throttle controller (mph)")
    uda.add_argument("--record", metavar="DIR", default=None, help="also record driving_log.csv + IMG/ to DIR")
    uda.add_argument("--trace", default=None, metavar="RUN_DIR",
                     help="record frames, steering and NAC traces to RUN_DIR/trace.npz (for the dashboard; "
                          "RUN_DIR-2, -3, ... if RUN_DIR exists)")
    add_live_arguments(uda)
    uda.add_argument("--json", action="store_true", help="end the summary with one line of JSON")
    uda.set_defaults(func=run_udacity)


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the live Rerun view (:class:`~nac_drive.pipeline.drive.LiveOptions`)."""
    live = parser.add_argument_group("live view (Rerun; the 'live' extra)")
    live.add_argument("--rerun", nargs="?", const="viewer", default=None, metavar="FILE.rrd",
                      help="show the drive live in a Rerun viewer; with a file name ending in .rrd, save the "
                           "recording there instead (headless)")
    live.add_argument("--rerun-serve", nargs="?", type=PORT, const=9876, default=None, metavar="PORT",
                      help="serve the recording over gRPC on 127.0.0.1 (default port 9876) while the drive lasts: "
                           "rerun --connect rerun+http://127.0.0.1:PORT/proxy watches it (Rerun's web viewer is not "
                           "offered: it sends usage analytics from the browser)")
    live.add_argument("--no-live-saliency", action="store_true",
                      help="leave the per-frame Grad-CAM overlay out of the live view (it costs a backward pass a frame)")


def live_options(args: argparse.Namespace):
    """The parsed live-view flags as :class:`~nac_drive.pipeline.drive.LiveOptions` (None: no view)."""
    from nac_drive.pipeline.drive import LiveOptions

    if args.rerun is None and args.rerun_serve is None:
        return None
    return LiveOptions(file=None if args.rerun in (None, "viewer") else args.rerun, viewer=args.rerun == "viewer",
                       serve_port=args.rerun_serve, saliency=not args.no_live_saliency)


def add_carracing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help="checkpoint folder (default: the shipped CNN+NAC policy)")
    parser.add_argument("--episodes", type=COUNT, default=20, help="number of tracks")
    parser.add_argument("--seed-base", type=SEED, default=EVAL_SEED_BASE, help="seed of the first track")
    parser.add_argument("--max-steps", type=COUNT, default=None, help="cap each episode (env frames; default 1000)")
    parser.add_argument("--render", choices=["human"], default=None, help="show a window while driving")
    parser.add_argument("--video", default=None, metavar="WEBM",
                        help="write the episodes to a WebM (VP9) video, which browsers and the dashboard play")
    parser.add_argument("--trace", default=None, metavar="RUN_DIR",
                        help="record frames, actions, teacher actions and NAC traces to RUN_DIR/trace.npz "
                             "(RUN_DIR-2, -3, ... if RUN_DIR exists)")
    add_live_arguments(parser)
    parser.add_argument("--json", action="store_true", help="end the output with one line of JSON")


def run_carracing(args: argparse.Namespace) -> int:
    from nac_drive.pipeline.drive import drive_carracing

    summary = drive_carracing(args.policy, args.episodes, args.seed_base, args.max_steps, args.render,
                              args.video, args.trace, progress=not args.json, live=live_options(args))
    for seed, ret, n in zip(summary["seeds"], summary["returns"], summary["lengths"]):
        print(f"seed {seed}: return {ret:8.1f}  frames {n:4d}")
    print(summary.pop("text"))
    if args.trace:
        trace = summary["trace"]
        video = f" --video {args.video}" if args.video else ""
        print(f"trace: {trace}/trace.npz (open it with: nac-drive dashboard {trace}{video} -o dashboard.html)")
    if args.json:
        print(json.dumps(summary))
    return 0


def run_udacity(args: argparse.Namespace) -> int:
    from nac_drive.pipeline.drive import drive_udacity_policy

    return drive_udacity_policy(args.policy, args.host, args.port, args.speed, args.record, args.trace, args.json,
                                live=live_options(args))
