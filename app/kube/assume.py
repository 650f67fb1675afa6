"""Placements held between bind and the pod's annotation coming back through the watch (TTL cache)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from cachetools import TTLCache

from app.model import Allocation

# Far above the informer's echo latency; an entry outliving it means the echo was lost, and the next
# relist then carries the annotation anyway.
DEFAULT_TTL_S = 120.0


class AssumeCache:
    """Allocations by pod UID that the cluster state must count although no watch event shows them yet."""

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        maxsize: int = 100_000,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._timer = timer
        self._held: TTLCache[str, Allocation] = TTLCache(maxsize=maxsize, ttl=ttl_s, timer=timer)
        self._since: dict[str, float] = {}  # when each hold was taken (the cache's timer)

    def now(self) -> float:
        return self._timer()

    def hold(self, uid: str, alloc: Allocation) -> None:
        """Count `alloc` for pod `uid` until released, confirmed or expired (replaces an earlier hold)."""
        with self._lock:
            self._held[uid] = alloc
            self._since[uid] = self._timer()

    def release(self, uid: str) -> Allocation | None:
        """Drop the hold (failed bind, deleted pod, or the watch showed the annotation)."""
        with self._lock:
            self._since.pop(uid, None)
            return self._held.pop(uid, None)

    def release_absent(self, present: set[str], listed_at: float) -> list[str]:
        """Drop holds taken before `listed_at` whose pod a list started then did not show: it is gone.

        A pod exists before its bind takes a hold, and a list started later reads the current state, so
        its absence there means the pod was deleted. Holds taken after the list started are kept.
        """
        with self._lock:
            self._held.expire()
            gone = [u for u in self._held if u not in present and self._since.get(u, listed_at) < listed_at]
            for uid in gone:
                del self._held[uid]
            self._since = {u: t for u, t in self._since.items() if u in self._held}
            return gone

    def get(self, uid: str) -> Allocation | None:
        with self._lock:
            return self._held.get(uid)

    def items(self) -> dict[str, Allocation]:
        """Live holds by pod UID (expired ones are dropped first)."""
        with self._lock:
            self._held.expire()
            return dict(self._held.items())

    def __len__(self) -> int:
        with self._lock:
            self._held.expire()
            return len(self._held)
