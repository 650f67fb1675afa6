"""GET /state (per node and GPU) and /explain?pod=ns/name (why each node was or was not chosen); read-only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query

from app.core.isolation import compute_enforcement
from extender import verbs
from extender.deps import PolicyDep, StateDep

router = APIRouter(tags=["state"])


@router.get("/state")
def state(cache: StateDep) -> dict[str, Any]:
    pods = cache.pods_by_gpu()
    nodes = []
    for name, node in cache.nodes().items():
        if node is None:
            continue
        nodes.append(
            {
                "name": name,
                "schedulable": node.schedulable,
                "reason": node.unschedulable_reason,
                "mps": node.mps,
                "cpuMilliFree": node.cpu_milli_free,
                "memoryMiBFree": node.memory_mib_free,
                "gpus": [
                    {
                        "index": g.index,
                        "uuid": g.uuid,
                        "model": g.model,
                        "healthy": g.healthy,
                        "memoryMiB": g.memory_mib,
                        "milliAllocated": g.milli_used,
                        "memoryAllocatedMiB": g.memory_used_mib,
                        "foreignMiB": g.foreign_mib,
                        "liveFreeMiB": g.live_free_mib,
                        "utilizationPercent": g.utilization_percent,
                        "migProfile": g.mig_profile,
                        "parent": g.parent,
                        "mpsMode": g.sharing.value,  # "" unknown (app.core.isolation.Sharing)
                        "memoryEnforcement": g.memory_enforcement.value,
                        "computeEnforcement": compute_enforcement(g.sharing).value,
                        "pods": sorted(pods.get((name, g.index), [])),
                    }
                    for g in node.gpus
                ],
            }
        )
    pending = [p.key for p in cache.pods() if p.pending]
    return {"nodes": nodes, "held": len(cache.assume), "pending": sorted(pending)}


@router.get("/explain")
def explain(
    cache: StateDep,
    policy: PolicyDep,
    pod: str = Query(description="namespace/name of a gpupack pod", pattern=r"^[^/\s]+/[^/\s]+$"),
) -> dict[str, Any]:
    info = cache.pod_by_key(pod)
    if info is None:
        raise HTTPException(
            404, f"pod {pod!r} is not a gpupack pod this extender knows (label gpupack.io/managed)"
        )
    out = verbs.explain(cache.nodes(exclude_uid=info.uid), info.demand, policy)
    alloc = info.alloc or cache.assume.get(info.uid)
    out["pod"] = pod
    out["boundTo"] = info.node_name or None
    out["allocation"] = alloc.to_annotations() if alloc else None
    return out
