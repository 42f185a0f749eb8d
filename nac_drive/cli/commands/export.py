"""``nac-drive export``: a trained policy as a file another runtime runs.

    nac-drive export --policy RUN/best --format onnx policy.onnx [--graph step|window]
    nac-drive drive carracing --policy policy.onnx        # drives on onnxruntime

``--graph step`` (default) is what the policy runs while it drives: one frame through
``NAC.step``, the streaming cache an input and an output; ``--graph window`` is the forward
over a window of 1 to ``window`` frames. The file holds the policy's config, so it drives
alone. Export checks the file: onnxruntime runs it beside torch on example inputs and the
largest difference is printed: torch runs on ``--device`` (a policy trained on a GPU is checked
there), the graph is traced on the CPU, where onnxruntime runs it. Needs the ``onnx`` extra
(``pip install 'nac-drive[onnx]'``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from nac_drive.devices import device_arg
from nac_drive.fields import REQUIRED, arg, check_fields


@dataclass
class ExportArgs:
    """Arguments of ``nac-drive export``."""

    out: str = arg(REQUIRED, "the file to write (.onnx)", positional=True, metavar="OUT")
    policy: str | None = arg(None, "checkpoint folder or training run folder (default: the shipped CNN+NAC policy)")
    format: str = arg("onnx", "file format", choices=("onnx",))
    graph: str = arg("step", "step: one streamed frame, the NAC cache in and out (what drive runs); window: the "
                             "forward over a window of frames", choices=("step", "window"))
    device: str = device_arg()

    def __post_init__(self):
        from nac_drive.policy.onnx_policy import is_onnx_path

        check_fields(self)
        if not is_onnx_path(self.out):
            raise ValueError(f"OUT: expected a file name ending in .onnx, got {self.out!r}")


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments

    p = subparsers.add_parser("export", help="export a policy to ONNX (onnxruntime drives it)", description=__doc__)
    for cls in (ExportArgs, JsonOutput):
        add_dataclass_arguments(p, cls)
    p.set_defaults(func=run)


def run(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.policy.loading import load_driving_policy
    from nac_drive.policy.onnx_export import export_onnx

    args, output = from_namespace(ExportArgs, namespace), from_namespace(JsonOutput, namespace)
    result = export_onnx(load_driving_policy(args.policy), args.out, graph=args.graph, device=args.device)
    print(f"wrote {result['path']} ({result['graph']} graph; onnxruntime vs torch on example inputs: "
          f"max |difference| {result['max_abs_diff']:.2g})")
    output.emit(result)
    return 0
