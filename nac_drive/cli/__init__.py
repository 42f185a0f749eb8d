"""The ``nac-drive`` command line: :mod:`~nac_drive.cli.main` (the command and its verbs),
:mod:`~nac_drive.cli.arguments` (argument dataclasses as flags) and one module per verb in
:mod:`~nac_drive.cli.commands`. It only parses arguments and prints results; the work is
done by the layers below (``nac_drive.pipeline`` and down)."""

from nac_drive.cli.main import build_parser, main, run_verb

__all__ = ["build_parser", "main", "run_verb"]
