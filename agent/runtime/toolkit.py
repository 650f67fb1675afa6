"""Detect whether NVIDIA's container toolkit selects GPUs from NVIDIA_VISIBLE_DEVICES (gpupack needs it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ALLOWED = "allowed"
DISABLED = "disabled"
UNKNOWN = "unknown"

# The toolkit's switch; it defaults to true, and GPU Operator CDI/volume-mount setups turn it off.
ENV_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"


def env_selection(config_text: str | None) -> str:
    """From nvidia-container-runtime's config.toml text (None: no file): allowed, disabled or unknown."""
    if config_text is None:
        return UNKNOWN
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError:
        return UNKNOWN
    return DISABLED if config.get(ENV_KEY, True) is False else ALLOWED


def read(path: Path | None) -> str:
    if path is None:
        return UNKNOWN
    try:
        return env_selection(path.read_text())
    except OSError:
        return UNKNOWN
