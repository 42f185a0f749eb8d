"""``nac-drive completion bash|zsh``: a shell completion script for every verb and flag.

    eval "$(nac-drive completion bash)"                       # this shell; add the line to ~/.bashrc to keep it
    nac-drive completion zsh > "${fpath[1]}/_nac-drive"      # zsh: a file on $fpath, then a new shell

The script is generated from the parser itself (shtab), so it always knows the flags of the
installed version.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from nac_drive.fields import REQUIRED, arg, check_fields

SHELLS = ("bash", "zsh")


@dataclass
class CompletionArgs:
    """Arguments of ``nac-drive completion``."""

    shell: str = arg(REQUIRED, "the shell the script is for", choices=SHELLS, positional=True, metavar="SHELL")

    def __post_init__(self):
        check_fields(self)


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import add_dataclass_arguments

    p = subparsers.add_parser("completion", help="print a shell completion script (bash, zsh)", description=__doc__)
    add_dataclass_arguments(p, CompletionArgs)
    p.set_defaults(func=run)


def run(namespace: argparse.Namespace) -> int:
    import shtab

    from nac_drive.cli.arguments import from_namespace
    from nac_drive.cli.main import build_parser

    args = from_namespace(CompletionArgs, namespace)
    print(shtab.complete(build_parser(), shell=args.shell))
    return 0
