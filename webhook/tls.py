"""The webhook's serving SSLContext: app.tls.ReloadingContext, counting reloads in its own metric."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from app import tls
from webhook.metrics import WEBHOOK_CERT_RELOADS


def _count(result: str) -> None:
    WEBHOOK_CERT_RELOADS.labels(result).inc()


class ReloadingContext(tls.ReloadingContext):
    """A server certificate that follows its files; see app.tls."""

    def __init__(
        self,
        certfile: str | os.PathLike[str],
        keyfile: str | os.PathLike[str],
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(certfile, keyfile, check_interval, clock, on_reload=_count)
