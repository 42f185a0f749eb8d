"""``nac-drive quickstart``: the main job on built-in defaults.

    nac-drive quickstart                 # drive the shipped CNN+NAC policy on 3 unseen tracks
    nac-drive quickstart --full          # collect with the shipped expert -> train -> drive

Writes into ``--out`` (default ``runs/quickstart``; ``runs/quickstart-2``, ... if that
exists, so a run never overwrites another): ``drive.webm``, the run's traces
``run/trace.npz`` with Grad-CAM overlays ``run/saliency.npz``, and ``dashboard.html``
(open it in any browser, offline). ``--full`` adds ``demos/`` (a Minari dataset) and
``train/`` (the run folder with the best checkpoint) and drives that checkpoint.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from nac_drive.arguments import COUNT, SEED, SIZE

VIDEO = "drive.webm"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("quickstart", help="drive the shipped policy and build its dashboard (--full: the "
                              "whole pipeline)", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/quickstart",
                   help="output folder (default runs/quickstart; <out>-2, -3, ... if it exists)")
    p.add_argument("--episodes", type=COUNT, default=3, help="held-out tracks to drive (default 3)")
    p.add_argument("--max-steps", type=COUNT, default=None, help="cap each driven episode (env frames)")
    p.add_argument("--no-saliency", action="store_true", help="skip the Grad-CAM overlays")
    p.add_argument("--full", action="store_true", help="collect -> train -> drive instead of the shipped policy")
    p.add_argument("--expert", default="ppo", help="--full: expert for collection (ppo, teacher, teacher-discrete)")
    p.add_argument("--collect-episodes", type=COUNT, default=10, help="--full: demonstration episodes (default 10)")
    p.add_argument("--core", default="nac", help="--full: temporal core (nac, lstm, gru, cfc, ltc, mha)")
    p.add_argument("--epochs", type=COUNT, default=10, help="--full: training epochs (default 10)")
    p.add_argument("--windows-per-epoch", type=SIZE, default=4096, help="--full: windows per epoch (default 4096)")
    p.add_argument("--seed", type=SEED, default=0, help="--full: seed of collection and training (default 0)")
    p.add_argument("--json", action="store_true", help="end the output with one line of JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nac_drive.atomic import fresh_dir
    from nac_drive.commands.drive import drive_carracing

    out = fresh_dir(args.out)
    print(f"output folder: {out}", flush=True)
    started = time.perf_counter()
    policy_path = None
    if args.full:
        policy_path = _collect_and_train(args, out)
    print(f"driving {'the shipped policy' if policy_path is None else policy_path} on {args.episodes} "
          f"held-out tracks ...", flush=True)
    summary = drive_carracing(policy_path, args.episodes, max_steps=args.max_steps,
                              video=str(out / VIDEO), trace_dir=str(out / "run"), progress=not args.json)
    print(summary.pop("text"))
    run = Path(summary["trace"])
    dashboard = _dashboard(policy_path, run, out, with_saliency=not args.no_saliency, progress=not args.json)
    summary.update(video=str(out / VIDEO), trace=str(run / "trace.npz"), dashboard=str(dashboard),
                   seconds=round(time.perf_counter() - started, 1))
    print(f"video: {summary['video']}\ndashboard: {dashboard} (open it in a browser)")
    if args.json:
        print(json.dumps(summary))
    return 0


def _collect_and_train(args: argparse.Namespace, out: Path) -> Path:
    from nac_drive.commands.collect import collect_carracing
    from nac_drive.train import train
    from nac_drive.train_args import TrainArgs

    print(f"collecting {args.collect_episodes} episodes with the {args.expert} expert ...", flush=True)
    dataset, results = collect_carracing(args.expert, args.collect_episodes, args.seed, str(out / "demos"),
                                         name=f"quickstart-{args.expert}-s{args.seed}", progress=not args.json)
    print(results.format())
    print(f"training a CNN+{args.core} policy on {dataset} ...", flush=True)
    run_dir = train(TrainArgs(data=str(dataset), out=str(out / "train"), core=args.core, epochs=args.epochs,
                              windows_per_epoch=args.windows_per_epoch, seed=args.seed, progress=not args.json))
    return run_dir / "best"


def _dashboard(policy_path, run: Path, out: Path, with_saliency: bool, progress: bool) -> Path:
    from nac_drive.agents.driver import load_driving_policy
    from nac_drive.interpret.dashboard import build_dashboard

    if with_saliency:
        from nac_drive.interpret.policy_saliency import policy_saliency

        policy_saliency(load_driving_policy(policy_path), run, progress=progress)
    return build_dashboard(run, out / "dashboard.html", title="nac-drive quickstart", video=out / VIDEO)
