"""The pod a scheduling call carries, read once per pod version (pure, thread-safe).

kube-scheduler sends the same pod to /filter and then /prioritize, and again on every retry of a pending
pod. A pod's uid and resourceVersion name one content of it, so its reading (the demand and whether the
webhook admitted it) is kept under that pair; a pod without either is read every time.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from app.core import managed, podview, request
from app.core.objects import as_object
from app.core.request import PodDemand

LIMIT: Final = 4096  # readings kept: far more pods than are pending at once; the oldest goes first


@dataclass(frozen=True, slots=True)
class Reading:
    """What the scheduling verbs need of a pod."""

    demand: PodDemand  # what it asks of a node, or every rule its request breaks
    unmanaged: str | None  # why the webhook did not admit it; None for a gpupack pod


class Readings:
    """Readings by (uid, resourceVersion), the latest LIMIT."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._memo: dict[tuple[str, str], Reading] = {}

    def of(self, pod: Mapping[str, Any]) -> Reading:
        """The pod's reading (/filter): the stored one of its version, else read and stored."""
        key = _key(pod)
        if key is not None and (hit := self._memo.get(key)) is not None:
            return hit
        view = podview.read(pod)
        reading = Reading(request.pod_demand(view), managed.unmanaged_reason(view))
        if key is not None:
            with self._lock:
                self._memo[key] = reading
                if len(self._memo) > self._limit:
                    del self._memo[next(iter(self._memo))]
        return reading

    def demand(self, pod: Mapping[str, Any]) -> PodDemand:
        """The pod's demand (/prioritize): from the stored reading of its version, else read (and not
        stored: the webhook check that /filter adds is not needed here)."""
        key = _key(pod)
        if key is not None and (hit := self._memo.get(key)) is not None:
            return hit.demand
        return request.pod_demand(podview.read(pod))


def _key(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, resourceVersion), or None when either is missing."""
    meta = as_object(pod.get("metadata"))
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if isinstance(uid, str) and uid and isinstance(version, str) and version:
        return uid, version
    return None
