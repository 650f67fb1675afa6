"""Generic list + watch informer: resourceVersion resume, bookmarks, periodic relist, 410 -> relist."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app import log
from app.errors import KubeError
from app.kube import requests
from app.kube.client import JsonDict, Request

LOG = log.get("gpupack.informer")


class KubeApi(Protocol):
    """The part of app.kube.client.Kube an informer uses (tests pass a fake)."""

    def send(self, req: Request) -> JsonDict: ...

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300
    ) -> Iterator[JsonDict]: ...


class Handler(Protocol):
    """Receives the informer's view of the objects; called from the informer's thread."""

    def replace(self, objs: list[JsonDict]) -> None: ...

    def upsert(self, obj: JsonDict) -> None: ...

    def delete(self, obj: JsonDict) -> None: ...


@dataclass(frozen=True, slots=True)
class InformerConfig:
    resync_s: float = 600.0  # full relist this often: heals anything a watch silently missed
    watch_timeout_s: int = 300  # server-side timeoutSeconds of one watch call
    page_limit: int = 500
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


def object_key(obj: Mapping[str, Any]) -> str:
    """namespace/name, or name for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


class Informer:
    """Keeps `handler` in step with one collection; run `run(stop)` in a thread."""

    def __init__(
        self,
        kube: KubeApi,
        path: str,
        handler: Handler,
        *,
        name: str,
        label_selector: str = "",
        config: InformerConfig | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.path = path
        self.handler = handler
        self.name = name
        self.label_selector = label_selector
        self.config = config or InformerConfig()
        self._stop = threading.Event()
        self._sleep = sleep or (lambda s: self._stop.wait(s) and None)
        self._clock = clock
        self.resource_version = ""
        self.synced = threading.Event()  # set after the first complete list
        self.last_list_at: float | None = None  # clock() when the last full list completed
        self.lists = 0
        self.healthy = False  # last list/watch call succeeded
        self._relist = True
        self._backoff = self.config.backoff_initial_s

    # --- control ---

    def request_relist(self) -> None:
        """Relist at the next opportunity (e.g. on becoming leader, to rebuild from the API)."""
        self._relist = True

    def stop(self) -> None:
        self._stop.set()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        t.start()
        return t

    def run(self) -> None:
        while not self._stop.is_set():
            self.step()

    # --- one iteration, separately callable by tests ---

    def step(self) -> None:
        """List if needed, else watch until the stream ends; on failure back off (410: relist at once)."""
        try:
            if self._relist or self._resync_due():
                self.list_all()
            else:
                self.watch_once()
            self._backoff = self.config.backoff_initial_s
            self.healthy = True
        except KubeError as exc:
            if exc.is_gone:
                LOG.info(
                    "watch expired, relisting", extra={"informer": self.name, "rv": self.resource_version}
                )
                self._relist = True
                return
            self.healthy = False
            LOG.warning(
                "list/watch failed",
                extra={"informer": self.name, "code": exc.code, "reason": exc.reason, "error": exc.message},
            )
            self._sleep(self._backoff)
            self._backoff = min(self._backoff * 2, self.config.backoff_max_s)

    def _resync_due(self) -> bool:
        return self.last_list_at is None or self._clock() - self.last_list_at >= self.config.resync_s

    def list_all(self) -> None:
        """Fetch every page, then hand the complete set to the handler at once."""
        items: list[JsonDict] = []
        token = ""
        rv = ""
        while True:
            req = requests.list_request(self.path, self.label_selector, self.config.page_limit, token)
            page = self.kube.send(req)
            items.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            rv = str(meta.get("resourceVersion", ""))
            token = str(meta.get("continue") or "")
            if not token:
                break
        self.handler.replace(items)
        self.resource_version = rv
        self._relist = False
        self.last_list_at = self._clock()
        self.lists += 1
        self.synced.set()
        LOG.info("listed", extra={"informer": self.name, "objects": len(items), "rv": rv})

    def watch_once(self) -> None:
        """Follow one watch call from the last resourceVersion until it ends or a relist is due."""
        assert self.last_list_at is not None
        remaining = self.config.resync_s - (self._clock() - self.last_list_at)
        timeout = max(1, min(self.config.watch_timeout_s, int(remaining)))
        query = requests.watch_query(self.label_selector, self.resource_version)
        for event in self.kube.watch(self.path, query, timeout):
            kind = event.get("type")
            obj = event.get("object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind in ("ADDED", "MODIFIED"):
                self.handler.upsert(obj)
            elif kind == "DELETED":
                self.handler.delete(obj)
            elif kind != "BOOKMARK":
                continue  # unknown types carry nothing we can apply
            if rv:
                self.resource_version = str(rv)
            if self._stop.is_set() or self._relist:
                return
