"""``nac-drive dashboard RUN_DIR -o dashboard.html``: one offline HTML file for a recorded run;
``--rrd run.rrd``: the same run as a Rerun recording (what ``drive --rerun`` shows live)."""

from __future__ import annotations

import argparse

from nac_drive.arguments import POSITIVE


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "dashboard", help="write a self-contained HTML dashboard of a recorded run",
        description="Read RUN_DIR/trace.npz (and RUN_DIR/saliency.npz, window_attribution.npz and explain.json "
                    "if present) and write one HTML file that works offline: an episode selector with each "
                    "episode's return, lap and policy/expert agreement, frame scrubber, saliency overlay, the run's "
                    "video, actions, running return, cross-track error, neuron heatmaps, which past frame each "
                    "decision used, NCP wiring.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="directory holding trace.npz (written by drive --trace)")
    p.add_argument("-o", "--output", default=None, metavar="HTML",
                   help="output file (default: RUN_DIR/dashboard.html)")
    p.add_argument("--video", default=None, metavar="WEBM",
                   help="the run's video (drive --video), played beside the traces "
                        "(default: RUN_DIR/video.webm if present)")
    p.add_argument("--title", default=None, help="page title (default: the run directory's name)")
    p.add_argument("--image-budget-mb", type=POSITIVE, default=20.0,
                   help="frames + overlays above this many MB (base64) are re-encoded smaller")
    p.add_argument("--rrd", default=None, metavar="FILE.rrd",
                   help="write the run as a Rerun recording (the layout drive --rerun streams live; needs the "
                        "'live' extra) instead of the HTML file, or as well with -o")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from nac_drive.interpret.dashboard import build_dashboard

    paths = []
    if args.rrd is not None:
        paths.append(write_rrd(args.run_dir, args.rrd))
    if args.rrd is None or args.output is not None:
        paths.append(build_dashboard(args.run_dir, args.output, image_budget=int(args.image_budget_mb * 1e6),
                                     title=args.title, video=args.video))
    for path in paths:
        print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    return 0


def write_rrd(run_dir, out) -> str:
    """The recorded run (and its saliency.npz, if it holds one of this trace) as a Rerun recording."""
    from nac_drive.interpret.live_view import check_rrd_path, require_rerun, trace_to_rrd
    from nac_drive.interpret.saliency import SALIENCY_FILE, load_saliency
    from nac_drive.interpret.trace import load_trace

    require_rerun()
    check_rrd_path(out, "--rrd")
    run = load_trace(run_dir)
    saliency_file = run.path.parent / SALIENCY_FILE
    saliency = load_saliency(saliency_file, trace=run) if saliency_file.is_file() else None
    return str(trace_to_rrd(run, out, saliency=saliency))
