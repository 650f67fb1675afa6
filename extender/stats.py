"""Cluster-state gauges (packing efficiency, fragmentation, free GPUs, pending pods) from the cache (pure)."""

from __future__ import annotations

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
