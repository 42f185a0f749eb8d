"""The ``nac-drive`` command line: one subcommand per verb.

Each verb lives in ``nac_drive/commands/<verb>.py`` and exposes
``add_parser(subparsers)``, which registers its arguments and sets ``func``. Verb
modules import heavy libraries (torch, gymnasium) inside ``func`` so that
``nac-drive --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Verb modules under nac_drive.commands, in the order --help lists them.
COMMANDS: list[str] = ["quickstart", "collect", "train", "dagger", "drive", "saliency", "dashboard", "expert", "sim", "record"]


def build_parser() -> argparse.ArgumentParser:
    from nac_drive import __version__

    parser = argparse.ArgumentParser(
        prog="nac-drive",
        description="Driving agents built on the Neuronal Attention Circuit (NAC): collect "
                    "demonstrations, train CNN+NAC policies, drive them live, look inside.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"nac_drive.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
