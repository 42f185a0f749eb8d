"""``nac-drive expert``: train a PPO expert on CarRacing, or evaluate an expert.

    nac-drive expert train [--continuous] [--total-frames N] [--seed S] [--out DIR] ...
    nac-drive expert kickstart [--rounds 8] [--episodes 4] [--action-repeat 1] ...
    nac-drive expert resume RUN_DIR [--total-frames N]
    nac-drive expert eval [--expert PATH|teacher|teacher-discrete] [--episodes 20] [--gas G] [--json]
    nac-drive expert compare ZIP [ZIP ...] [--episodes 20] [--seed-base 70000] [--gas G] [--json]
    nac-drive expert ship ZIP [ZIP ...] OUT [--gas G]

``eval`` scores on the held-out tracks (seeds 900000, 900001, ...) by default and
uses the shipped expert without ``--expert``.
"""

from __future__ import annotations

import argparse
import json

from nac_drive.arguments import COUNT, PEDAL, SEED
from nac_drive.simulators.carracing import EVAL_SEED_BASE


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("expert", help="train or evaluate a CarRacing expert",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="expert_command", metavar="SUBCOMMAND", required=True)

    train = sub.add_parser("train", help="train a PPO expert (stable-baselines3)")
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs
    from nac_drive.arguments import add_dataclass_arguments

    add_dataclass_arguments(train, ExpertTrainArgs)
    train.add_argument("--ship", metavar="ZIP", default=None,
                       help="also write the best checkpoint, without optimizer state, to ZIP")
    train.set_defaults(func=_train)

    kick = sub.add_parser("kickstart", help="teach a PPO expert's network by DAgger from the privileged teacher "
                                            "(continue it with 'train --init-from')",
                          description=kickstart_doc())
    from nac_drive.agents.ppo_lab.kickstart import KickstartArgs

    add_dataclass_arguments(kick, KickstartArgs)
    kick.set_defaults(func=_kickstart)

    res = sub.add_parser("resume", help="continue a training run from its last kept checkpoint")
    res.add_argument("run_dir", help="the run's folder (with args.json and evaluated/)")
    res.add_argument("--total-frames", type=COUNT, default=None,
                     help="new target of the run in env frames (default: the one in its args.json)")
    res.add_argument("--ship", metavar="ZIP", default=None,
                     help="also write the best checkpoint, without optimizer state, to ZIP")
    res.set_defaults(func=_resume)

    ev = sub.add_parser("eval", help="evaluate an expert on held-out tracks")
    ev.add_argument("--expert", default=None,
                    help="SB3 zip of a PPO expert, 'teacher' (privileged, continuous), "
                         "'teacher-discrete', 'random' or 'random-discrete'; default: the shipped PPO expert")
    ev.add_argument("--episodes", type=COUNT, default=20, help="number of tracks")
    ev.add_argument("--seed-base", type=SEED, default=EVAL_SEED_BASE,
                    help="seed of the first track (held-out tracks start at 900000)")
    ev.add_argument("--max-steps", type=COUNT, default=None,
                    help="cap each episode at this many env frames (default: the env's 1000)")
    ev.add_argument("--gas", type=PEDAL, default=None,
                    help="teacher-discrete and random-discrete: what the GAS action presses (default 0.2, "
                         "gymnasium's discrete env); a PPO zip drives with the gas its zip records "
                         "('compare --gas' drives it with another)")
    ev.add_argument("--video", default=None, metavar="WEBM", help="write the episodes to a WebM (VP9) video")
    ev.add_argument("--json", action="store_true",
                    help="end the output with one line of JSON (mean_return, std_return, ...)")
    ev.set_defaults(func=_eval)

    cmp = sub.add_parser("compare", help="score several PPO zips (e.g. kept checkpoints) on the same tracks, fast",
                         description="Each zip drives its most likely actions in the training's evaluation "
                                     "env, where only the frames the expert sees are drawn (~4x faster than "
                                     "'expert eval', same returns). Choose on tracks outside the held-out "
                                     "range, then check the choice once with 'expert eval'.")
    cmp.add_argument("zips", nargs="+", metavar="ZIP", help="SB3 zips of PPO experts")
    cmp.add_argument("--episodes", type=COUNT, default=20, help="number of tracks")
    cmp.add_argument("--seed-base", type=SEED, default=70_000,
                     help="seed of the first track (inside the expert training range, clear of its "
                          "training and validation tracks)")
    cmp.add_argument("--gas", type=PEDAL, default=None,
                     help="drive every zip with the GAS action pressing this instead of the gas its zip "
                          "records (discrete experts; see 'ship --gas')")
    cmp.add_argument("--json", action="store_true",
                     help="end the output with one line of JSON: a summary per zip")
    cmp.set_defaults(func=_compare)

    ship = sub.add_parser("ship", help="write a chosen checkpoint (e.g. the one 'compare' picked), or the average "
                                       "of several, without optimizer state, as --ship does",
                          description="Copies the policy weights and plain hyper-parameters of ZIP, read "
                                      "without unpickling, into a new SB3 zip OUT (about a third of the size). "
                                      "Several ZIPs (checkpoints one run kept over its last stretch) ship the "
                                      "mean of their weights, which often drives more steadily than each; "
                                      "score OUT with 'compare' before shipping it where it counts.")
    ship.add_argument("zips", nargs="+", metavar="ZIP", help="SB3 zip(s) of a PPO expert")
    ship.add_argument("out", metavar="OUT", help="the zip to write")
    ship.add_argument("--gas", type=PEDAL, default=None,
                      help="record this as what the GAS action presses, so that every command drives the "
                           "expert in that env (choose it with 'compare --gas' first; default: ZIP's)")
    ship.set_defaults(func=_ship)


def kickstart_doc() -> str:
    from nac_drive.agents.ppo_lab import kickstart

    return kickstart.__doc__


def _kickstart(args: argparse.Namespace) -> int:
    from nac_drive.agents.ppo_lab.kickstart import KickstartArgs, kickstart
    from nac_drive.arguments import from_namespace

    print(f"kickstart zip: {kickstart(from_namespace(KickstartArgs, args))}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from nac_drive.agents.ppo_lab.training import train_expert
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs
    from nac_drive.arguments import from_namespace

    return _report(train_expert(from_namespace(ExpertTrainArgs, args)), args.ship)


def _resume(args: argparse.Namespace) -> int:
    from nac_drive.agents.ppo_lab.training import resume_expert

    return _report(resume_expert(args.run_dir, args.total_frames), args.ship)


def _report(best, ship: str | None) -> int:
    """Print the best zip a training run returned and ship it if asked (a bad zip, args.json
    or kept state ends in one line through nac_drive.cli.run_verb)."""
    print(f"best checkpoint: {best}")
    if ship:
        _write_shipped(best, ship)
    return 0


def _ship(args: argparse.Namespace) -> int:
    _write_shipped(args.zips, args.out, args.gas)
    return 0


def _write_shipped(src, dst, gas: float | None = None) -> None:
    """``src`` (a zip, or zips whose weights are averaged) without optimizer state at ``dst``
    (read without unpickling)."""
    from nac_drive.agents.ppo_lab.expert_zip import export_for_shipping

    print(f"shipped copy: {export_for_shipping(src, dst, gas)}")


def _compare(args: argparse.Namespace) -> int:
    from nac_drive.pipeline.evaluate import compare_experts

    scored = compare_experts(args.zips, args.episodes, args.seed_base, progress=not args.json, gas=args.gas)
    if args.json:
        print(json.dumps({path: results.summary() for path, results in scored.items()}))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from nac_drive.pipeline.evaluate import evaluate_expert

    name, results = evaluate_expert(args.expert, args.episodes, args.seed_base, args.max_steps, args.video,
                                    progress=not args.json, gas=args.gas)
    for seed, ret, n, lap in zip(results.seeds, results.returns, results.lengths, results.laps):
        print(f"seed {seed}: return {ret:8.1f}  frames {n:4d}  lap {'yes' if lap else 'no'}")
    print(f"{name}: {results.format()}")
    if args.json:
        print(json.dumps({**results.summary(), "expert": name}))
    return 0
