"""Cluster-state gauges (packing efficiency, fragmentation, free GPUs, pending pods) from the cache (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from app.fragmentation import fragmented_milli, typical_milli
from app.metrics import ExtenderGauges, GpuGauge, PendingReason
from app.model import MILLI_PER_GPU, Allocation, ClusterState


def gauges(
    state: ClusterState,
    allocs: Mapping[str, Allocation],
    pending: Iterable[PendingReason],
    leader: bool,
) -> ExtenderGauges:
    pods: Counter[tuple[str, int]] = Counter()
    for a in allocs.values():
        for i in a.gpu_indexes:
            pods[(a.node, i)] += 1
    typical = typical_milli(allocs.values())
    rows: list[GpuGauge] = []
    in_use = used_milli = fragmented = free = 0
    for node in state.nodes.values():
        for g in node.gpus:
            rows.append(
                GpuGauge(
                    node.name, g.index, g.model, g.milli_used, g.memory_used_mib, pods[(node.name, g.index)]
                )
            )
            if g.milli_used <= 0:
                free += 1
                continue
            in_use += 1
            used_milli += g.milli_used
        fragmented += fragmented_milli(node.gpus, typical)
    return ExtenderGauges(
        gpus=tuple(rows),
        packing_efficiency=used_milli / (in_use * MILLI_PER_GPU) if in_use else 0.0,
        fragmented_milli=fragmented,
        typical_milli=typical,
        gpus_free=free,
        pending=dict(Counter(p.value for p in pending)),
        leader=leader,
    )
