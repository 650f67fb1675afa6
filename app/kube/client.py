"""The only module that talks to the Kubernetes API (through the `kubernetes` client's ApiClient).

Callers build calls as plain `app.kube.calls.Request` values (pure) and send them here; every
failure comes back as one `KubeError(code, reason, message)`: the API's own Status for an HTTP error,
code 0 with reason "Unreachable", "Timeout" or "BadResponse" for a transport failure (refused or reset
connection, TLS error, read timeout, a watch stream cut mid-way, a line that is not JSON). Every call
carries a (connect, read) timeout and urllib3 does not retry on its own, so no call blocks for longer
than those timeouts and the caller's retry policy is the only one.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from app.core.errors import KubeError
from app.core.objects import read_json
from app.kube.calls import JsonDict, Request, read_reply


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. The kubernetes client honours only an int or a (connect, read) tuple, never a float."""

    connect_s: float = 5.0  # TCP + TLS handshake
    read_s: float = 30.0  # longest silence while waiting for (part of) a reply
    watch_margin_s: float = 5.0  # a watch may be silent this much longer than its timeoutSeconds

    def call(self) -> tuple[float, float]:
        return (self.connect_s, self.read_s)

    def watch(self, server_timeout_s: int) -> tuple[float, float]:
        """The server closes a watch after timeoutSeconds; silence beyond that means a frozen stream."""
        return (self.connect_s, server_timeout_s + self.watch_margin_s)


# Everything below HTTP status level: urllib3 (MaxRetryError, ProtocolError, ReadTimeoutError, ...),
# http.client (IncompleteRead, RemoteDisconnected), socket and TLS errors (OSError, ssl.SSLError), and
# the client's own OpenApiException. A programming error (TypeError, ...) stays what it is.
TRANSPORT_ERRORS = (
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,
    kubernetes.client.exceptions.OpenApiException,
)


class Kube:
    """A thin synchronous client: send a Request, get the decoded JSON (or a KubeError)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, timeouts: Timeouts | None = None) -> None:
        self._api = api_client
        self.timeouts = timeouts or Timeouts()

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, timeouts: Timeouts | None = None, connections: int | None = None
    ) -> Kube:
        """From a kubeconfig file, else the in-cluster service account, else ~/.kube/config.

        `connections`: the most calls the caller makes at once (the client keeps that many connections;
        its default, 5 per CPU, makes a busier caller open and drop one per call, with a warning each).
        """
        config = kubernetes.client.Configuration()
        if kubeconfig:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
        else:
            try:
                kubernetes.config.load_incluster_config(client_configuration=config)
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config(client_configuration=config)
        if connections is not None:
            config.connection_pool_maxsize = connections
        return cls.from_configuration(config, timeouts)

    @classmethod
    def from_configuration(
        cls, config: kubernetes.client.Configuration, timeouts: Timeouts | None = None
    ) -> Kube:
        # urllib3 would otherwise retry refused connections and (for GETs) read timeouts 3 times
        # behind our back, multiplying every timeout by 4; callers own the retry policy.
        config.retries = urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0, other=0)
        return cls(kubernetes.client.ApiClient(config), timeouts)

    def send(self, req: Request) -> JsonDict:
        resp = self._call(req.method, req.path, req.body, req.query, req.content_type, self.timeouts.call())
        try:
            data = resp.data
        except TRANSPORT_ERRORS as exc:
            raise transport_error(exc) from None
        finally:
            resp.release_conn()
        try:
            out = read_reply(req, data) if data else {}
        except ValueError as exc:
            raise KubeError(0, "BadResponse", f"{req.method} {req.path}: reply is not JSON: {exc}") from None
        if not isinstance(out, dict):
            raise KubeError(0, "BadResponse", f"{req.method} {req.path}: reply is not a JSON object")
        return out

    def text(self, path: str, query: Mapping[str, str | int | bool] | None = None) -> str:
        """GET a plain-text resource (a pod's log through the apiserver and the kubelet), decoded as UTF-8."""
        resp = self._call("GET", path, None, query or {}, "application/json", self.timeouts.call())
        try:
            data: bytes = resp.data
        except TRANSPORT_ERRORS as exc:
            raise transport_error(exc) from None
        finally:
            resp.release_conn()
        return data.decode("utf-8", "replace")

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300
    ) -> Iterator[JsonDict]:
        """Yield watch events ({"type", "object"}) until the server closes the stream.

        An ERROR event carrying a Status is raised as KubeError (410 = resourceVersion too old: relist).
        A stream that breaks, stays silent past `timeout_s` + the margin, ends inside an event or
        carries a line that is not a JSON event raises KubeError with code 0.
        """
        q = dict(query)
        q.update({"watch": "true", "timeoutSeconds": timeout_s, "allowWatchBookmarks": "true"})
        resp = self._call("GET", path, None, q, "application/json", self.timeouts.watch(timeout_s))
        try:
            for line in _lines(resp, path):
                yield _event(line, path)
        finally:
            resp.close()  # a watch left early still has a stream open: never hand it back to the pool
            resp.release_conn()

    def _call(  # noqa: PLR0917 (private; the two callers pass every part of a request)
        self,
        method: str,
        path: str,
        body: Any,
        query: Mapping[str, str | int | bool],
        content_type: str,
        timeout: tuple[float, float],
    ) -> Any:
        try:
            return self._api.call_api(
                path,
                method,
                query_params=[(k, _query_value(v)) for k, v in query.items()],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=timeout,
            )
        except ApiException as exc:
            raise _to_kube_error(exc) from None
        except TRANSPORT_ERRORS as exc:
            raise transport_error(exc) from None

    def close(self) -> None:
        self._api.close()


def api_client(kubeconfig: str | os.PathLike[str]) -> kubernetes.client.ApiClient:
    """The `kubernetes` ApiClient of a kubeconfig file, for harnesses that hand it on (`Kube(api)` sends).

    The dev cluster gives it to tests and benchmarks, which may use the library's typed APIs on it.
    """
    return kubernetes.config.new_client_from_config(config_file=str(kubeconfig))


SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def current_namespace(kubeconfig: str | None = None) -> str:
    """The namespace `kubectl` would use: the kubeconfig's current context's (`kubeconfig`, else $KUBECONFIG
    or ~/.kube/config), else the pod's own in a cluster, else "default"."""
    try:
        _, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError):
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
                return f.read().strip() or "default"
        except OSError:
            return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")


_TIMEOUTS = (urllib3.exceptions.TimeoutError, socket.timeout, TimeoutError)


def transport_error(exc: BaseException) -> KubeError:
    """Any failure below HTTP status level as KubeError(0, "Timeout" | "Unreachable", what happened)."""
    cause: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        cause = exc.reason
    reason = "Timeout" if isinstance(cause, _TIMEOUTS) else "Unreachable"
    # urllib3's NewConnectionError (refused, no route) subclasses its ConnectTimeoutError.
    if isinstance(cause, (urllib3.exceptions.NewConnectionError, ssl.SSLError, urllib3.exceptions.SSLError)):
        reason = "Unreachable"
    detail = str(cause) or type(cause).__name__
    return KubeError(0, reason, f"{type(cause).__name__}: {detail}")


def _lines(resp: Any, path: str) -> Iterator[str]:
    """Newline-separated lines of a chunked watch reply; a transport failure becomes a KubeError."""
    buffer = b""
    stream = resp.stream(amt=None, decode_content=False)
    while True:
        try:
            chunk = next(stream, None)
        except TRANSPORT_ERRORS as exc:
            raise transport_error(exc) from None
        if chunk is None:
            break
        buffer += chunk
        *done, buffer = buffer.split(b"\n")
        for raw in done:
            if raw.strip():
                yield raw.decode("utf-8", errors="replace")
    if buffer.strip():
        raise KubeError(0, "Unreachable", f"watch {path}: stream ended inside an event ({len(buffer)} bytes)")


def _event(line: str, path: str) -> JsonDict:
    try:
        event = read_json(line)
    except ValueError:
        raise KubeError(0, "BadResponse", f"watch {path}: line is not JSON: {line[:200]!r}") from None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise KubeError(0, "BadResponse", f"watch {path}: not a watch event: {line[:200]!r}")
    if event.get("type") == "ERROR":
        status = event["object"]
        raise KubeError(int(status.get("code") or 500), status.get("reason", ""), status.get("message", ""))
    return event


def _query_value(v: str | int | bool) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _to_kube_error(exc: ApiException) -> KubeError:
    reason, message = exc.reason or "", ""
    try:
        status = json.loads(exc.body or "{}")
        reason = status.get("reason", reason)
        message = status.get("message", "")
    except (ValueError, TypeError):
        message = str(exc.body or "")
    return KubeError(int(exc.status or 0), reason, message)
