"""Structured logging: one JSON object per line, with extra fields passed as keyword arguments."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

# json.dumps(out, default=str) builds an encoder per call; one, made once, writes the same text.
_ENCODER = json.JSONEncoder(default=str)
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        # The whole second last formatted and its text, as one value (a busy service logs many lines a
        # second; one assignment, so a second and another second's text are never paired).
        self._second: tuple[int, str] = (-1, "")

    def format(self, record: logging.LogRecord) -> str:
        second, text = self._second
        if int(record.created) != second:
            second = int(record.created)
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        out: dict[str, Any] = {
            "ts": f"{text}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _ENCODER.encode(out)


def setup(level: str = "info") -> None:
    """Route every logger (ours, uvicorn's, the kubernetes client's) to JSON lines on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers[:] = []
        lg.propagate = True


def get(name: str) -> logging.Logger:
    return logging.getLogger(name)


def info(logger: logging.Logger, msg: str, fields: dict[str, Any]) -> None:
    """`logger.info(msg, extra=fields)` without looking up the caller's file and line, which the JSON lines
    never show: for a line logged on every request (the webhook's one per review)."""
    if logger.isEnabledFor(logging.INFO):
        logger.handle(
            logger.makeRecord(logger.name, logging.INFO, "(unknown file)", 0, msg, (), None, extra=fields)
        )
