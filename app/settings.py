"""The services' settings: built from parsed flags, checked into SettingErrors naming flag, value and rule."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from app.errors import SettingError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound="DataclassInstance")


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
