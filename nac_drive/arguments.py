"""Dataclasses of arguments as command-line flags (CleanRL style: one documented field
per flag). Kept free of heavy imports so that ``nac-drive --help`` stays fast."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


def arg(default: Any, help: str, choices: tuple | None = None, **kwargs) -> Any:
    """A dataclass field with a help text (and optional allowed values), for
    :func:`add_dataclass_arguments`."""
    metadata = {"help": help, "choices": choices}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per field of ``cls``: booleans get ``--flag/--no-flag``."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help with %
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            kind = type(default) if isinstance(default, (int, float, str)) else str
            parser.add_argument(flag, type=kind, default=default, help=help_text, choices=f.metadata.get("choices"))


def from_namespace(cls, namespace: argparse.Namespace, **overrides):
    """Build ``cls`` from the parsed flags of :func:`add_dataclass_arguments`."""
    values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)}
    return cls(**{**values, **overrides})
