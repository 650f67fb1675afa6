"""Structured logging: one JSON object per line, with extra fields passed as keyword arguments."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import pydantic_core

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
        fields = record.__dict__.get(_FIELDS)
        if fields is not None and not record.exc_info:  # a line of `info`: its fields are known, and plain
            out.update(fields)
            # pydantic's Rust encoder: the same JSON values (compact) at a fifth of the CPU; `info` is for
            # lines logged on every request, whose fields are strings, numbers, bools and lists of them.
            return pydantic_core.to_json(out, ensure_ascii=True, fallback=str).decode()
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
    """`logger.info(msg, extra=fields)` for a line logged on every request (the webhook's one per review):
    without looking up the caller's file and line, which the JSON lines never show, and with `fields` kept
    as one value beside the record's attributes, so the JSON formatter takes them without a pass over the
    record. `fields` are strings, numbers, bools, None and lists of them."""
    if logger.isEnabledFor(logging.INFO):
        if clash := fields.keys() & _RESERVED:
            raise KeyError(f"log fields {sorted(clash)} would overwrite the record's own attributes")
        record = logging.getLogRecordFactory()(logger.name, logging.INFO, "(unknown file)", 0, msg, (), None)
        record.__dict__.update(fields)
        record.__dict__[_FIELDS] = fields
        logger.handle(record)


_FIELDS = "_json_fields"  # a private attribute: the formatter's pass over the record's attributes skips it
