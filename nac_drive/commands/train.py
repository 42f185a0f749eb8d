"""``nac-drive train``: behaviour cloning of a CNN + temporal-core policy (see nac_drive.pipeline.train)."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    from nac_drive.pipeline import train_args

    parser = subparsers.add_parser("train", help="behaviour-clone a policy on demonstrations",
                                   description=train_args.__doc__)
    train_args.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    import os

    from nac_drive.pipeline.train import train
    from nac_drive.pipeline.train_args import args_from_namespace

    run_dir = train(args_from_namespace(args))
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one line for the run, not one per process
        print(f"best checkpoint: {run_dir / 'best'}")
    return 0
