"""The docs' tables of settings say what the code and the chart do: flag defaults, chart values, templates.

docs/operator/settings.md has one table per service (flag | default | chart value | chart default | meaning).
Each row is checked against the service's settings object (the one place its defaults live), its real
command-line parser (`gpupack ... --help`), the chart's `values.yaml` and the templates that pass chart values
to flags. The chart-values tables of the operator guide and the chart's README are checked against
`values.yaml`. A table that drifts fails here, naming the row and both values.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import build_parser
from app.service.settings import flag_of

REPO = Path(__file__).resolve().parents[2]
SETTINGS_DOC = REPO / "docs/operator/settings.md"
CHART = REPO / "deploy/helm/gpupack"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
VALUES_TABLES = [REPO / "docs/operator-guide.md", CHART / "README.md"]
MISSING = object()

# (the heading's command, the settings module (first that imports), the parser path under `gpupack`)
SERVICES = [
    ("gpupack webhook serve", ("webhook.settings",), ("webhook", "serve")),
    ("gpupack extender serve", ("extender.settings", "extender.config"), ("extender", "serve")),
    ("gpupack agent run", ("agent.settings",), ("agent", "run")),
]


@dataclasses.dataclass(frozen=True)
class Row:
    cells: tuple[str, ...]
    where: str  # file:line, for the failure message


@dataclasses.dataclass(frozen=True)
class Table:
    heading: str  # the last heading line above it
    header: tuple[str, ...]
    rows: list[Row]


def tables(path: Path) -> Iterator[Table]:
    """Every markdown table of `path`, with the heading it sits under."""
    heading, block = "", []
    for i, line in enumerate([*path.read_text().splitlines(), ""], 1):
        if line.startswith("|"):
            cells = tuple(c.strip() for c in line.strip().strip("|").split(" | "))
            block.append(Row(cells, f"{path.relative_to(REPO)}:{i}"))
            continue
        if block:
            yield Table(heading, block[0].cells, block[2:])  # past the header and its |---| rule
            block = []
        if line.startswith("#"):
            heading = line.strip()


def ticked(cell: str) -> list[str]:
    """The `code` spans of a cell, in order."""
    return re.findall(r"`([^`]*)`", cell)


def value_at(key: str) -> Any:
    node: Any = VALUES
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def subparser(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}


def settings_class(modules: tuple[str, ...]) -> tuple[type[Any], dict[str, str]]:
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        return module.Settings, dict(getattr(module, "FLAGS", {}))
    raise AssertionError(f"none of {modules} imports")


def field_default(field: dataclasses.Field[Any]) -> Any:
    """The field's fixed default; MISSING when it is required or computed at start (the extender's
    identity), which the docs then describe in words."""
    return MISSING if field.default is dataclasses.MISSING else field.default


def field_for(
    flag: str, action: argparse.Action, fields: dict[str, dataclasses.Field[Any]], flags: dict[str, str]
) -> dataclasses.Field[Any] | None:
    by_flag = [f for name, f in fields.items() if flag_of(name, flags) == flag]
    return by_flag[0] if by_flag else fields.get(action.dest)


def converted(action: argparse.Action, text: str) -> Any:
    return action.type(text) if callable(action.type) else text


def template_flags() -> dict[str, str]:
    """flag → chart value for every `--flag` a template passes from `.Values` (direct, `with` or `if`)."""
    found: dict[str, str] = {}
    for tpl in sorted((CHART / "templates").glob("*.yaml")):
        gate = ""
        for line in tpl.read_text().splitlines():
            direct = re.search(r"- (--[a-z0-9-]+)=\{\{ \.Values\.([\w.]+) \}\}", line)
            passed = re.search(r"- (--[a-z0-9-]+)", line)
            if direct:
                found.setdefault(f"{tpl.stem}:{direct[1]}", direct[2])
            elif passed and gate:
                found.setdefault(f"{tpl.stem}:{passed[1]}", gate)
            opened = re.search(r"\{\{-? (?:with|if) \.Values\.([\w.]+) \}\}", line)
            gate = opened[1] if opened else ""
    return found


TEMPLATE_OF = {
    "gpupack webhook serve": "webhook",
    "gpupack extender serve": "extender",
    "gpupack agent run": "agent",
}


def parser_problems(flag: str, action: argparse.Action, field: str, default: Any) -> list[str]:
    """The parser and the settings agree: a flag's own default is unset (None) or the settings default."""
    if action.nargs == 0:  # a switch: absent means its default
        wrong = action.default != default
        parsed = action.default
    else:
        is_text = isinstance(action.default, str)
        parsed = converted(action, action.default) if is_text else action.default
        wrong = parsed is not None and default is not MISSING and parsed != default
    return [f"{flag} defaults to {parsed!r} in its parser, Settings.{field} to {default!r}"] if wrong else []


def default_problems(flag: str, action: argparse.Action, field: str, default: Any, cell: str) -> list[str]:
    """The docs' default column: `value` the flag accepts, 'unset …' for none, 'not set …' for a switch."""
    if action.nargs == 0:
        ok = cell.startswith("not set")
    elif default is None or default is MISSING:
        ok = cell.startswith("unset")
    else:
        shown = ticked(cell)
        ok = bool(shown) and converted(action, shown[0]) == default
    return [] if ok else [f"docs say {flag} defaults to {cell!r}, Settings.{field} is {default!r}"]


def chart_problems(chart_cell: str, chart_default_cell: str) -> list[str]:
    """The chart columns: the value named exists in values.yaml with the default the docs show."""
    keys = ticked(chart_cell)
    if not keys:
        return []
    actual, shown = value_at(keys[0]), ticked(chart_default_cell)
    if actual is MISSING:
        return [f"values.yaml has no {keys[0]}"]
    if not shown or yaml.safe_load(shown[0]) != actual:
        return [f"docs say {keys[0]} defaults to {chart_default_cell!r}, values.yaml {actual!r}"]
    return []


@pytest.mark.parametrize(("command", "modules", "path"), SERVICES, ids=[s[0] for s in SERVICES])
def test_settings_table_matches_the_service(
    command: str, modules: tuple[str, ...], path: tuple[str, ...]
) -> None:
    cls, flags = settings_class(modules)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    parser_options = options(subparser(*path))
    found = [t.rows for t in tables(SETTINGS_DOC) if t.heading == f"## `{command}`"]
    assert found, f"{SETTINGS_DOC.name} has no table under ## `{command}`"
    rows = found[0]
    problems: list[str] = []
    chart_of: dict[str, list[str]] = {}
    for row in rows:
        flag_cell, default_cell, chart_cell, chart_default_cell, _meaning = row.cells
        (flag,) = ticked(flag_cell)
        chart_of[flag] = ticked(chart_cell)
        action = parser_options.get(flag)
        field = None if action is None else field_for(flag, action, fields, flags)
        if action is None or field is None:
            problems.append(
                f"{row.where}: {flag} is no flag of `{command}` setting a {cls.__module__}.Settings field"
            )
            continue
        default = field_default(field)
        found = parser_problems(flag, action, field.name, default)
        found += default_problems(flag, action, field.name, default, default_cell)
        found += chart_problems(chart_cell, chart_default_cell)
        problems += [f"{row.where}: {p}" for p in found]
    problems += [
        f"{SETTINGS_DOC.name}: `{command}` {f} has no row"
        for f in sorted(set(parser_options) - set(chart_of))
    ]
    # Every chart value a template passes to one of this service's flags is named in that flag's row.
    for key, value in template_flags().items():
        tpl, flag = key.split(":")
        if tpl == TEMPLATE_OF[command] and value not in chart_of.get(flag, []):
            problems.append(f"templates/{tpl}.yaml passes .Values.{value} to {flag}: not in the docs' row")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", VALUES_TABLES, ids=[p.name for p in VALUES_TABLES])
def test_chart_values_tables_match_values_yaml(path: Path) -> None:
    found = [t for t in tables(path) if t.header[:2] == ("value", "default")]
    assert found, f"{path.relative_to(REPO)} has no `| value | default |` table"
    problems = []
    for row in (r for t in found for r in t.rows):
        keys, shown = ticked(row.cells[0]), ticked(row.cells[1])
        if len(shown) < len(keys):
            problems.append(f"{row.where}: {len(keys)} values but {len(shown)} defaults in `code`")
            continue
        for key, text in zip(keys, shown, strict=False):
            actual = value_at(key)
            if actual is MISSING:
                problems.append(f"{row.where}: values.yaml has no {key}")
            elif yaml.safe_load(text) != actual:
                problems.append(f"{row.where}: docs say {key} defaults to {text!r}, values.yaml {actual!r}")
    assert not problems, "\n".join(problems)
