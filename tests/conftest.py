"""Shared pytest options: `--update-golden` rewrites golden files instead of comparing against them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/**/*.output.json from the current code (review the diff!)",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def golden(update_golden: bool) -> Callable[[Path, Any], None]:
    """`golden(file, actual)`: compare `actual` with the JSON in `file` (rewrite it with --update-golden)."""

    def check(expected_file: Path, actual: Any) -> None:
        if update_golden:
            expected_file.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n")
            pytest.skip("golden file rewritten")
        assert expected_file.exists(), (
            f"{expected_file.name} missing: run pytest --update-golden and review it"
        )
        assert actual == json.loads(expected_file.read_text())

    return check
