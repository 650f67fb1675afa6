"""Deadline-bounded polling: the one way the harness and the tests wait for something."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """A condition did not hold before its deadline (an AssertionError so pytest reports it as a failure)."""


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.2,
) -> T:
    """Call `condition` until it returns something truthy and return that; WaitTimeoutError after `timeout` s.

    Exceptions from `condition` propagate: a condition that can fail transiently should catch what it expects.
    The last falsy value is named in the error so a timeout says what was seen, not just that it was slow.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
