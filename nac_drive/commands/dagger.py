"""``nac-drive dagger``: DAgger rounds, the privileged teacher or a PPO expert as the oracle
(:mod:`nac_drive.pipeline.dagger`)."""

from __future__ import annotations

import argparse

from nac_drive.arguments import COUNT, number


def add_parser(subparsers) -> None:
    from nac_drive.pipeline import dagger, train_args

    p = subparsers.add_parser("dagger", help="improve a policy with DAgger (an oracle labels the student's states)",
                              description=dagger.__doc__)
    p.add_argument("--policy", required=True, help="checkpoint folder to start from")
    p.add_argument("--rounds", type=COUNT, default=3, help="DAgger rounds")
    p.add_argument("--episodes", type=COUNT, default=5, help="student episodes per round")
    p.add_argument("--max-steps", type=COUNT, default=None, help="cap each student episode (env frames)")
    p.add_argument("--disturb-rate", type=number(float, min=0, max=1), default=0.0,
                   help="chance per undisturbed frame that a burst of one random action replaces the "
                        "student's, so the teacher labels recoveries (after DART; 0: none)")
    p.add_argument("--disturb-frames", type=COUNT, default=10, help="frames per disturbance burst")
    p.add_argument("--workers", type=COUNT, default=None,
                   help="processes that drive a round's tracks, one shard each (default: one per core)")
    p.add_argument("--oracle", default="teacher",
                   help="who labels: 'teacher' (privileged pure pursuit), 'ppo' (the shipped PPO "
                        "expert, from the frames the student sees) or the path of a PPO expert zip; a PPO "
                        "oracle must drive the student's env (the same gas)")
    train_args.add_arguments(p)   # --data, --out, --epochs, ... for each round's fine-tuning
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from nac_drive.pipeline.dagger import dagger
    from nac_drive.pipeline.train_args import args_from_namespace

    final = dagger(args.policy, args.data, args.rounds, args.episodes, args_from_namespace(args),
                   seed=args.seed, max_steps=args.max_steps, progress=args.progress,
                   disturb_rate=args.disturb_rate, disturb_frames=args.disturb_frames, oracle=args.oracle,
                   workers=args.workers)
    print(f"final checkpoint: {final}")
    return 0
