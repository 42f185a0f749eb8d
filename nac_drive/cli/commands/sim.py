"""``nac-drive sim``: simulators that run without a display.

``nac-drive sim udacity-emulator`` connects to a Udacity bridge (``nac-drive drive udacity``
or ``nac-drive collect udacity``) exactly like the Unity simulator would, and reports how the
car was driven. (Its scripted driver's own recordings: ``nac-drive collect udacity --driver
scripted``.)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from nac_drive.fields import arg, check_fields


@dataclass
class EmulatorArgs:
    """Arguments of ``nac-drive sim udacity-emulator``."""

    host: str = arg("127.0.0.1", "bridge host")
    port: int = arg(4567, "bridge port (the simulator's)", min=1, max=65535)
    track: str = arg("lakeside", "gentle, lakeside, serpentine, canyon, or random-<seed>; with the suffix -cw the "
                                 "same loop mirrored, driven clockwise (lakeside-cw)")
    frames: int | None = arg(None, "stop after N telemetry messages", min=1)
    laps: float | None = arg(None, "stop after this many laps", above=0)
    start: float = arg(0.0, "start position, metres along the track")
    stop_off_road: bool = arg(False, "stop at the first off-road event")
    realtime: bool = arg(False, "one step per 1/15 s of wall clock, like the real simulator (without it: as fast as "
                                "answered)")
    timeout: float = arg(5.0, "seconds to wait for an answer", above=0)
    progress: bool | None = arg(None, "show laps, distance and cross-track error live on stderr (default: when "
                                      "stderr is a terminal)")

    def __post_init__(self):
        check_fields(self)


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments

    sim = subparsers.add_parser("sim", help="headless simulators (Udacity protocol emulator)",
                                description=__doc__)
    kinds = sim.add_subparsers(dest="simulator", metavar="SIMULATOR", required=True)
    p = kinds.add_parser("udacity-emulator", help="Udacity Term-1 simulator stand-in (procedural road)")
    for cls in (EmulatorArgs, JsonOutput):
        add_dataclass_arguments(p, cls)
    p.set_defaults(func=run_udacity_emulator)


def print_summary(summary: dict, output) -> None:
    """A run's summary: one ``key: value`` line per entry, then the JSON line of ``output``
    (a :class:`~nac_drive.cli.arguments.JsonOutput`)."""
    for k, v in summary.items():
        print(f"{k}: {v}")
    output.emit(summary)


def check_track(name: str) -> None:
    """Refuse an unknown ``--track`` before anything connects or drives."""
    from nac_drive.simulators.udacity_track import track_spec

    try:
        track_spec(name)
    except ValueError as e:
        raise ValueError(f"--track: {e}") from None


def run_udacity_emulator(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

    args = from_namespace(EmulatorArgs, namespace)
    check_track(args.track)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    cfg = EmulatorConfig(host=args.host, port=args.port, track=args.track, frames=args.frames, laps=args.laps,
                         start=args.start, stop_off_road=args.stop_off_road, realtime=args.realtime,
                         answer_timeout=args.timeout, progress=progress)
    try:
        report = run_emulator(cfg)
    except OSError as e:
        raise OSError(f"cannot connect to a Udacity bridge at {args.host}:{args.port}: {e}") from None
    summary = report.as_dict()
    print_summary(summary, from_namespace(JsonOutput, namespace))
    if report.no_answer:
        print(f"no answer to telemetry within {args.timeout} s: the server ignores a client that never sends "
              "the Socket.IO namespace CONNECT ('40'), as python-socketio >= 5 does (the bridge needs "
              "python-socketio 4.6 / python-engineio 3.13: pip install 'nac-drive[udacity]')",
              file=sys.stderr, flush=True)
        return 2
    return 0
