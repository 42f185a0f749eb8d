"""``nac-drive saliency``: Grad-CAM overlays for every frame of a recorded run.

    nac-drive saliency RUN_DIR --policy RUN/best [--method gradcam] [--device cuda]

Writes ``RUN_DIR/saliency.npz``; ``nac-drive dashboard RUN_DIR`` then shows the
overlays. The run's frames are replayed through the policy, so each frame's map is
taken with the temporal window before it held fixed.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from nac_drive.devices import device_arg
from nac_drive.fields import REQUIRED, arg


@dataclass
class SaliencyArgs:
    """Arguments of ``nac-drive saliency``."""

    run: str = arg(REQUIRED, "run folder holding a trace (drive --trace)", positional=True, metavar="RUN_DIR")
    policy: str | None = arg(None, "checkpoint folder (default: the shipped CNN+NAC policy)")
    method: str = arg("gradcam", "CAM method: gradcam, gradcam++, eigencam, hirescam, xgradcam or layercam")
    device: str = device_arg()


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments

    p = subparsers.add_parser("saliency", help="Grad-CAM overlays for a recorded run", description=__doc__)
    for cls in (SaliencyArgs, JsonOutput):
        add_dataclass_arguments(p, cls)
    p.set_defaults(func=run)


def run(namespace: argparse.Namespace) -> int:
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.interpret.policy_saliency import policy_saliency

    args, output = from_namespace(SaliencyArgs, namespace), from_namespace(JsonOutput, namespace)
    path = policy_saliency(load_driving_policy(args.policy, device=args.device), args.run, args.method)
    print(f"wrote {path}")
    output.emit({"saliency": str(path), "method": args.method})
    return 0
