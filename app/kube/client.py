"""The only module that talks to the Kubernetes API (through the `kubernetes` client's ApiClient).

Callers build requests as plain (method, path, body) values elsewhere and send them here; every
failure comes back as one `KubeError(code, reason, message)` carrying the API's own Status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from app.errors import KubeError

JsonDict = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True, slots=True)
class Request:
    """One API call, built by pure code and sent by `Kube.send`."""

    method: str
    path: str
    body: Any = None
    query: Mapping[str, str | int | bool] = field(default_factory=dict)
    content_type: str = "application/json"


class Kube:
    """A thin synchronous client: send a Request, get the decoded JSON (or a KubeError)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, timeout_s: float = 30.0) -> None:
        self._api = api_client
        self._timeout_s = timeout_s

    @classmethod
    def connect(cls, kubeconfig: str | None = None, timeout_s: float = 30.0) -> Kube:
        """From a kubeconfig file, else the in-cluster service account, else ~/.kube/config."""
        config = kubernetes.client.Configuration()
        if kubeconfig:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
        else:
            try:
                kubernetes.config.load_incluster_config(client_configuration=config)
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config(client_configuration=config)
        return cls(kubernetes.client.ApiClient(config), timeout_s)

    def send(self, req: Request) -> JsonDict:
        resp = self._call(req.method, req.path, req.body, req.query, req.content_type, self._timeout_s)
        data = resp.data
        return json.loads(data) if data else {}

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300
    ) -> Iterator[JsonDict]:
        """Yield watch events ({"type", "object"}) until the server closes the stream.

        An ERROR event carrying a Status is raised as KubeError (410 = resourceVersion too old: relist).
        """
        q = dict(query)
        q.update({"watch": "true", "timeoutSeconds": timeout_s, "allowWatchBookmarks": "true"})
        resp = self._call("GET", path, None, q, "application/json", timeout_s + 10)
        try:
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object", {})
                    raise KubeError(
                        int(status.get("code", 500)), status.get("reason", ""), status.get("message", "")
                    )
                yield event
        finally:
            resp.release_conn()

    def _call(  # noqa: PLR0917 (private; the two callers pass every part of a request)
        self,
        method: str,
        path: str,
        body: Any,
        query: Mapping[str, str | int | bool],
        content_type: str,
        timeout_s: float,
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
                _request_timeout=timeout_s,
            )
        except ApiException as exc:
            raise _to_kube_error(exc) from None
        except (OSError, kubernetes.client.exceptions.OpenApiException) as exc:
            raise KubeError(0, "Unreachable", str(exc)) from None

    def close(self) -> None:
        self._api.close()


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
