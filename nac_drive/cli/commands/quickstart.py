"""``nac-drive quickstart``: the main job on built-in defaults.

    nac-drive quickstart                        # drive the shipped CNN+NAC policy on 3 unseen tracks
    nac-drive quickstart --full                 # make a policy from the PPO expert, then drive it (36-44 min, 2 cores)
    nac-drive quickstart --full --budget small  # the same stages, smaller: a first look (~3-6 min)

``--full`` runs the stages of the shipped policy's recipe: the expert demonstrates (collect), behaviour cloning,
DAgger rounds in which the expert labels the student's states while random-action bursts
push it off its line, then drives the result on 20 held-out tracks (``--budget small``: 3) and
scores the expert on the same tracks. The video, traces and dashboard show the first 3
tracks driven (``--recorded``).

Writes into ``--out`` (default ``runs/quickstart``; ``runs/quickstart-2``, ... if that
exists, so a run never overwrites another): ``drive.webm``, the run's traces
``run/trace/`` with Grad-CAM overlays ``run/saliency.npz``, and ``dashboard.html``
(open it in any browser, offline). ``--full`` adds ``demos/`` (Minari datasets) and
``train/`` (the run folders) and drives the last DAgger round's best checkpoint (behaviour
cloning's with ``--dagger-rounds 0``); its
summary ends with the policy's share of the expert's return.
"""

from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments
    from nac_drive.pipeline.quickstart import QuickstartArgs

    p = subparsers.add_parser("quickstart", help="drive the shipped policy and build its dashboard (--full: the "
                              "whole pipeline)", description=__doc__)
    add_dataclass_arguments(p, QuickstartArgs)
    add_dataclass_arguments(p, JsonOutput)
    p.set_defaults(func=run)


def run(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.quickstart import QuickstartArgs, quickstart

    output = from_namespace(JsonOutput, namespace)
    summary = quickstart(from_namespace(QuickstartArgs, namespace))
    print(f"video: {summary['video']}\ndashboard: {summary['dashboard']} (open it in a browser)")
    print("stages: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in summary["stage_seconds"].items())
          + f"; total {summary['seconds']:.0f} s")
    output.emit(summary)
    return 0
