"""The `gpupack` command. Each subcommand lives in its own module, which registers itself here."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

# Each module exposes `register(subparsers) -> None`, adding one or more subcommands whose
# parsers carry `func=<callable(args) -> int>` via set_defaults.
COMMAND_MODULES: tuple[str, ...] = (
    "app.sim.command",
    "app.devcluster.command",
    "app.top",
    "app.repack.command",
    "app.explain_command",
    "extender.command",
    "webhook.command",
    "agent.main",
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpupack", description="Fractional-GPU scheduling for Kubernetes.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
