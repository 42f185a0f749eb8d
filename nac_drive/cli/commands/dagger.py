"""``nac-drive dagger``: DAgger rounds, the privileged teacher or a PPO expert as the oracle
(:mod:`nac_drive.pipeline.dagger`). Each round fine-tunes the checkpoint it is given, so the
verb takes the flags of ``nac-drive train`` but its architecture (and ``--init-from``;
``--resume`` is the rounds')."""

from __future__ import annotations

import argparse

# flags of `nac-drive train` that dagger does not take: each round fine-tunes its student as it is
NOT_FROM_TRAIN = ("init_from", "resume", "eval_episodes")   # a round drives its student itself; --resume: DaggerArgs


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import ConfigFile, JsonOutput, add_dataclass_arguments, reword_help
    from nac_drive.pipeline import dagger
    from nac_drive.pipeline.train_args import ARCHITECTURE, TrainArgs

    p = subparsers.add_parser("dagger", help="improve a policy with DAgger (an oracle labels the student's states)",
                              description=dagger.__doc__)
    add_dataclass_arguments(p, dagger.DaggerArgs)
    add_dataclass_arguments(p, TrainArgs, skip=ARCHITECTURE + NOT_FROM_TRAIN)   # each round's fine-tuning
    reword_help(p, "run_name", "the rounds' run folders are NAME-r0, NAME-r1, ... (default dagger-r0, ...).")
    for cls in (ConfigFile, JsonOutput):
        add_dataclass_arguments(p, cls)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.dagger import DaggerArgs, dagger
    from nac_drive.pipeline.train_args import TrainArgs

    output = from_namespace(JsonOutput, args)
    rounds = []   # what each round's student drove and the checkpoint fine-tuned after it

    def note_round(index, checkpoint, results) -> None:
        rounds.append({"round": index, "student": results.summary(), "checkpoint": str(checkpoint)})

    final = dagger(from_namespace(DaggerArgs, args), from_namespace(TrainArgs, args), on_round=note_round)
    print(f"final checkpoint: {final}")
    output.emit({"final_checkpoint": str(final), "rounds": rounds})
    return 0
