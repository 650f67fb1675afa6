"""`python -m tests.devcluster up|down|status`: `gpupack dev ...` without the other subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupack")
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["dev", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
