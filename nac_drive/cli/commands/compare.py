"""``nac-drive compare``: temporal cores and NAC ablations trained and driven alike (see
nac_drive.pipeline.compare)."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import ConfigFile, JsonOutput, add_dataclass_arguments
    from nac_drive.pipeline import compare

    parser = subparsers.add_parser("compare", help="train and drive several cores alike, several seeds each",
                                   description=compare.__doc__)
    for cls in (compare.CompareArgs, ConfigFile, JsonOutput):
        add_dataclass_arguments(parser, cls)
    parser.set_defaults(func=run)


def run(namespace) -> int:
    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.pipeline.compare import REPORT_JSON, CompareArgs, compare, markdown_table

    args, output = from_namespace(CompareArgs, namespace), from_namespace(JsonOutput, namespace)
    report = compare(args)
    print(markdown_table(report))
    print(f"written: {args.out}/{REPORT_JSON} and .md (tensorboard --logdir {args.out}/runs: the HParams table)")
    output.emit(report)
    return 0
