"""Placements held between bind and the pod's annotation coming back through the watch (TTL cache)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from app.core.model import Allocation

# Far above the informer's echo latency; an entry outliving it means the echo was lost, and the next
# relist then carries the annotation anyway.
DEFAULT_TTL_S = 120.0


class AssumeCache:
    """Allocations by pod UID that the cluster state must count although no watch event shows them yet.

    Two plain dicts in hold order: every filter and bind reads all holds, so a copy runs at C speed, and
    expiry pops from the front (holds are taken in timer order; a replaced hold moves to the back).
    """

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        maxsize: int = 100_000,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._timer = timer
        self._ttl_s = ttl_s
        self._maxsize = maxsize
        self._held: dict[str, Allocation] = {}
        self._since: dict[str, float] = {}  # when each hold was taken (the cache's timer), oldest first

    def now(self) -> float:
        return self._timer()

    def _expire(self) -> None:
        """Drop holds at or past their TTL, and the oldest beyond `maxsize` (under the lock)."""
        since = self._since
        limit = self._timer() - self._ttl_s
        while since:
            uid = next(iter(since))
            if since[uid] > limit and len(since) <= self._maxsize:
                return
            del since[uid]
            self._held.pop(uid, None)

    def hold(self, uid: str, alloc: Allocation) -> None:
        """Count `alloc` for pod `uid` until released, confirmed or expired (replaces an earlier hold)."""
        with self._lock:
            self._since.pop(uid, None)
            self._held[uid] = alloc
            self._since[uid] = self._timer()
            self._expire()

    def release(self, uid: str) -> Allocation | None:
        """Drop the hold (failed bind, deleted pod, or the watch showed the annotation)."""
        with self._lock:
            self._expire()
            self._since.pop(uid, None)
            return self._held.pop(uid, None)

    def release_absent(self, present: set[str], listed_at: float) -> list[str]:
        """Drop holds taken before `listed_at` whose pod a list started then did not show: it is gone.

        A pod exists before its bind takes a hold, and a list started later reads the current state, so
        its absence there means the pod was deleted. Holds taken after the list started are kept.
        """
        with self._lock:
            self._expire()
            gone = [u for u, t in self._since.items() if u not in present and t < listed_at]
            for uid in gone:
                del self._held[uid]
                del self._since[uid]
            return gone

    def get(self, uid: str) -> Allocation | None:
        with self._lock:
            self._expire()
            return self._held.get(uid)

    def items(self) -> dict[str, Allocation]:
        """Live holds by pod UID (expired ones are dropped first)."""
        with self._lock:
            self._expire()
            return dict(self._held)

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._held)
