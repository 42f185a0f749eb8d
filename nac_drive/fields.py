"""Documented, checked dataclass fields: the arguments of every verb, the same in Python
and on the command line (CleanRL style: one documented field per flag; the CLI turns them
into flags, :mod:`nac_drive.cli.arguments`). Light imports only.

``arg(..., min=1)`` gives a field a help text, allowed values, numeric bounds and a check of
its own (``check``: value -> why it is refused, or None);
:func:`check_fields`, called from a dataclass's ``__post_init__``, refuses a value out of
them in one line that names the flag (``--epochs: must be >= 1, got 0``).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, Callable

BOUNDS = ("min", "max", "above", "below")
REQUIRED = dataclasses.MISSING   # arg(REQUIRED, ...): a field without a default (a required flag)
# Caps checked before any work or allocation (--episodes 1e9 once took 23 GB before failing; a seed of
# 10**30 reached HDF5, which stores int64): a run drives at most MAX_EPISODES tracks, and seeds and
# track numbers stay below MAX_SEED, inside every library's seed range and int32 with room to add.
MAX_EPISODES = 100_000
MAX_SEED = 10**9


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


def arg(default: Any, help: str, choices: tuple | None = None, *, group: str | None = None,
        metavar: str | None = None, positional: bool = False, const: Any = None, short: str | None = None,
        check: Callable[[Any], str | None] | None = None, **kwargs) -> Any:
    """A dataclass field with a help text, optional allowed values and optional numeric
    bounds (``min``, ``max``, ``above``, ``below``). How its flag looks: ``group`` (the
    section of ``--help`` it is listed in; None: with the flags an ordinary user sets),
    ``metavar``, ``positional`` (an argument, not a ``--flag``), ``const`` (the value of the
    flag given without one), ``short`` (e.g. ``-o``). ``check``: a value -> why it is refused
    (None: fine), applied when the flag is parsed and by :func:`check_fields`. ``default``
    ``REQUIRED``: no default."""
    metadata = {"help": help, "choices": choices, "group": group, "metavar": metavar, "positional": positional,
                "const": const, "short": short, "check": check, **{b: kwargs.pop(b) for b in BOUNDS if b in kwargs}}
    if default is REQUIRED:
        return dataclasses.field(metadata=metadata, **kwargs)
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def flag_name(field_name: str) -> str:
    """``total_frames`` -> ``--total-frames``"""
    return "--" + field_name.replace("_", "-")


def bounds(f: dataclasses.Field) -> dict:
    """The numeric bounds of a field made by :func:`arg`."""
    return {b: f.metadata[b] for b in BOUNDS if f.metadata.get(b) is not None}


def check_fields(instance) -> None:
    """Raise ValueError naming the first field of a dataclass built with :func:`arg` whose
    value (or, for a list, one of its values) is out of its bounds, not among its choices or
    refused by its ``check``."""
    for f in dataclasses.fields(instance):
        flag = flag_name(f.name)
        choices, check = f.metadata.get("choices"), f.metadata.get("check")
        value = getattr(instance, f.name)
        for value in value if isinstance(value, list) else [value]:   # a list field: each of its values
            if choices and value is not None and value not in choices:
                raise ValueError(f"{flag}: must be one of {', '.join(map(str, choices))}, got {value!r}")
            if check and value is not None and check(value):
                raise ValueError(f"{flag}: {check(value)}")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                problem = check_number(value, **bounds(f))
                if problem:
                    raise ValueError(f"{flag}: {problem}")


def changed_fields(recorded: dict, asked: dict, may_change: tuple[str, ...] = ()) -> list[str]:
    """The names of ``asked`` (a run's arguments as a dict) whose value differs in ``recorded``
    (what a killed run wrote down), but those in ``may_change``, sorted: what a resumed run may
    not change."""
    return sorted(name for name in asked if name not in may_change and recorded.get(name) != asked[name])
