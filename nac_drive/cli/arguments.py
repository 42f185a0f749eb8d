"""Argument dataclasses as command-line flags: every verb's flags are the documented fields
of its dataclass(es) (:func:`~nac_drive.fields.arg`), added by :func:`add_dataclass_arguments`
and read back by :func:`from_namespace`. Kept free of heavy imports so that ``nac-drive
--help`` stays fast.

A value outside its range is refused when the flags are parsed, before any work starts (a
number flag parses with :func:`number`, which applies its field's bounds); a flag given
whose value the run would not use is refused when its dataclass is built
(:func:`from_namespace`, from the dataclass's ``ignored()``). Every refusal is one line and
exit 2 (:class:`Parser`, ``nac_drive.cli.main.run_verb``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import textwrap
import types
import typing
from typing import Any, Callable

from nac_drive.fields import arg, bounds, check_number, flag_name

GIVEN = "flags_given"   # in the namespace: {field: the flag that set it} of the flags on the command line


@dataclasses.dataclass
class JsonOutput:
    """The output flag of the verbs that print a summary."""

    json: bool = arg(False, "end the output with one line of JSON")

    def emit(self, value) -> None:
        """Print ``value`` as the closing JSON line when ``--json`` was given."""
        if self.json:
            print_json(value)


# What a training run's train_args.json records beside its TrainArgs fields (nac_drive.pipeline.train):
# about the run, not arguments; --config reads past them.
RUN_RECORD_KEYS = ("world_size", "device_used", "torch_threads", "data_info", "policy_config")
MAX_CONFIG_BYTES = 1 << 20


@dataclasses.dataclass
class ConfigFile:
    """The ``--config`` flag of the verbs that read their flags from a file."""

    config: str | None = arg(None, "read this verb's flags from FILE: TOML (keys named as the flags, "
                                   "windows_per_epoch = 1024 or windows-per-epoch = 1024), or a training run's "
                                   "train_args.json (the flags of that run this verb takes); a flag given on the "
                                   "command line overrides the file", metavar="FILE")


def read_config(namespace: argparse.Namespace) -> None:
    """Before a verb runs: its ``--config`` file's flags (:func:`apply_config`), then the
    flags it requires, which the file may give, checked (ValueError)."""
    if getattr(namespace, "config", None):
        apply_config(namespace)
    for action in getattr(getattr(namespace, "verb_parser", None), "required_flags", ()):
        if getattr(namespace, action.dest, None) is None:
            raise ValueError(f"{action.option_strings[-1]}: required (on the command line or in --config)")


def apply_config(namespace: argparse.Namespace) -> None:
    """Set the flags of ``namespace`` that its ``--config`` file holds and the command line
    did not give. Every key of a TOML file must be a flag of the verb, and counts as given
    (a flag the run would not use is refused, :func:`from_namespace`); a run's
    train_args.json is a whole record: its :data:`RUN_RECORD_KEYS` and the TrainArgs fields
    the verb does not take are passed over. A key the verb does not take, or a value of
    another type, is refused (ValueError) in one line naming the file."""
    from nac_drive.io.bounded_json import loads
    from nac_drive.io.capped_read import read_capped

    path = namespace.config
    raw = read_capped(path, MAX_CONFIG_BYTES)
    record = not path.lower().endswith(".toml")
    try:
        if record:
            values = loads(raw)
        else:
            import tomllib

            values = tomllib.loads(raw.decode())
    except ValueError as e:   # TOMLDecodeError, JSONDecodeError and UnicodeDecodeError among them
        raise ValueError(f"--config {path}: not {'JSON' if record else 'TOML'} ({e})") from None
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: expected a JSON object of flags, got {type(values).__name__}")
    fields = {f.name: (f, typing.get_type_hints(cls)[f.name])
              for cls, skip in namespace.verb_parser.argument_classes
              for f in dataclasses.fields(cls) if f.name not in skip and f.name != "config"}
    values = {key.replace("-", "_"): value for key, value in values.items()}
    if record:
        from nac_drive.pipeline.train_args import TrainArgs

        recorded = {f.name for f in dataclasses.fields(TrainArgs)}.union(RUN_RECORD_KEYS) - fields.keys()
        values = {key: value for key, value in values.items() if key not in recorded}
    unknown = sorted(key for key in values if key not in fields)
    if unknown:
        raise ValueError(f"--config {path}: not flags of {namespace.verb_parser.prog}: {', '.join(unknown)}")
    given = namespace.__dict__.setdefault(GIVEN, {})
    for key, value in values.items():
        if key in given:   # the command line wins
            continue
        setattr(namespace, key, _config_value(value, *fields[key], path))
        if not record:
            given[key] = f"{flag_name(key)} (in {path})"


def _config_value(value, f: dataclasses.Field, hint, path: str):
    """``value`` of field ``f`` (annotated ``hint``) from a config file, as its flag would
    parse it; ValueError if it has another type."""
    kinds = [k for k in (typing.get_args(hint) if _is_union(hint) else (hint,)) if k is not type(None)]
    kind = kinds[0] if len(kinds) == 1 else str
    if value is None and len(kinds) < len(typing.get_args(hint) or (hint,)):
        return None
    many = typing.get_origin(kind) is list
    item_kind = typing.get_args(kind)[0] if many else kind
    items = value if many and isinstance(value, list) else [value]
    fits = {bool: lambda v: isinstance(v, bool), int: lambda v: isinstance(v, int) and not isinstance(v, bool),
            float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            str: lambda v: isinstance(v, str)}[item_kind]
    if (many and not isinstance(value, list)) or not all(map(fits, items)):
        wanted = f"a list of {item_kind.__name__}" if many else item_kind.__name__
        raise ValueError(f"--config {path}: {f.name}: expected {wanted}, got {value!r}")
    if item_kind is float:
        return [float(v) for v in value] if many else float(value)
    return list(value) if many else value


def print_json(value) -> None:
    """``value`` as one line of strict JSON (NaN and infinities as null), flushed."""
    from nac_drive.io.strict_json import dumps

    print(dumps(value), flush=True)


def number(kind: type = int, **limits) -> Callable[[str], Any]:
    """An argparse ``type``: parses ``kind`` (int or float) and applies :func:`check_number`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        problem = check_number(value, **limits)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__
    return parse


def checked(kind: type, check: Callable[[Any], str | None]) -> Callable[[str], Any]:
    """An argparse ``type``: parses ``kind`` and refuses what a field's ``check`` refuses."""
    def parse(text: str):
        value = kind(text)
        problem = check(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = kind.__name__
    return parse


class RawDefaults(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Help with the description as written and every flag's default. None is not shown
    (the help says what stands in for it), nor a switch's False."""

    def _get_help_string(self, action):
        unset_switch = action.const is True and action.default is False   # store_true
        if action.default is None or unset_switch:
            return action.help
        return super()._get_help_string(action)

    def _split_lines(self, text, width):
        # never at a hyphen: a wrapped "nac-exact" or "--windows-per-epoch" reads as two words
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)


class Parser(argparse.ArgumentParser):
    """The parser of ``nac-drive`` and of each of its verbs (argparse makes a subcommand's
    parser of its parent's class): help in the :class:`RawDefaults` format everywhere, and a
    bad command line answered in one line (``--help`` shows the usage)."""

    def __init__(self, *args, formatter_class=RawDefaults, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


@functools.cache
def _noting(action: type[argparse.Action]) -> type[argparse.Action]:
    """``action`` that also notes its field and flag in the namespace's :data:`GIVEN` when its flag is given."""
    class Given(action):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            if option_string is not None:
                namespace.__dict__.setdefault(GIVEN, {})[self.dest] = option_string

    return Given


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per field of ``cls`` (but ``skip``), with its help, choices, bounds and
    default: booleans get ``--flag/--no-flag``; ``int | None`` parses as a checked number;
    ``list[str]`` takes one or more values. Fields without a ``group`` come first in
    ``--help``, the others under their group's heading. The parser keeps ``(cls, skip)`` in
    ``parser.argument_classes`` and sets ``verb_parser`` (itself) in the namespace."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        meta = f.metadata
        target = parser if meta.get("group") is None else _group(parser, meta["group"])
        options = _options(f, hints[f.name])
        if meta.get("positional"):
            target.add_argument(f.name, metavar=meta.get("metavar"), **options)
        else:
            names = [meta["short"]] if meta.get("short") else []
            target.add_argument(*names, flag_name(f.name), dest=f.name, metavar=meta.get("metavar"),
                                **options)
    vars(parser).setdefault("argument_classes", []).append((cls, skip))
    parser.set_defaults(verb_parser=parser)
    if cls is ConfigFile:   # a required flag may come from the file: checked after it is read (read_config)
        for action in parser._actions:
            if action.required and action.option_strings:
                action.required = False
                vars(parser).setdefault("required_flags", []).append(action)


def reword_help(parser: argparse.ArgumentParser, dest: str, text: str) -> None:
    """Another ``--help`` text for the flag of ``dest``: where a verb takes a field of another's
    dataclass whose meaning it changes."""
    next(action for action in parser._actions if action.dest == dest).help = text


def _group(parser: argparse.ArgumentParser, title: str):
    """The parser's argument group ``title`` (a heading of ``--help``), made on first use."""
    for group in parser._action_groups:
        if group.title == title:
            return group
    return parser.add_argument_group(title)


def _options(f: dataclasses.Field, hint) -> dict:
    """add_argument's keywords (but the names and metavar) for field ``f`` annotated ``hint``."""
    options: dict[str, Any] = {"help": f.metadata.get("help", "").replace("%", "%%")}  # argparse formats help with %
    if f.default_factory is not dataclasses.MISSING:
        options["default"] = f.default_factory()
    elif f.default is not dataclasses.MISSING:
        options["default"] = f.default
    elif not f.metadata.get("positional"):
        options["required"] = True
    kinds = [k for k in (typing.get_args(hint) if _is_union(hint) else (hint,)) if k is not type(None)]
    kind = kinds[0] if len(kinds) == 1 else str
    if kind is bool:
        return {**options, "action": _noting(argparse.BooleanOptionalAction)}
    if typing.get_origin(kind) is list:
        options["nargs"], kind = "+", typing.get_args(kind)[0]
    if f.metadata.get("const") is not None:
        options.update(nargs="?", const=f.metadata["const"])
    if kind in (int, float):
        kind = number(kind, **bounds(f))
    elif f.metadata.get("check"):
        kind = checked(kind, f.metadata["check"])
    return {**options, "type": kind, "choices": f.metadata.get("choices"), "action": _noting(argparse._StoreAction)}


def _is_union(hint) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def from_namespace(cls, namespace: argparse.Namespace, ignored: Callable[[Any], dict[str, str]] | None = None):
    """Build ``cls`` from the parsed flags of :func:`add_dataclass_arguments` (its
    ``__post_init__`` checks it). A flag given on the command line whose value the instance
    would not use is refused (ValueError ``--flag: why``, the flag as typed): the fields
    ``ignored(instance)`` names, by default the instance's own ``ignored()`` ({field: why})
    if it has one."""
    values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls) if hasattr(namespace, f.name)}
    instance = cls(**values)
    reasons = ignored(instance) if ignored else instance.ignored() if hasattr(instance, "ignored") else {}
    given = getattr(namespace, GIVEN, {})
    for name, why in reasons.items():
        if name in given:
            raise ValueError(f"{given[name]}: {why}")
    return instance
