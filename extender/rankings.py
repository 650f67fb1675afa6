"""The placement engine over the cluster cache: each request's standings, brought up to date first."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from app.core.explain import reason_text
from app.core.model import Demand, Node
from app.core.placement import Policy
from app.core.placement.engine import Engine, RefusalStanding, Standings, judge
from app.kube.cache import ClusterCache

# Shapes ranked at once. Each holds one verdict per node; pods come in a handful of shapes, so a table
# that fills up (many one-off shapes) is simply started over.
MAX_SHAPES = 32


class Rankings:
    """One policy's engine over one cache. One request at a time reads or updates it."""

    def __init__(self, cache: ClusterCache, policy: Policy, max_shapes: int = MAX_SHAPES) -> None:
        self.cache = cache
        self.policy = policy
        self.engine = Engine(policy, RefusalStanding(reason_text), max_shapes=max_shapes)
        self._lock = threading.Lock()
        self._token: int | None = None  # the cache's change-log position the engine reflects
        self._rank: Mapping[str, int] = {}

    def quick(self, demand: Demand) -> bool:
        """Whether `standings(demand)` now would be quick: the shape is ranked (only the nodes that
        changed are judged again), no other request holds the engine (one may be judging every node)
        and no informer holds the cache (a relist)."""
        return demand in self.engine.shapes and not self._lock.locked() and not self.cache.busy()

    def prepare(self) -> None:
        """Build every node's view, read its GPUs and work out what no demand changes of them for the array
        pass now (when the replica turns Ready), not in the first request for a new shape: at 5 000 nodes
        about 0.25 s of CPU, several times that request's own judging. Skipped if a request holds the
        engine: it does the work."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._sync("")
            self.engine.prepare()
        finally:
            self._lock.release()

    def _sync(self, exclude_uid: str) -> dict[str, Node | None]:
        """Bring the engine's positions up to the cache; the nodes this request sees differently."""
        frame = self.cache.frame(self._token, exclude_uid)
        rank, engine = frame.rank, self.engine
        stray = any(name not in rank and node is not None for name, node in frame.changed.items())
        if frame.full or rank is not self._rank or stray:
            nodes: list[Node | None] = [None] * len(rank)
            views = frame.changed if frame.full else self.cache.frame(None).changed
            for name, node in views.items():
                i = rank.get(name)
                if i is not None:
                    nodes[i] = node
            engine.reset(nodes)
            self._rank = rank
        else:
            for name, node in frame.changed.items():
                i = rank.get(name)
                if i is not None:  # else a node without a GPUNode, and never ranked
                    engine.set(i, node)
        self._token = frame.token
        return frame.adjusted

    @contextmanager
    def standings(self, demand: Demand, exclude_uid: str = "") -> Iterator[Standings]:
        """Every node's verdict on `demand` now, as `cache.nodes(exclude_uid=...)` would be judged."""
        with self._lock:
            adjusted = self._sync(exclude_uid)
            shape = self.engine.shape(demand)
            policy = self.policy
            yield Standings(
                self.engine,
                shape,
                self._rank,
                {n: None if node is None else judge(node, demand, policy) for n, node in adjusted.items()},
            )
