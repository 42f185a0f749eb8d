"""``nac-drive train``: behaviour cloning of a CNN + temporal-core policy (see nac_drive.pipeline.train)."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import add_dataclass_arguments
    from nac_drive.pipeline import train_args

    parser = subparsers.add_parser("train", help="behaviour-clone a policy on demonstrations",
                                   description=train_args.__doc__)
    add_dataclass_arguments(parser, train_args.TrainArgs)
    parser.set_defaults(func=run)


def run(args) -> int:
    import os

    from nac_drive.cli.arguments import from_namespace
    from nac_drive.pipeline.train_args import TrainArgs

    train_args = from_namespace(TrainArgs, args)   # refused before torch is imported
    from nac_drive.pipeline.train import train

    run_dir = train(train_args)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one line for the run, not one per process
        print(f"best checkpoint: {run_dir / 'best'}")
    return 0
