"""The extender's statistics: cluster-state gauges (packing efficiency, fragmentation, free GPUs, pending
pods) from the cache (pure), and why each pending pod was last refused."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping

from app.core.fragmentation import fragmented_milli, typical_milli
from app.core.model import Allocation, ClusterState
from app.core.quota import QuotaUse
from extender.metrics import ExtenderGauges, GpuGauge, PendingReason


def gauges(
    state: ClusterState,
    allocs: Mapping[str, Allocation],
    pending: Iterable[PendingReason],
    leader: bool,
    quotas: Iterable[QuotaUse] = (),
) -> ExtenderGauges:
    pods: Counter[tuple[str, int]] = Counter()
    for a in allocs.values():
        for i in a.gpu_indexes:
            pods[(a.node, i)] += 1
    typical = typical_milli(allocs.values())
    rows: list[GpuGauge] = []
    fragmented = free = 0
    for node in state.nodes.values():
        for g in node.gpus:
            rows.append(
                GpuGauge(
                    node.name,
                    g.index,
                    g.model,
                    g.milli_used,
                    g.memory_used_mib,
                    pods[(node.name, g.index)],
                    g.mig_profile,
                    g.parent,
                )
            )
            free += g.milli_used <= 0 and not g.is_mig  # a free MIG device is no free GPU
        fragmented += fragmented_milli([g for g in node.gpus if not g.is_mig], typical)
    return ExtenderGauges(
        gpus=tuple(rows),
        packing_efficiency=state.packing_efficiency,
        fragmented_milli=fragmented,
        typical_milli=typical,
        gpus_free=free,
        pending=dict(Counter(p.value for p in pending)),
        leader=leader,
        quotas=tuple(quotas),
    )


class PendingReasons:
    """Why the last filter refused each pending pod on every node, by uid, for the pending-pods gauge.

    A pod's entry goes when a filter passes it or it is bound, and at each scrape (`of`) for every pod
    no longer pending, so the table holds at most the pods refused since the last scrape.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_uid: dict[str, PendingReason] = {}

    def note(self, uid: str, reason: PendingReason) -> None:
        with self._lock:
            self._by_uid[uid] = reason

    def clear(self, uid: str) -> None:
        with self._lock:
            self._by_uid.pop(uid, None)

    def get(self, uid: str) -> PendingReason | None:
        with self._lock:
            return self._by_uid.get(uid)

    def of(self, pending: Iterable[str]) -> list[PendingReason]:
        """The reason class of each pending pod (by uid; WAITING if never refused); the entries of pods
        not among them are forgotten."""
        with self._lock:
            kept = {uid: self._by_uid.get(uid, PendingReason.WAITING) for uid in pending}
            self._by_uid = {uid: r for uid, r in kept.items() if r is not PendingReason.WAITING}
        return list(kept.values())
