"""``nac-drive train``: behaviour cloning of a CNN + temporal-core policy (see nac_drive.pipeline.train)."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import ConfigFile, JsonOutput, add_dataclass_arguments
    from nac_drive.pipeline import train_args

    parser = subparsers.add_parser("train", help="behaviour-clone a policy on demonstrations",
                                   description=train_args.__doc__)
    for cls in (train_args.TrainArgs, ConfigFile, JsonOutput):
        add_dataclass_arguments(parser, cls)
    parser.set_defaults(func=run)


def run(args) -> int:
    import os

    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.train_args import TrainArgs

    train_args, output = from_namespace(TrainArgs, args), from_namespace(JsonOutput, args)   # before torch
    from nac_drive.pipeline.train import run_summary, train

    run_dir = train(train_args)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one line for the run, not one per process
        summary = run_summary(run_dir)
        best = summary["best_epoch"]
        shown = ", ".join(f"{name} {value:.4g}" for name, value in best.items() if name != "epoch" and value is not None)
        print(f"best checkpoint: {summary['best_checkpoint']} (epoch {best['epoch']:.0f}: {shown})")
        output.emit(summary)
    return 0
