"""``nac-drive tune``: a variant's hyper-parameters searched on validation tracks (see
nac_drive.pipeline.tune)."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import ConfigFile, JsonOutput, add_dataclass_arguments
    from nac_drive.pipeline import tune

    parser = subparsers.add_parser("tune", help="search a core's hyper-parameters on validation tracks (Optuna; "
                                                "resumable)", description=tune.__doc__)
    for cls in (tune.TuneArgs, ConfigFile, JsonOutput):
        add_dataclass_arguments(parser, cls)
    parser.set_defaults(func=run)


def run(namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.tune import BEST, TuneArgs, tune

    args, output = from_namespace(TuneArgs, namespace), from_namespace(JsonOutput, namespace)
    best = tune(args)
    settings = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["train_args"].items())
    scored_on = ("the validation episodes of the data" if args.objective == "val-loss"
                 else f"{args.episodes} validation tracks")
    print(f"{args.variant}: best of {best['trials']} trials is trial {best['trial']}, {best['metric']} "
          f"{best['value']:.3f} on {scored_on}: {settings}")
    print(f"written: {args.out}/{args.variant}/{BEST} (nac-drive train --tuned / compare --tuned {args.out})")
    output.emit(best)
    return 0
