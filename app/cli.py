"""The `gpupack` command. Each subcommand lives in its own module, which registers itself here."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

# Each module exposes `register(subparsers) -> None`, adding one or more subcommands whose
# parsers carry `func=<callable(args) -> int>` via set_defaults.
COMMAND_MODULES: tuple[str, ...] = (
    "app.sim.command",
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
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
