"""A service's JSON log line carries the record's own time, whatever order records from several threads
reach the formatter in (the formatter keeps the last second's text)."""

from __future__ import annotations

import json
import logging
import time

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
