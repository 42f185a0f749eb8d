"""``nac-drive expert``: train a PPO expert on CarRacing, or evaluate an expert.

    nac-drive expert train [--continuous] [--total-frames N] [--seed S] [--out DIR] ...
    nac-drive expert kickstart [--rounds 8] [--episodes 4] [--action-repeat 1] ...
    nac-drive expert resume RUN_DIR [--total-frames N]
    nac-drive expert eval [--expert PATH|teacher[-discrete]|planner[-discrete]] [--episodes 20] [--gas G] [--perturb NAME[=LEVEL]] [--json]
    nac-drive expert compare ZIP [ZIP ...] [--episodes 20] [--seed-base 70000] [--gas G] [--json]
    nac-drive expert ship ZIP [ZIP ...] OUT [--gas G]

``eval`` scores on the held-out tracks (seeds 900000, 900001, ...) by default and
uses the shipped expert without ``--expert``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from nac_drive.fields import REQUIRED, arg, check_fields


@dataclass
class Ship:
    """The shipping flag of ``expert train`` and ``expert resume``."""

    ship: str | None = arg(None, "also write the best checkpoint, without optimizer state, to ZIP", metavar="ZIP")


@dataclass
class ExpertResumeArgs:
    """Arguments of ``nac-drive expert resume``."""

    run_dir: str = arg(REQUIRED, "the run's folder (with args.json and evaluated/)", positional=True)
    total_frames: int | None = arg(None, "new target of the run in env frames (default: the one in its args.json)",
                                   min=1)

    def __post_init__(self):
        check_fields(self)


@dataclass
class ExpertShipArgs:
    """Arguments of ``nac-drive expert ship``."""

    zips: list[str] = arg(REQUIRED, "SB3 zip(s) of a PPO expert", positional=True, metavar="ZIP")
    out: str = arg(REQUIRED, "the zip to write", positional=True, metavar="OUT")
    gas: float | None = arg(None, "record this as what the GAS action presses, so that every command drives the "
                                  "expert in that env (choose it with 'compare --gas' first; default: ZIP's)",
                            above=0, max=1)

    def __post_init__(self):
        check_fields(self)


def train_ignored(args) -> dict[str, str]:
    """The fields of an ``ExpertTrainArgs`` its run would not use, each with why."""
    why = {}
    if args.continuous:
        why["gas"] = "only a discrete run's GAS presses a fixed gas (the continuous env's is the action's)"
    else:
        why["log_std_init"] = "only a continuous run (--continuous) has a Gaussian policy"
    if not args.teacher_fit_lr:
        why["teacher_fit_epochs"] = "only with --teacher-fit-lr > 0 (no fit without it)"
    return why


def kickstart_ignored(args) -> dict[str, str]:
    """The fields of a ``KickstartArgs`` its run would not use, each with why."""
    why = {}
    if not args.disturb_rate:
        why["disturb_frames"] = "only with --disturb-rate > 0 (no bursts without it)"
    if not args.value_episodes:
        why["value_epochs"] = "only with --value-episodes > 0 (no value fit without them)"
    return why


def add_parser(subparsers) -> None:
    from nac_drive.agents.ppo_lab.kickstart import KickstartArgs
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments
    from nac_drive.pipeline.evaluate import ExpertCompareArgs, ExpertEvalArgs

    parser = subparsers.add_parser("expert", help="train or evaluate a CarRacing expert",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="expert_command", metavar="SUBCOMMAND", required=True)

    def verb(name: str, func, classes: tuple, **kwargs) -> None:
        p = sub.add_parser(name, **kwargs)
        for cls in classes:
            add_dataclass_arguments(p, cls)
        p.set_defaults(func=func)

    verb("train", _train, (ExpertTrainArgs, Ship, JsonOutput), help="train a PPO expert (stable-baselines3)")
    verb("kickstart", _kickstart, (KickstartArgs, JsonOutput), help="teach a PPO expert's network by DAgger from the "
         "privileged teacher (continue it with 'train --init-from')", description=kickstart_doc())
    verb("resume", _resume, (ExpertResumeArgs, Ship, JsonOutput), help="continue a training run from its last kept checkpoint")
    verb("eval", _eval, (ExpertEvalArgs, JsonOutput), help="evaluate an expert on held-out tracks")
    verb("compare", _compare, (ExpertCompareArgs, JsonOutput),
         help="score several PPO zips (e.g. kept checkpoints) on the same tracks, fast",
         description="Each zip drives its most likely actions in the training's evaluation env, where only the "
                     "frames the expert sees are drawn (~4x faster than 'expert eval', same returns). Choose on "
                     "tracks outside the held-out range, then check the choice once with 'expert eval'.")
    verb("ship", _ship, (ExpertShipArgs, JsonOutput),
         help="write a chosen checkpoint (e.g. the one 'compare' picked), or the average of several, without "
              "optimizer state, as --ship does",
         description="Copies the policy weights and plain hyper-parameters of ZIP, read without unpickling, into a "
                     "new SB3 zip OUT (about a third of the size). Several ZIPs (checkpoints one run kept over its "
                     "last stretch) ship the mean of their weights, which often drives more steadily than each; "
                     "score OUT with 'compare' before shipping it where it counts.")


def kickstart_doc() -> str:
    from nac_drive.agents.ppo_lab import kickstart

    return kickstart.__doc__


def _kickstart(namespace: argparse.Namespace) -> int:
    from nac_drive.agents.ppo_lab.kickstart import KickstartArgs, kickstart
    from nac_drive.cli.arguments import JsonOutput, from_namespace

    output = from_namespace(JsonOutput, namespace)
    zip_path = kickstart(from_namespace(KickstartArgs, namespace, kickstart_ignored))
    print(f"kickstart zip: {zip_path}")
    output.emit({"kickstart_zip": str(zip_path)})
    return 0


def _train(namespace: argparse.Namespace) -> int:
    from nac_drive.agents.ppo_lab.training_args import ExpertTrainArgs
    from nac_drive.cli.arguments import JsonOutput, from_namespace

    args, ship = from_namespace(ExpertTrainArgs, namespace, train_ignored), from_namespace(Ship, namespace)
    output = from_namespace(JsonOutput, namespace)
    from nac_drive.agents.ppo_lab.training import train_expert   # stable-baselines3, after the flags are checked

    return _report(train_expert(args), ship.ship, output)


def _resume(namespace: argparse.Namespace) -> int:
    from nac_drive.agents.ppo_lab.training import resume_expert
    from nac_drive.cli.arguments import JsonOutput, from_namespace

    args, ship = from_namespace(ExpertResumeArgs, namespace), from_namespace(Ship, namespace)
    output = from_namespace(JsonOutput, namespace)
    return _report(resume_expert(args.run_dir, args.total_frames), ship.ship, output)


def _report(best, ship: str | None, output) -> int:
    """Print the best zip a training run returned and ship it if asked (a bad zip, args.json
    or kept state ends in one line through nac_drive.cli.main.run_verb); ``output``'s JSON
    line holds both (:func:`training_summary`)."""
    print(f"best checkpoint: {best}")
    shipped = _write_shipped(best, ship) if ship else None
    output.emit(training_summary(best, shipped))
    return 0


def training_summary(best, shipped) -> dict:
    """The JSON line of ``expert train`` and ``expert resume``: the best zip, the shipped copy (or null)."""
    return {"best_checkpoint": str(best), "shipped": None if shipped is None else str(shipped)}


def _ship(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace

    args, output = from_namespace(ExpertShipArgs, namespace), from_namespace(JsonOutput, namespace)
    output.emit({"shipped": str(_write_shipped(args.zips, args.out, args.gas))})
    return 0


def _write_shipped(src, dst, gas: float | None = None):
    """``src`` (a zip, or zips whose weights are averaged) without optimizer state at ``dst``
    (read without unpickling); returns the path written."""
    from nac_drive.agents.ppo_lab.expert_zip import export_for_shipping

    shipped = export_for_shipping(src, dst, gas)
    print(f"shipped copy: {shipped}")
    return shipped


def _compare(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.evaluate import ExpertCompareArgs, compare_experts

    output = from_namespace(JsonOutput, namespace)
    scored = compare_experts(from_namespace(ExpertCompareArgs, namespace))
    output.emit({path: results.summary() for path, results in scored.items()})
    return 0


def _eval(namespace: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.evaluate import ExpertEvalArgs, evaluate_expert
    from nac_drive.simulators.perturbations import perturbation_record

    output, args = from_namespace(JsonOutput, namespace), from_namespace(ExpertEvalArgs, namespace)
    name, results = evaluate_expert(args)
    for seed, ret, n, lap in zip(results.seeds, results.returns, results.lengths, results.laps):
        print(f"seed {seed}: return {ret:8.1f}  frames {n:4d}  lap {'yes' if lap else 'no'}")
    print(f"{name}: {results.format()}")
    output.emit({**results.summary(), "expert": name, "perturbation": perturbation_record(args.perturb)})
    return 0
