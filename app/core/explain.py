"""Why a pod would or would not go to each node and each GPU: the extender's /explain and `gpupack explain`.

Pure: nodes, a demand and a policy in, rows out. kube-scheduler removes nodes before the extender sees
them (node selector, required affinity, cordon); callers that know those pass them in `excluded`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.core import request
from app.core.errors import PlacementReason, share
from app.core.model import Demand, Gpu, Node
from app.core.placement import Placement, Policy, normalize_scores
from app.core.placement.engine import Engine, RefusalStanding
from app.core.placement.fit import FOREIGN_MARGIN_MIB, memory_room, mode_admits, mode_misfit

NO_GPUNODE = "no GPUNode object for this node: the gpupack agent does not run here"


def reason_text(reason: PlacementReason) -> str:
    """The rule, prefixed with the GPU when it is about one GPU (the node is the map key already)."""
    return reason.rule if reason.gpu is None else f"gpu{reason.gpu}: {reason.rule}"


def gpu_misfit(gpu: Gpu, demand: Demand, margin_mib: int = FOREIGN_MARGIN_MIB) -> str:
    """Why one device of `demand` does not fit this GPU ("" when it does), in the order fit checks."""
    if not gpu.healthy:
        return "unhealthy"
    if not demand.accepts(gpu.model):
        return f"GPU model {gpu.model} is not one of {'|'.join(sorted(demand.models))}"
    if not mode_admits(gpu, demand):
        return mode_misfit([gpu], demand)
    if (demand.mig or demand.mig_profile or gpu.is_mig) and not demand.targets(gpu):
        return target_misfit(gpu, demand)
    milli, mib = demand.on(gpu.memory_mib)
    if milli > gpu.milli_free:
        return f"needs {share(milli)} of the GPU: {share(max(gpu.milli_free, 0))} free"
    room = memory_room(gpu, margin_mib)
    if mib > room:
        return f"needs {mib} MiB: {max(room, 0)} MiB room"
    return ""


def target_misfit(gpu: Gpu, demand: Demand) -> str:
    """Why a MIG device is no target for a share, or a GPU or MIG device none for a MIG demand."""
    if not gpu.is_mig:
        return "a whole GPU: the pod asks for a MIG device, taken whole"
    if not demand.mig:
        return f"a MIG device ({gpu.mig_profile}): taken whole, only by pods asking for MIG"
    if demand.mig_profile:
        return f"MIG profile {gpu.mig_profile}: the pod asks for {demand.mig_profile}"
    return f"MIG device of {gpu.memory_mib} MiB: the pod asks for {demand.memory_mib} MiB"


def gpu_rows(node: Node, demand: Demand) -> list[dict[str, Any]]:
    rows = []
    for g in node.gpus:
        why = gpu_misfit(g, demand) if demand.count else "the pod asks for no GPU"
        rows.append(
            {
                "gpu": g.index,
                "device": g.device,  # "0", or a MIG device's parent/slot ("0/1"), as `gpupack top` shows
                "migProfile": g.mig_profile or None,
                "model": g.model,
                "milliFree": g.milli_free,
                "memoryRoomMiB": memory_room(g),
                "mpsMode": g.sharing.value,
                "memoryEnforcement": g.memory_enforcement.value,
                "fits": not why,
                "reason": why or None,
            }
        )
    return rows


def explain(
    nodes: Mapping[str, Node | None],
    demand: request.PodDemand,
    policy: Policy,
    excluded: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Why each node (and GPU) would or would not get the pod, and where it would go now.

    `excluded`: node -> why kube-scheduler never offers it to the extender for this pod; those nodes
    are left out of the choice and reported with that reason.
    """
    if not isinstance(demand, Demand):
        return {"demand": None, "error": request.render(demand), "choice": None, "nodes": []}
    skip = excluded or {}
    present = [n for name, n in nodes.items() if n is not None and name not in skip]
    # The placement engine, as the extender decides: each node judged once for the rows and the choice.
    engine = Engine(policy, RefusalStanding(reason_text))
    verdicts = {n.name: engine.verdict(n, demand) for n in present}
    raw = {name: None if v.reason is not None else v.score for name, v in verdicts.items()}
    scaled = normalize_scores(raw)
    rows: list[dict[str, Any]] = []
    for name, node in nodes.items():
        if name in skip:
            rows.append({"node": name, "fits": False, "reason": skip[name], "kind": "scheduler"})
            continue
        if node is None:
            rows.append({"node": name, "fits": False, "reason": NO_GPUNODE, "kind": "node"})
            continue
        reason = verdicts[name].reason
        row: dict[str, Any]
        if reason is not None:
            row = {"node": name, "fits": False, "reason": reason_text(reason), "kind": str(reason.kind)}
        else:
            row = {"node": name, "fits": True, "score": raw[name], "priority": scaled[name]}
        row["gpus"] = gpu_rows(node, demand)
        rows.append(row)
    chosen = engine.place(present, demand)
    choice = {"node": chosen.node.name, "gpus": list(chosen.gpus)} if isinstance(chosen, Placement) else None
    return {
        "demand": {
            "count": demand.count,
            "milli": demand.milli,
            "memoryMiB": demand.memory_mib,
            "models": sorted(demand.models),
            "timeSlice": demand.timeslice,
            "mig": demand.mig,
            "migProfile": demand.mig_profile or None,
            "memoryEnforcement": demand.memory_enforcement.value,
        },
        "policy": policy.name,
        "choice": choice,
        "nodes": rows,
    }
