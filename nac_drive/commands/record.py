"""``nac-drive record``: record demonstrations from a simulator.

``nac-drive record udacity --out DIR`` serves the Udacity simulator (it connects to
127.0.0.1:4567) without a policy: every telemetry is answered with ``manual``, so the
human keeps driving, and each frame is written in the simulator's training format
(driving_log.csv + IMG/, centre camera; the left/right columns stay empty). Stop with
Ctrl-C; a summary is printed (``--json``: one JSON line).
"""

from __future__ import annotations

import argparse

from nac_drive.arguments import PORT


def add_parser(subparsers) -> None:
    rec = subparsers.add_parser("record", help="record demonstrations (Udacity simulator pass-through)",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = rec.add_subparsers(dest="simulator", metavar="SIMULATOR", required=True)
    p = kinds.add_parser("udacity", help="record a human driving the Udacity simulator")
    p.add_argument("--out", required=True, metavar="DIR", help="recording folder (driving_log.csv + IMG/)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=PORT, default=4567, help="port (default 4567, where the simulator connects)")
    p.add_argument("--json", action="store_true", help="print the final summary as one JSON line")
    p.add_argument("--exit-on-disconnect", action="store_true", help="stop when the simulator disconnects")
    p.set_defaults(func=run_record_udacity)


def run_record_udacity(args) -> int:
    import logging

    from nac_drive.simulators.udacity_bridge import record_udacity

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return record_udacity(args.out, args.host, args.port, args.json, args.exit_on_disconnect)
