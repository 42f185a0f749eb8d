"""The ``nac-drive`` command line: one subcommand per verb.

Each verb lives in ``nac_drive/cli/commands/<verb>.py`` and exposes
``add_parser(subparsers)``, which registers its flags, the fields of its argument
dataclass (:mod:`nac_drive.cli.arguments`: a bad value is refused before any work), and
sets ``func``. Verb modules import heavy libraries (torch) inside ``func`` so that
``nac-drive --help`` stays fast. :func:`run_verb` runs every verb, so that every error
ends the same way: one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import threading

# Exit codes: 0 done, 1 a bug (an unexpected exception), 2 bad input or an unusable file,
# folder or port (argparse uses 2 for bad flags too), 130 interrupted (Ctrl-C), 143 terminated.
EXIT_BUG, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")   # terminal colours some libraries put in their errors (Ray's)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the verb is, as Ctrl-C is: its ``finally`` blocks and context
    managers close what it writes (a ``.rrd`` gets its footer, a trace its last chunk)."""


def _terminate(signum, frame) -> None:
    if os.getpid() != _terminate.pid:   # a forked worker that kept the handler: end as SIGTERM would
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated

# Verb modules under nac_drive.cli.commands, in the order --help lists them.
COMMANDS: list[str] = ["quickstart", "collect", "train", "dagger", "tune", "compare", "drive", "export", "saliency",
                       "explain", "dashboard", "expert", "sim", "completion"]


def build_parser() -> argparse.ArgumentParser:
    from nac_drive import __version__
    from nac_drive.cli.arguments import Parser

    parser = Parser(
        prog="nac-drive",
        description="Driving agents built on the Neuronal Attention Circuit (NAC): collect "
                    "demonstrations, train CNN+NAC policies, drive them live, look inside.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"nac_drive.cli.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:   # named by the verb's own parser: "nac-drive dagger: error: unrecognized arguments: --core"
        getattr(args, "verb_parser", parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if args.command is None else 2
    return run_verb(args)


def run_verb(args: argparse.Namespace) -> int:
    """Run the parsed verb. Bad input (``ValueError``, which every error class of the
    package extends) and unusable files, folders or ports (``OSError``) end in one line and
    exit 2; anything else is a bug and ends in one line and exit 1.
    ``NAC_DRIVE_TRACEBACK=1`` lets the exception through, traceback and all."""
    name = f"nac-drive {args.command}"
    _terminate.pid = os.getpid()
    in_main_thread = threading.current_thread() is threading.main_thread()   # where handlers can be set
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
    try:
        from nac_drive.cli.arguments import read_config

        read_config(args)
        return int(args.func(args) or 0)
    except Terminated:
        print(f"{name}: terminated (SIGTERM); what it wrote is closed", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        if os.environ.get("NAC_DRIVE_TRACEBACK") == "1":
            raise
        message = " ".join(ANSI_ESCAPE.sub("", str(e)).split()) or type(e).__name__   # a library's colours, gone
        if isinstance(e, (ValueError, OSError)):
            print(f"{name}: error: {message}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(f"{name}: unexpected {type(e).__name__}: {message} (a bug: please report it; "
              f"NAC_DRIVE_TRACEBACK=1 shows where it happened)", file=sys.stderr)
        return EXIT_BUG
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
