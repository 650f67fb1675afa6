"""Detecting whether the NVIDIA container toolkit honours NVIDIA_VISIBLE_DEVICES."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.runtime import toolkit


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (None, "unknown"),
        ("", "allowed"),  # the toolkit's default is to accept the env var
        ("accept-nvidia-visible-devices-envvar-when-unprivileged = true\n", "allowed"),
        ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", "disabled"),
        (
            "disable-require = false\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
            '[nvidia-container-runtime]\nmode = "cdi"\n',
            "disabled",
        ),
        ("this is [not toml", "unknown"),
    ],
)
def test_env_selection(text: str | None, want: str) -> None:
    assert toolkit.env_selection(text) == want


def test_read_missing_file_is_unknown(tmp_path: Path) -> None:
    assert toolkit.read(tmp_path / "config.toml") == "unknown"
    assert toolkit.read(None) == "unknown"
