"""`gpupack webhook serve --workers N`: N worker processes answering on one listening socket.

The webhook keeps no state between reviews, so N processes answer exactly like one, up to N times as
many reviews a second on N CPUs. The parent binds the socket, then forks the workers; each builds its own
app, event loop and TLS context after the fork, so each reloads a renewed certificate by itself. The
kernel hands every new connection to whichever worker accepts it first (an idle one, usually); the
apiserver keeps its connections, so a worker serves each of its connections to the end.

Supervision: SIGTERM or SIGINT to the parent is passed to every worker, which finishes its requests and
exits. A worker that dies on its own takes the others down and the parent exits 1, so the kubelet
restarts the container instead of leaving it serving at a fraction of its capacity.

Metrics: prometheus_client's multiprocess mode, in a fresh directory for this parent (`metrics_dir`), so
/metrics, whichever worker answers it, shows the sum over all workers (see webhook.metrics.registry).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType

from app.core import log

_log = log.get("gpupack.webhook")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # passed on to the workers
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus_client when it is first imported


@contextmanager
def metrics_dir() -> Iterator[str]:
    """A fresh, private directory for the workers' metric files, set in the environment; removed after.

    Must be entered before prometheus_client is imported: it picks its value store once, at import.
    """
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prometheus_client was imported before its multiprocess directory was set")
    path = tempfile.mkdtemp(prefix="gpupack-webhook-metrics-")
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def listen(host: str, port: int) -> socket.socket:
    """The socket every worker accepts on (listen() is called by each worker's server)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def run(workers: int, serve: Callable[[], None]) -> int:
    """Fork `workers` processes that each call `serve()`; wait for them. 0 after a requested stop."""
    children: set[int] = set()
    stopping = False

    def stop(_signum: int = signal.SIGTERM, _frame: FrameType | None = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    # The handlers go in before the first fork, and the signals are held while forking, so a SIGTERM during
    # start-up reaches every worker already forked and none is forked after it.
    previous = {sig: signal.signal(sig, stop) for sig in _SIGNALS}
    for _ in range(workers):
        if stopping:
            break
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        pid = os.fork()
        if pid == 0:  # the worker: default handlers until its server installs its own
            code = 0
            try:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
                serve()
            except BaseException:
                _log.exception("webhook worker failed")
                code = 1
            finally:
                os._exit(code)
        children.add(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    _log.info("webhook workers started", extra={"workers": workers, "pids": sorted(children)})
    code = 0
    while children:
        pid, status = os.wait()
        children.discard(pid)
        if not stopping:
            _log.error(
                "webhook worker exited; stopping the others",
                extra={"pid": pid, "exit_code": os.waitstatus_to_exitcode(status)},
            )
            code = 1
            stop()
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    return code
