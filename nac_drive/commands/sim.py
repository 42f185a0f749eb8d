"""``nac-drive sim``: simulators that run without a display.

``nac-drive sim udacity-emulator`` connects to a Udacity bridge (``nac-drive drive udacity``
or ``nac-drive collect udacity``) exactly like the Unity simulator would, and reports how the
car was driven. (Its scripted driver's own recordings: ``nac-drive collect udacity --driver
scripted``.)
"""

from __future__ import annotations

import argparse
import json
import sys

from nac_drive.arguments import COUNT, PORT, POSITIVE, number


def add_parser(subparsers) -> None:
    sim = subparsers.add_parser("sim", help="headless simulators (Udacity protocol emulator)",
                                description=__doc__)
    kinds = sim.add_subparsers(dest="simulator", metavar="SIMULATOR", required=True)
    p = kinds.add_parser("udacity-emulator", help="Udacity Term-1 simulator stand-in (procedural road)")
    p.add_argument("--host", default="127.0.0.1", help="bridge host")
    p.add_argument("--port", type=PORT, default=4567, help="bridge port (the simulator's)")
    p.add_argument("--track", default="lakeside",
                   help="gentle, lakeside, serpentine, canyon, or random-<seed>")
    p.add_argument("--frames", type=COUNT, default=None,
                   help="stop after N telemetry messages")
    p.add_argument("--laps", type=POSITIVE, default=None, help="stop after this many laps")
    p.add_argument("--start", type=number(float), default=0.0, help="start position, metres along the track")
    p.add_argument("--stop-off-road", action="store_true", help="stop at the first off-road event")
    p.add_argument("--realtime", action="store_true",
                   help="one step per 1/15 s of wall clock, like the real simulator (default: as fast as answered)")
    p.add_argument("--timeout", type=POSITIVE, default=5.0, help="seconds to wait for an answer")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show laps, distance and cross-track error live on stderr "
                        "(default: when stderr is a terminal)")
    p.set_defaults(func=run_udacity_emulator)


def print_summary(summary: dict, as_json: bool) -> None:
    """A run's summary: one JSON line, or one ``key: value`` line per entry."""
    if as_json:
        print(json.dumps(summary), flush=True)
    else:
        for k, v in summary.items():
            print(f"{k}: {v}")


def check_track(name: str) -> None:
    """Refuse an unknown ``--track`` before anything connects or drives."""
    from nac_drive.simulators.udacity_track import track_spec

    try:
        track_spec(name)
    except ValueError as e:
        raise ValueError(f"--track: {e}") from None


def run_udacity_emulator(args) -> int:
    from nac_drive.simulators.udacity_emulator import EmulatorConfig, run_emulator

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
    print_summary(summary, args.json)
    if report.no_answer:
        print(f"no answer to telemetry within {args.timeout} s: the server ignores a client that never sends "
              "the Socket.IO namespace CONNECT ('40'), as python-socketio >= 5 does (the bridge needs "
              "python-socketio 4.6 / python-engineio 3.13: pip install 'nac-drive[udacity]')",
              file=sys.stderr, flush=True)
        return 2
    return 0
