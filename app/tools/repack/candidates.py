"""Pods, PodDisruptionBudgets and Nodes (API objects) -> what the planner needs (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.core import names
from app.core.model import Demand
from app.core.objects import as_list, as_object, string_map
from app.core.pods import PodInfo
from app.tools.repack.plan import PodRef
from app.tools.repack.selectors import matches, scheduler_refusal

# Controllers that re-create a pod evicted from under them. A DaemonSet's pod comes back on the same
# node, so evicting it frees nothing; a bare pod never comes back.
RECREATING_KINDS = frozenset({"ReplicaSet", "StatefulSet", "Job", "ReplicationController"})


@dataclass(frozen=True, slots=True)
class Budget:
    key: str  # namespace/name
    namespace: str
    selector: Mapping[str, Any]
    disruptions_allowed: int


def controller_of(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(kind, name, uid) of the pod's controlling owner, or None for a bare pod."""
    for ref in as_list(as_object(pod.get("metadata")).get("ownerReferences")):
        r = as_object(ref)
        if r.get("controller") is True:
            return str(r.get("kind") or ""), str(r.get("name") or ""), str(r.get("uid") or "")
    return None


def why_pinned(pod: Mapping[str, Any]) -> str:
    """Why this pod must stay where it is, whatever the budgets say ("" when it may move)."""
    meta = as_object(pod.get("metadata"))
    if string_map(meta.get("annotations")).get(names.MOVABLE, "").strip().lower() == "false":
        return f'opted out ({names.MOVABLE}: "false")'
    owner = controller_of(pod)
    if owner is None:
        return "bare pod: no controller would re-create it"
    if owner[0] not in RECREATING_KINDS:
        return f"owned by a {owner[0]}, which does not re-create it elsewhere"
    if meta.get("deletionTimestamp"):
        return "already terminating"
    return ""


def budgets_of(pdbs: Sequence[Mapping[str, Any]]) -> list[Budget]:
    out = []
    for pdb in pdbs:
        meta = as_object(pdb.get("metadata"))
        ns = str(meta.get("namespace") or "")
        status = as_object(pdb.get("status"))
        # Until the disruption controller has observed the current spec, its count is not to be trusted.
        current = status.get("observedGeneration") == meta.get("generation")
        allowed = int(status.get("disruptionsAllowed") or 0) if current else 0
        selector = as_object(as_object(pdb.get("spec")).get("selector"))
        out.append(Budget(f"{ns}/{meta.get('name', '')}", ns, selector, allowed))
    return out


def pdbs_covering(pod: Mapping[str, Any], budgets: Sequence[Budget]) -> tuple[str, ...]:
    meta = as_object(pod.get("metadata"))
    ns = str(meta.get("namespace") or "")
    labels = string_map(meta.get("labels"))
    return tuple(sorted(b.key for b in budgets if b.namespace == ns and matches(b.selector, labels)))


def allowed_nodes(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """Nodes kube-scheduler would pass to the extender for this pod: selectors, affinity, not cordoned."""
    spec = as_object(pod.get("spec"))
    return frozenset(
        str(as_object(node.get("metadata")).get("name") or "")
        for node in nodes
        if scheduler_refusal(spec, node) is None
    )


def pod_refs(
    pods: Sequence[Mapping[str, Any]],
    infos: Mapping[str, PodInfo],
    budgets: Sequence[Budget],
    nodes: Sequence[Mapping[str, Any]],
) -> list[PodRef]:
    """Every running gpupack pod with an allocation, as the planner sees it; `infos` by pod uid."""
    out = []
    for pod in pods:
        uid = str(as_object(pod.get("metadata")).get("uid") or "")
        info = infos.get(uid)
        if info is None or info.alloc is None or not info.node_name or not isinstance(info.demand, Demand):
            continue
        out.append(
            PodRef(
                key=info.key,
                uid=uid,
                alloc=info.alloc,
                demand=info.demand,
                blocked=why_pinned(pod),
                pdbs=pdbs_covering(pod, budgets),
                nodes=allowed_nodes(pod, nodes),
            )
        )
    return out


def with_block(pod: PodRef, why: str) -> PodRef:
    """The pod, kept where it is for `why` (a reason it already has comes first)."""
    return replace(pod, blocked=pod.blocked or why)


def budget_map(budgets: Sequence[Budget]) -> dict[str, int]:
    return {b.key: b.disruptions_allowed for b in budgets}
