"""The `gpupack` command. Subcommands come from package entry points, so the CLI imports no service.

Each entry point in the `gpupack.commands` group (pyproject `[project.entry-points."gpupack.commands"]`)
names a `register(subparsers)` function that adds one or more subcommands whose parsers carry
`func=<callable(args) -> int>` via set_defaults; an entry point registers the subcommand it is named
after (and may add others), so `gpupack NAME ...` loads only that one. A service lists itself there;
the import contracts (`lint-imports`) see every arrow because nothing is loaded from a string of ours.
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
        register: Callable[[Any], None] = ep.load()
        register(sub)
    return parser


def commands_for(argv: Sequence[str]) -> list[EntryPoint]:
    """The entry point named like the subcommand when there is one, else all (`--help`, `certs`).

    Loading one keeps the others' imports (the Kubernetes client, the services: 0.3 s) off every
    command's start-up.
    """
    found = command_entry_points()
    return [ep for ep in found if argv and ep.name == argv[0]] or found


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(commands_for(argv)).parse_args(argv)
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
