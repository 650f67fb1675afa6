"""Waiting for a server the tests started (the webhook) to answer its health probe over HTTPS."""

from __future__ import annotations

import http.client
from collections.abc import Callable

from tests.devcluster import wait_for


def wait_until_healthy(
    connect: Callable[[], http.client.HTTPConnection], what: str, timeout_s: float = 60
) -> None:
    """Until GET /healthz on a fresh connection from `connect` answers 200; a refused or reset connection is
    a server still starting."""

    def healthy() -> bool:
        try:
            conn = connect()
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False

    wait_for(healthy, timeout_s, f"{what} answering /healthz")
