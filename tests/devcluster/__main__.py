"""`python -m tests.devcluster up|down|status`: the local cluster (`make dev`, `make down`, `make status`)."""

from __future__ import annotations

import sys

from .command import main

if __name__ == "__main__":
    sys.exit(main())
