"""``nac-drive saliency``: Grad-CAM overlays for every frame of a recorded run.

    nac-drive saliency --policy RUN/best --run RUN_DIR [--method gradcam]

Writes ``RUN_DIR/saliency.npz``; ``nac-drive dashboard RUN_DIR`` then shows the
overlays. The run's frames are replayed through the policy, so each frame's map is
taken with the temporal window before it held fixed.
"""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("saliency", help="Grad-CAM overlays for a recorded run", description=__doc__)
    p.add_argument("--policy", default=None, help="checkpoint folder (default: the shipped CNN+NAC policy)")
    p.add_argument("--run", required=True, metavar="RUN_DIR", help="run folder holding trace.npz (drive --trace)")
    p.add_argument("--method", default="gradcam",
                   help="CAM method: gradcam, gradcam++, eigencam, hirescam, xgradcam or layercam")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nac_drive.agents.driver import load_driving_policy
    from nac_drive.interpret.policy_saliency import policy_saliency

    path = policy_saliency(load_driving_policy(args.policy), args.run, args.method)
    print(f"wrote {path}")
    return 0
