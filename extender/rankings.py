"""Per demand shape, a Ranking of every node, brought up to date from the cluster cache on each request."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from app.explain import reason_text
from app.kube.cache import ClusterCache
from app.model import Demand
from app.placement import Policy
from app.placement.ranking import Ranking, Standings

# Shapes ranked at once. Each ranking holds one verdict per node; pods come in a handful of shapes,
# so a table that fills up (many one-off shapes) is simply started over.
MAX_SHAPES = 32


class Rankings:
    """The rankings of one policy over one cache. One request at a time reads or updates them."""

    def __init__(self, cache: ClusterCache, policy: Policy, max_shapes: int = MAX_SHAPES) -> None:
        self.cache = cache
        self.policy = policy
        self.max_shapes = max_shapes
        self._lock = threading.Lock()
        self._rankings: dict[Demand, Ranking] = {}

    def quick(self, demand: Demand) -> bool:
        """Whether `standings(demand)` now would be quick: the shape has a ranking (only the nodes that
        changed are judged again), no other request holds the rankings (one may be judging every node)
        and no informer holds the cache (a relist)."""
        return demand in self._rankings and not self._lock.locked() and not self.cache.busy()

    @contextmanager
    def standings(self, demand: Demand, exclude_uid: str = "") -> Iterator[Standings]:
        """Every node's verdict on `demand` now, as `cache.nodes(exclude_uid=...)` would be judged."""
        with self._lock:
            ranking = self._rankings.get(demand)
            if ranking is None:
                if len(self._rankings) >= self.max_shapes:
                    self._rankings.clear()
                ranking = self._rankings[demand] = Ranking(demand, self.policy, reason_text)
            frame = self.cache.frame(ranking.token, exclude_uid)
            ranking.update(frame.token, frame.changed, frame.rank, frame.full)
            yield ranking.standings(frame.adjusted)
