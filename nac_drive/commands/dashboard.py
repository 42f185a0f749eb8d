"""``nac-drive dashboard RUN_DIR -o dashboard.html``: one offline HTML file for a recorded run."""

from __future__ import annotations

import argparse

from nac_drive.arguments import POSITIVE


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "dashboard", help="write a self-contained HTML dashboard of a recorded run",
        description="Read RUN_DIR/trace.npz (and RUN_DIR/saliency.npz if present) and write one HTML file "
                    "that works offline: frame scrubber, saliency overlay, the run's video, actions, neuron heatmaps, "
                    "attention over past frames, NCP wiring.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="directory holding trace.npz (written by drive --trace)")
    p.add_argument("-o", "--output", default=None, metavar="HTML",
                   help="output file (default: RUN_DIR/dashboard.html)")
    p.add_argument("--video", default=None, metavar="WEBM",
                   help="the run's video (drive --video), played beside the traces "
                        "(default: RUN_DIR/video.webm if present)")
    p.add_argument("--title", default=None, help="page title (default: the run directory's name)")
    p.add_argument("--image-budget-mb", type=POSITIVE, default=20.0,
                   help="frames + overlays above this many MB (base64) are re-encoded smaller")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from nac_drive.interpret.dashboard import build_dashboard

    path = build_dashboard(args.run_dir, args.output, image_budget=int(args.image_budget_mb * 1e6), title=args.title,
                           video=args.video)
    print(f"wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")
    return 0
