"""Dataclasses of arguments as command-line flags (CleanRL style: one documented field
per flag), and the checked number types every verb parses its flags with. Kept free of
heavy imports so that ``nac-drive --help`` stays fast.

A value outside its range is refused when the flags are parsed, before any work starts:
``number(int, min=1)`` is an argparse ``type``; ``arg(..., min=1)`` gives a dataclass field
the same check, both on the command line and when the dataclass is built in Python
(:func:`check_fields`, called from ``__post_init__``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import operator
import typing
from typing import Any, Callable

BOUNDS = ("min", "max", "above", "below")


def check_number(value: float, *, min=None, max=None, above=None, below=None) -> str | None:
    """Why ``value`` is out of range (``None`` if it is fine); NaN and inf never are."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    for bound, holds, words in ((min, operator.ge, ">="), (max, operator.le, "<="),
                                (above, operator.gt, ">"), (below, operator.lt, "<")):
        if bound is not None and not holds(value, bound):
            return f"must be {words} {bound}, got {value}"
    return None


def in_unit_interval(value: Any) -> bool:
    """Whether ``value`` is a real number (not a bool) in (0, 1]: a pedal, a discount."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


def number(kind: type = int, **bounds) -> Callable[[str], Any]:
    """An argparse ``type``: parses ``kind`` (int or float) and applies :func:`check_number`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        problem = check_number(value, **bounds)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__
    return parse


COUNT = number(int, min=1)             # episodes, epochs, frames: at least one
SEED = number(int, min=0)
PORT = number(int, min=1, max=65535)
POSITIVE = number(float, above=0)      # speeds, durations, laps, budgets
PEDAL = number(float, above=0, max=1)  # how far a pedal is pressed: (0, 1]


class RawDefaults(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Help with the description as written and every flag's default. None is not shown
    (the help says what stands in for it), nor a switch's False."""

    def _get_help_string(self, action):
        unset_switch = action.const is True and action.default is False   # store_true
        if action.default is None or unset_switch:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """The parser of ``nac-drive`` and of each of its verbs (argparse makes a subcommand's
    parser of its parent's class): help in the :class:`RawDefaults` format everywhere."""

    def __init__(self, *args, formatter_class=RawDefaults, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def arg(default: Any, help: str, choices: tuple | None = None, **kwargs) -> Any:
    """A dataclass field with a help text, optional allowed values and optional numeric
    bounds (``min``, ``max``, ``above``, ``below``), for :func:`add_dataclass_arguments`."""
    metadata = {"help": help, "choices": choices, **{b: kwargs.pop(b) for b in BOUNDS if b in kwargs}}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per field of ``cls``: booleans get ``--flag/--no-flag``; a field
    annotated ``int | None`` (or ``float | None``) parses as a checked number."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = flag_name(f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f.metadata.get("help", "").replace("%", "%%")  # argparse formats help with %
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            kind = type(default) if isinstance(default, (int, float, str)) else _optional_number(hints[f.name])
            if kind in (int, float):
                kind = number(kind, **_bounds(f))
            parser.add_argument(flag, type=kind, default=default, help=help_text, choices=f.metadata.get("choices"))


def _optional_number(hint) -> type:
    """``int | None`` -> int, ``float | None`` -> float, anything else -> str."""
    kinds = [k for k in typing.get_args(hint) if k is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (int, float) else str


def flag_name(field_name: str) -> str:
    """``total_frames`` -> ``--total-frames``"""
    return "--" + field_name.replace("_", "-")


def _bounds(f: dataclasses.Field) -> dict:
    return {b: f.metadata[b] for b in BOUNDS if f.metadata.get(b) is not None}


def check_fields(instance) -> None:
    """Raise ValueError naming the first field of a dataclass built with :func:`arg` whose
    value is out of its bounds or not among its choices."""
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        flag = flag_name(f.name)
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise ValueError(f"{flag}: must be one of {', '.join(map(str, choices))}, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            problem = check_number(value, **_bounds(f))
            if problem:
                raise ValueError(f"{flag}: {problem}")


def from_namespace(cls, namespace: argparse.Namespace, **overrides):
    """Build ``cls`` from the parsed flags of :func:`add_dataclass_arguments`."""
    values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)}
    return cls(**{**values, **overrides})
