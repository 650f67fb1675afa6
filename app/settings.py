"""Checks the services' settings share; each failure is a SettingError naming flag, value and rule."""

from __future__ import annotations

import os
from collections.abc import Mapping

from app.errors import SettingError


class Checker:
    """Collects every SettingError of one settings object (not only the first)."""

    def __init__(self, flags: Mapping[str, str]) -> None:
        self.flags = flags  # settings fields whose flag is not the field name in kebab case
        self.errors: list[SettingError] = []

    def bad(self, field: str, value: object, rule: str) -> None:
        shown = repr(value) if isinstance(value, str) else str(value)
        flag = self.flags.get(field, "--" + field.replace("_", "-"))
        self.errors.append(SettingError(field, flag, shown, rule))

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
