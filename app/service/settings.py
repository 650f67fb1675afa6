"""The services' settings: built from parsed flags, checked into SettingErrors naming flag, value and rule.

Each service's settings dataclass is the one place its defaults are written: a field made with `setting()`
carries its default and the sentence its flag's --help shows, and `add_flag()` declares the flag from it
(argparse default and the "(default …)" in the help both read the field). `flag_rows` lists the flags with
their defaults and sentences, for tables that must agree with them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from app.core.errors import SettingError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound="DataclassInstance")
T = TypeVar("T")


def setting(
    default: T | None = None,
    help: str = "",
    *,
    unit: str = "",
    shown: str = "",
    factory: Callable[[], T] | None = None,
    required: bool = False,
) -> T:
    """A settings field: its default (or `factory`, or none when `required`), the help sentence of its
    flag, and how the default reads there: `shown` verbatim, else the value followed by `unit` ("30" +
    "s"); a None or boolean default is not shown (the sentence says what unset or the switch means)."""
    metadata = {"help": help, "unit": unit, "shown": shown}
    if required:
        return dataclasses.field(metadata=metadata)  # type: ignore[no-any-return]
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)  # type: ignore[return-value]


def field_named(cls: type[DataclassInstance], name: str) -> dataclasses.Field[Any]:
    try:
        return next(f for f in dataclasses.fields(cls) if f.name == name)
    except StopIteration:
        raise KeyError(f"{cls.__module__}.{cls.__qualname__} has no field {name!r}") from None


def default_of(cls: type[DataclassInstance], name: str) -> Any:
    """The field's default value (None where a factory computes it at construction, or it has none)."""
    f = field_named(cls, name)
    return None if f.default is dataclasses.MISSING else f.default


def shown_default(cls: type[DataclassInstance], name: str) -> str:
    """The default as a flag's help and the docs show it: "30s", "8888", "/tmp/nvidia-mps"; "" for none."""
    f = field_named(cls, name)
    if f.metadata.get("shown"):
        return str(f.metadata["shown"])
    value = default_of(cls, name)
    if value is None or isinstance(value, bool):
        return ""
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text + str(f.metadata.get("unit", ""))


def help_of(cls: type[DataclassInstance], name: str) -> str:
    f = field_named(cls, name)
    text = str(f.metadata.get("help", ""))
    shown = shown_default(cls, name)
    return f"{text} (default: {shown})" if shown else text


def add_flag(
    parser: argparse.ArgumentParser,
    cls: type[DataclassInstance],
    flags: Mapping[str, str],
    name: str,
    **kwargs: Any,
) -> None:
    """Declare the flag that sets field `name`, its default and help from the settings field; `kwargs`
    are argparse's own (type, action, dest, metavar, required)."""
    if not kwargs.get("required"):
        kwargs.setdefault("default", default_of(cls, name))
    parser.add_argument(flag_of(name, flags), help=help_of(cls, name), **kwargs)


@dataclass(frozen=True, slots=True)
class FlagRow:
    """One flag of a service, for its docs table: the flag, the settings field, the default, the help."""

    flag: str
    field: str
    default: str  # as `shown_default` writes it; "" when there is none to show
    help: str


def flag_rows(cls: type[DataclassInstance], flags: Mapping[str, str]) -> list[FlagRow]:
    """Every field that carries a help sentence (those a flag sets), in declaration order."""
    return [
        FlagRow(flag_of(f.name, flags), f.name, shown_default(cls, f.name), str(f.metadata["help"]))
        for f in dataclasses.fields(cls)
        if f.metadata.get("help")
    ]


def flag_of(field: str, flags: Mapping[str, str]) -> str:
    """The command-line flag that sets `field`: `flags[field]`, else the field name in kebab case."""
    return flags.get(field, "--" + field.replace("_", "-"))


def from_args(cls: type[S], args: argparse.Namespace, flags: Mapping[str, str], **computed: Any) -> S:
    """A settings dataclass from parsed flags: each field from its flag's value (see `flag_of`), a flag
    left unset (None) keeping the field's default; `computed` gives the fields no single flag sets."""
    given: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        dest = flag_of(f.name, flags).removeprefix("--").replace("-", "_")
        value = getattr(args, dest if hasattr(args, dest) else f.name, None)
        if value is not None:
            given[f.name] = value
    return cls(**{**given, **computed})


class Checker:
    """Collects every SettingError of one settings object (not only the first)."""

    def __init__(self, flags: Mapping[str, str]) -> None:
        self.flags = flags  # settings fields whose flag is not the field name in kebab case
        self.errors: list[SettingError] = []

    def bad(self, field: str, value: object, rule: str) -> None:
        shown = repr(value) if isinstance(value, str) else str(value)
        self.errors.append(SettingError(field, flag_of(field, self.flags), shown, rule))

    def port(self, field: str, value: int, *, zero: str = "") -> None:
        """1..65535, or also 0 when `zero` says what 0 means."""
        if zero and value == 0:
            return
        if not 0 < value < 65536:
            self.bad(field, value, f"must be in 0..65535 (0: {zero})" if zero else "must be in 1..65535")

    def positive(self, field: str, value: float, rule: str = "must be > 0") -> None:
        if value <= 0:
            self.bad(field, value, rule)

    def readable_file(self, field: str, path: str | None, rule: str = "must name a readable file") -> None:
        if not (path and os.path.isfile(path) and os.access(path, os.R_OK)):
            self.bad(field, path, rule)
