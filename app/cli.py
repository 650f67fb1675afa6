"""The `gpupack` command. Subcommands come from package entry points, so the CLI imports no service.

Each entry point in the `gpupack.commands` group (pyproject `[project.entry-points."gpupack.commands"]`)
names a `register(subparsers)` function that adds one or more subcommands whose parsers carry
`func=<callable(args) -> int>` via set_defaults; an entry point registers the subcommand it is named
after (and may add others), so `gpupack NAME ...` loads only that one. A service lists itself there;
the import contracts (`lint-imports`) see every arrow because nothing is loaded from a string of ours.

`gpupack dev` comes from the development harness (tests/devcluster), which a source checkout has and the
wheel and the image do not: where the module an entry point names is absent, its subcommand stays listed
and says so instead of the CLI failing on start-up.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

ENTRY_POINT_GROUP = "gpupack.commands"

Handler = Callable[[argparse.Namespace], int]


def command_entry_points() -> list[EntryPoint]:
    """The installed `gpupack.commands` entry points, in name order (a stable `gpupack --help`)."""
    found = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)
    if not found:
        raise RuntimeError(
            f"no {ENTRY_POINT_GROUP!r} entry points installed: install gpupack (pip install -e .) "
            "so its package metadata lists the subcommands"
        )
    return found


def build_parser(commands: Sequence[EntryPoint] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupack", description="Fractional-GPU scheduling for Kubernetes.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for ep in command_entry_points() if commands is None else commands:
        register = load(ep)
        if register is None:  # listed in `gpupack --help`; running it is answered by main()
            absent = sub.add_parser(ep.name, help="(source checkout only) not part of this install")
            absent.set_defaults(func=lambda _args, ep=ep: _say_absent(ep))
        else:
            register(sub)
    return parser


def load(ep: EntryPoint) -> Callable[[Any], None] | None:
    """The entry point's `register`, or None when this install lacks the module it names.

    A module that is there but imports one that is not still fails: that is a broken install.
    """
    try:
        register: Callable[[Any], None] = ep.load()
    except ModuleNotFoundError as exc:
        if exc.name is None or not (ep.module == exc.name or ep.module.startswith(exc.name + ".")):
            raise
        return None
    return register


def _say_absent(ep: EntryPoint) -> int:
    print(
        f"gpupack {ep.name}: not part of this install (its module {ep.module} is absent). It ships only "
        "with a source checkout of gpupack, outside the wheel and the image: run it from a clone "
        "(`make dev` installs the checkout and starts the local cluster).",
        file=sys.stderr,
    )
    return 2


def commands_for(argv: Sequence[str]) -> list[EntryPoint]:
    """The entry point named like the subcommand when there is one, else all (`--help`, `certs`).

    Loading one keeps the others' imports (the Kubernetes client, the dev cluster: 0.3 s) off every
    command's start-up.
    """
    found = command_entry_points()
    return [ep for ep in found if argv and ep.name == argv[0]] or found


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = commands_for(argv)
    named = [ep for ep in commands if argv and ep.name == argv[0]]
    if named and load(named[0]) is None:  # before parsing: its flags belong to a parser we do not have
        return _say_absent(named[0])
    args = build_parser(commands).parse_args(argv)
    func: Handler = args.func
    try:
        return func(args)
    except BrokenPipeError:
        # `gpupack top | head`: the reader left; exit quietly like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
