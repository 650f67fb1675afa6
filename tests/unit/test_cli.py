"""The `gpupack` command finds its subcommands through the `gpupack.commands` entry points."""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from app import cli


def _choices(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_installed_entry_points_give_every_subcommand() -> None:
    assert _choices(cli.build_parser()) == {
        "agent", "certs", "explain", "extender", "repack", "simulate", "top", "webhook",
    }  # fmt: skip


def test_every_subcommand_is_the_products_own() -> None:
    # The local cluster is the development harness's (`make dev`, `python -m tests.devcluster`): the wheel
    # and the image lack tests/, so no subcommand may come from there.
    assert not [ep.value for ep in cli.command_entry_points() if ep.module.startswith("tests")]


def test_entry_points_come_in_name_order_and_name_a_register_function() -> None:
    eps = cli.command_entry_points()
    assert [ep.name for ep in eps] == sorted(ep.name for ep in eps)
    assert all(ep.value.endswith(":register") for ep in eps)


def test_the_parser_holds_only_the_commands_it_is_given() -> None:
    only_top = [EntryPoint(name="top", value="app.tools.top:register", group=cli.ENTRY_POINT_GROUP)]
    parser = cli.build_parser(only_top)
    assert _choices(parser) == {"top"}
    with pytest.raises(SystemExit):
        parser.parse_args(["extender", "serve"])


def test_main_runs_the_subcommand_an_entry_point_registered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["simulate", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: gpupack simulate")


def test_each_entry_point_registers_the_subcommand_it_is_named_after() -> None:
    for ep in cli.command_entry_points():
        assert ep.name in _choices(cli.build_parser([ep])), ep.value


def test_a_named_subcommand_loads_only_its_entry_point_and_others_load_all() -> None:
    assert [ep.name for ep in cli.commands_for(["simulate", "--seeds", "1"])] == ["simulate"]
    every = [ep.name for ep in cli.command_entry_points()]
    assert [ep.name for ep in cli.commands_for(["certs"])] == every  # webhook's second subcommand
    assert [ep.name for ep in cli.commands_for([])] == every


def test_a_command_whose_dependency_is_missing_fails_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command's own module is there but imports something absent: a broken install, not hidden.
    (tmp_path / "brokencmd.py").write_text("import no_such_dependency\n\ndef register(sub): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = EntryPoint(name="broken", value="brokencmd:register", group=cli.ENTRY_POINT_GROUP)
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"):
        cli.build_parser([broken])
