"""A server SSLContext whose certificate (and client CA) follow their files: rotation needs no restart.

Used by the webhook (server certificate only) and the extender (server certificate plus a required
client certificate signed by `client_ca`: mutual TLS with kube-scheduler).

How: the context handed to uvicorn has an SNI callback. OpenSSL calls it on every new connection's
ClientHello, with or without an SNI name (the apiserver sends none for an IP URL). The callback
re-reads the files when their stat changed (at most once per `check_interval`) and switches the
connection to the newest good context. Established connections keep their session; a bad or
half-written pair is refused and the previous certificate stays in service until a good one appears.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from app.core import log

_log = log.get("gpupack.tls")

Stamp = tuple[tuple[int, int, int], ...]  # (mtime_ns, inode, size) per file
ReloadResult = Callable[[str], None]  # called with "ok" or "failed" after each reload attempt


def _ignore(_result: str) -> None:
    return None


class ReloadingContext:
    """Owns the current serving SSLContext; `context` is the one to give the server."""

    def __init__(
        self,
        certfile: str | os.PathLike[str],
        keyfile: str | os.PathLike[str],
        check_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        client_ca: str | os.PathLike[str] | None = None,
        on_reload: ReloadResult = _ignore,
    ) -> None:
        """`client_ca`: require every client to present a certificate signed by a CA in this PEM file.

        The verify mode comes from the first context of a connection, so it is set on every context
        built here; the CA store and the certificate follow the files like the serving pair does.
        """
        self._cert, self._key = Path(certfile), Path(keyfile)
        self._client_ca = Path(client_ca) if client_ca is not None else None
        self._on_reload = on_reload
        self._interval = check_interval
        self._clock = clock
        self._stamp = self._stat()
        self._current = self._build()  # a bad pair at start-up is fatal: raise to the caller
        self._next_check = clock() + check_interval
        self.context = self._build()
        self.context.sni_callback = self._on_client_hello
        self.reloads = 0

    def _stat(self) -> Stamp:
        # inode catches an atomic replace (and a Secret volume's symlink swap) within one mtime tick.
        out = []
        for path in self._files():
            st = path.stat()
            out.append((st.st_mtime_ns, st.st_ino, st.st_size))
        return tuple(out)

    def _files(self) -> tuple[Path, ...]:
        return (
            (self._cert, self._key) if self._client_ca is None else (self._cert, self._key, self._client_ca)
        )

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        ctx.load_cert_chain(self._cert, self._key)
        if self._client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED  # no certificate, or one from another CA: handshake fails
            ctx.load_verify_locations(cafile=self._client_ca)
        return ctx

    def _on_client_hello(
        self, conn: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        self.maybe_reload()
        conn.context = self._current

    def maybe_reload(self) -> bool:
        """Load the files again if they changed since the last good load; True when a new cert is live."""
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + self._interval
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return False
            fresh = self._build()
        except (OSError, ssl.SSLError) as err:
            # Typically a rotation caught between writing the key and the cert: keep serving, retry later.
            self._on_reload("failed")
            _log.warning(
                "serving certificate reload failed", extra={"cert": str(self._cert), "error": str(err)}
            )
            return False
        self._current, self._stamp = fresh, stamp
        self.reloads += 1
        self._on_reload("ok")
        _log.info("serving certificate reloaded", extra={"cert": str(self._cert)})
        return True
