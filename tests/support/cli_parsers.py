"""Every leaf verb of the installed CLI with its argparse parser."""

from __future__ import annotations

import argparse


def verb_parsers(parser: argparse.ArgumentParser | None = None, name: str = "nac-drive"):
    """(command line, parser) of every leaf verb, e.g. ("nac-drive expert eval", ...)."""
    if parser is None:
        from nac_drive.cli import build_parser

        parser = build_parser()
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield name, parser
    for group in groups:
        for verb, child in group.choices.items():
            yield from verb_parsers(child, f"{name} {verb}")


def parser_of(command: tuple[str, ...] | list[str]) -> argparse.ArgumentParser:
    """The parser of a command line's verb, leaf or not: ("nac-drive", "collect") or
    ("nac-drive", "collect", "carracing")."""
    from nac_drive.cli import build_parser

    parser = build_parser()
    for word in command[1:]:
        group = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = group.choices[word]
    return parser
