"""Generic list + watch informer: resourceVersion resume, bookmarks, periodic relist, 410 -> relist.

An informer never dies: any failure (a KubeError, or a bug in a handler) is logged and retried with
backoff. It records when its view was last known live (a list completed, a watch event arrived, a
watch ended cleanly) and when its thread last made progress, so the process can report not-ready
when the view may be stale and not-alive when the thread is dead or stuck.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from app.core import log
from app.core.errors import KubeError
from app.core.objects import shaped
from app.kube import calls
from app.kube.calls import JsonDict, Request

LOG = log.get("gpupack.informer")


class KubeApi(Protocol):
    """The part of app.kube.client.Kube an informer uses (tests pass a fake)."""

    def send(self, req: Request) -> JsonDict: ...

    def watch(
        self, path: str, query: Mapping[str, str | int | bool], timeout_s: int = 300
    ) -> Iterator[JsonDict]: ...


class Handler(Protocol):
    """Receives the informer's view of the objects; called from the informer's thread."""

    def listing(self) -> None:
        """A full list starts now: whatever `replace` later lacks was gone by then."""
        ...

    def replace(self, objs: list[JsonDict]) -> None: ...

    def upsert(self, obj: JsonDict) -> None: ...

    def delete(self, obj: JsonDict) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class InformerConfig:
    """The timing of the informers. The three without a default are the extender's settings (its flags
    set them; extender.runtime.informer_config), so their defaults are written there only."""

    resync_s: float  # full relist this often: heals anything a watch silently missed
    # Server-side timeoutSeconds of one watch call. Short, so a healthy but quiet watch still ends
    # (cleanly, proving the view live) well within `live_within_s`; the client's read timeout sits a
    # little above it, so a frozen watch fails instead of hanging.
    watch_timeout_s: int
    live_within_s: float  # the view counts as live this long after it was last proven live
    page_limit: int = 500
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    stuck_after_s: float = 300.0  # no progress for this long: the thread is stuck (liveness fails)

    def validate(self) -> list[str]:
        errors: list[str] = []
        if self.watch_timeout_s < 1:
            errors.append(f"watch_timeout_s={self.watch_timeout_s}: must be >= 1")
        if not self.live_within_s > self.watch_timeout_s:
            errors.append(
                f"live_within_s={self.live_within_s}: must exceed watch_timeout_s={self.watch_timeout_s}"
                " (a quiet watch proves itself live only when it ends)"
            )
        if not self.stuck_after_s > self.live_within_s:
            errors.append(
                f"stuck_after_s={self.stuck_after_s}: must exceed live_within_s={self.live_within_s}"
            )
        return errors


def object_key(obj: Mapping[str, Any]) -> str:
    """namespace/name, or name for cluster-scoped objects."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


class CollectorPause:
    """No cyclic garbage collection while a list is read, in any thread: the collector runs again when the
    last list running ends (if it ran before the first began).

    A list builds every object of its collection at once, and all of them live on. Python's collector
    walks the whole heap again each time the objects that survived since its last full pass grew by a
    quarter: in a sync of 50 000 pods it did so 11 times, about a third of the sync's CPU (measured over
    bench/coldstart.py's pages); paused, it walks the new objects once afterwards. Objects still go as
    soon as nothing refers to them; only garbage in reference cycles waits, for as long as the list takes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lists = 0  # lists running now
        self._resume = False  # the collector ran when the first of them began

    @contextmanager
    def during_list(self) -> Iterator[None]:
        with self._lock:
            if self._lists == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._lists += 1
        try:
            yield
        finally:
            with self._lock:
                self._lists -= 1
                if self._lists == 0 and self._resume:
                    gc.enable()


COLLECTOR_PAUSE = CollectorPause()  # one per process, as the collector is


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
        field_selector: str = "",
        config: InformerConfig,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        shape: type[Any] | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.handler = handler
        # What to keep of each object (a TypedDict, app.core.objects): list pages are read straight into
        # it, watched objects are cut to it. A full list is handed over at once, so without it every
        # listed object would be held whole until the last page.
        self.shape = shape
        self.name = name
        self.label_selector = label_selector
        self.field_selector = field_selector  # e.g. spec.nodeName=<node>: one node's pods
        self.config = config
        self._stop = threading.Event()
        self._sleep = sleep or (lambda s: self._stop.wait(s) and None)
        self._clock = clock
        self.resource_version = ""
        self.synced = threading.Event()  # set after the first complete list
        self.last_list_at: float | None = None  # clock() when the last full list completed
        self.lists = 0
        self.healthy = False  # last list/watch call succeeded
        self.last_live_at: float | None = None  # clock() when the view was last proven live
        self.last_beat_at = clock()  # clock() when the thread last made progress
        self.last_error = ""
        self.failures = 0  # consecutive failed steps
        self.thread: threading.Thread | None = None
        self._relist = True
        self._backoff = self.config.backoff_initial_s

    # --- control ---

    def request_relist(self) -> None:
        """Relist at the next opportunity (e.g. on becoming leader, to rebuild from the API)."""
        self._relist = True

    def stop(self) -> None:
        self._stop.set()

    def start(self) -> threading.Thread:
        self.last_beat_at = self._clock()
        t = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self.thread = t
        t.start()
        return t

    def run(self) -> None:
        while not self._stop.is_set():
            self.step()

    # --- health, read by other threads ---

    def live(self) -> tuple[bool, str]:
        """Whether the view is complete and recent enough to place pods on (readiness)."""
        if not self.synced.is_set():
            return False, f"{self.name} informer has not listed yet" + self._last_error_suffix()
        if self.thread is not None and not self.thread.is_alive() and not self._stop.is_set():
            return False, f"{self.name} informer thread is dead"
        assert self.last_live_at is not None
        age = self._clock() - self.last_live_at
        if age > self.config.live_within_s:
            return False, f"{self.name} informer not live for {age:.0f}s" + self._last_error_suffix()
        return True, "live"

    def alive(self) -> tuple[bool, str]:
        """Whether the thread runs and makes progress (liveness: a restart would help if not)."""
        if self.thread is None or self._stop.is_set():
            return True, "not running"
        if not self.thread.is_alive():
            return False, f"{self.name} informer thread is dead"
        idle = self._clock() - self.last_beat_at
        if idle > self.config.stuck_after_s:
            return False, f"{self.name} informer thread stuck for {idle:.0f}s"
        return True, "alive"

    def _last_error_suffix(self) -> str:
        return f" (last error: {self.last_error})" if self.last_error else ""

    def _beat(self) -> None:
        self.last_beat_at = self._clock()

    def _proved_live(self) -> None:
        now = self._clock()
        self.last_live_at = now
        self.last_beat_at = now

    # --- one iteration, separately callable by tests ---

    def step(self) -> None:
        """List if needed, else watch until the stream ends; on failure back off (410: relist at once).

        Never raises: a failure of any kind is logged and retried after a backoff.
        """
        self._beat()
        try:
            if self._relist or self._resync_due():
                self.list_all()
            else:
                self.watch_once()
        except KubeError as exc:
            if exc.is_gone:
                LOG.info(
                    "watch expired, relisting", extra={"informer": self.name, "rv": self.resource_version}
                )
                self._relist = True
                return
            self._failed(
                str(exc),
                {"code": exc.code, "reason": exc.reason, "error": exc.message},
            )
            return
        except Exception as exc:
            # A handler or decoding bug: the view may have missed an object, so rebuild it.
            self._relist = True
            self._failed(
                f"{type(exc).__name__}: {exc}",
                {"code": 0, "reason": type(exc).__name__, "error": str(exc)},
                exc_info=True,
            )
            return
        self._backoff = self.config.backoff_initial_s
        self.healthy = True
        self.failures = 0
        self.last_error = ""
        self._beat()

    def _failed(self, error: str, fields: dict[str, Any], *, exc_info: bool = False) -> None:
        self.healthy = False
        self.failures += 1
        self.last_error = error
        LOG.warning(
            "list/watch failed",
            extra={
                "informer": self.name,
                "failures": self.failures,
                "backoff_s": self._backoff,
                **fields,
            },
            exc_info=exc_info,
        )
        self._sleep(self._backoff)
        self._backoff = min(self._backoff * 2, self.config.backoff_max_s)
        self._beat()

    def _resync_due(self) -> bool:
        return self.last_list_at is None or self._clock() - self.last_list_at >= self.config.resync_s

    def list_all(self) -> None:
        """Fetch every page, then hand the complete set to the handler at once."""
        with COLLECTOR_PAUSE.during_list():
            self._list_all()

    def _list_all(self) -> None:
        self.handler.listing()
        items: list[JsonDict] = []
        token = ""
        rv = ""
        while True:
            req = calls.list_request(
                self.path,
                self.label_selector,
                self.config.page_limit,
                token,
                item_shape=self.shape,
                field_selector=self.field_selector,
            )
            page = self.kube.send(req)  # its items come in `shape` already
            self._beat()  # a long paginated list is progress, not a stuck thread
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
        self._proved_live()
        self.synced.set()
        LOG.info("listed", extra={"informer": self.name, "objects": len(items), "rv": rv})

    def watch_once(self) -> None:
        """Follow one watch call from the last resourceVersion until it ends or a relist is due."""
        assert self.last_list_at is not None
        remaining = self.config.resync_s - (self._clock() - self.last_list_at)
        timeout = max(1, min(self.config.watch_timeout_s, int(remaining)))
        query = calls.watch_query(self.label_selector, self.resource_version, self.field_selector)
        for event in self.kube.watch(self.path, query, timeout):
            kind = event.get("type")
            obj = event.get("object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind in ("ADDED", "MODIFIED"):
                self.handler.upsert(obj if self.shape is None else shaped(obj, self.shape))
            elif kind == "DELETED":
                self.handler.delete(obj)
            elif kind != "BOOKMARK":
                continue  # unknown types carry nothing we can apply
            if rv:
                self.resource_version = str(rv)
            self._proved_live()
            if self._stop.is_set() or self._relist:
                return
        self._proved_live()  # the server ended the watch as promised: nothing was missed
