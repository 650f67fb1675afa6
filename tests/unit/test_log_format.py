"""A service's JSON log line carries the record's own time, whatever order records from several threads
reach the formatter in (the formatter keeps the last second's text)."""

from __future__ import annotations

import io
import json
import logging
import time

import pytest

from app.core import log
from app.core.log import JsonFormatter


def _line(formatter: JsonFormatter, created: float) -> dict[str, object]:
    record = logging.LogRecord("gpupack.test", logging.INFO, __file__, 1, "review", (), None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    record.uid = "u-1"
    out: dict[str, object] = json.loads(formatter.format(record))
    return out


def test_each_line_has_its_records_own_second_and_millisecond_in_any_order() -> None:
    formatter = JsonFormatter()
    for created in (1_700_000_000.25, 1_700_000_000.75, 1_700_000_001.5, 1_699_999_999.125, 1_700_000_000.5):
        want = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(created))) + f".{int(created % 1 * 1000):03d}Z"
        )
        line = _line(formatter, created)
        assert line["ts"] == want
        assert line["level"] == "info" and line["msg"] == "review" and line["uid"] == "u-1"


def test_a_line_of_info_says_what_the_same_extra_fields_say() -> None:
    """The per-request line (`log.info`) and a plain `logger.info(..., extra=...)` write the same JSON."""
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(JsonFormatter())
    logger = logging.Logger("gpupack.test", logging.INFO)  # not registered: no handler but this one
    logger.addHandler(handler)
    fields = {
        "uid": "u-1",
        "pod": "träin-\u2603",  # not ASCII: escaped as json.dumps escapes it
        "dry_run": False,
        "ops": 9,
        "messages": ['a "quoted"\nline'],
        "duration_ms": 0.125,
        "none": None,
    }
    log.info(logger, "review", fields)
    logger.info("review", extra=fields)
    fast, plain = lines.getvalue().splitlines()
    assert fast.isascii()
    got, want = json.loads(fast), json.loads(plain)
    assert got.pop("ts")[:10] == want.pop("ts")[:10]
    assert got == want == {"level": "info", "logger": "gpupack.test", "msg": "review", **fields}


def test_info_refuses_a_field_that_would_overwrite_the_record() -> None:
    with pytest.raises(KeyError, match="msg"):
        log.info(logging.Logger("gpupack.test", logging.INFO), "review", {"msg": "other"})
