"""The ResourceQuota objects of every namespace, kept by an informer for the extender's quota gauges."""

from __future__ import annotations

import threading

from app.core import quota
from app.core.quota import QuotaUse
from app.kube.cache import Handler
from app.kube.calls import JsonDict
from app.kube.informers import object_key


class QuotaStore:
    """Thread-safe: the informer writes from its thread, a scrape reads `uses()` from another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._quotas: dict[str, JsonDict] = {}  # namespace/name -> ResourceQuota

    @property
    def handler(self) -> Handler:
        return Handler(self.replace, self.upsert, self.delete)

    def replace(self, objs: list[JsonDict]) -> None:
        with self._lock:
            self._quotas = {object_key(o): o for o in objs}

    def upsert(self, obj: JsonDict) -> None:
        with self._lock:
            self._quotas[object_key(obj)] = obj

    def delete(self, obj: JsonDict) -> None:
        with self._lock:
            self._quotas.pop(object_key(obj), None)

    def uses(self) -> list[QuotaUse]:
        """Every gpupack resource a quota caps, used against hard (app.core.quota.uses)."""
        with self._lock:
            quotas = list(self._quotas.values())
        return quota.uses(quotas)
