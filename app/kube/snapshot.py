"""One consistent-enough read of the cluster for the operator commands (top, repack, explain): no watch."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.kube import calls, paths
from app.kube.cache import ClusterCache
from app.kube.calls import JsonDict
from app.kube.informers import KubeApi


def list_all(kube: KubeApi, path: str, selector: str = "") -> list[JsonDict]:
    """Every object of a list call, page by page."""
    items: list[JsonDict] = []
    token = ""
    while True:
        page = kube.send(calls.list_request(path, selector, 500, token))
        items.extend(page.get("items") or [])
        token = str((page.get("metadata") or {}).get("continue") or "")
        if not token:
            return items


@dataclass(slots=True)
class Snapshot:
    """GPUNodes, Nodes, gpupack pods and (when asked for) PodDisruptionBudgets, as listed."""

    gpunodes: list[JsonDict] = field(default_factory=list)
    nodes: list[JsonDict] = field(default_factory=list)
    pods: list[JsonDict] = field(default_factory=list)
    pdbs: list[JsonDict] = field(default_factory=list)

    def cache(self, heartbeat_timeout_s: float | None = None) -> ClusterCache:
        """The extender's view of these objects (same code: allocations, host requests, staleness)."""
        cache = ClusterCache(heartbeat_timeout_s=heartbeat_timeout_s)
        cache.set_gpunodes(self.gpunodes)
        cache.set_nodes(self.nodes)
        cache.set_pods(self.pods)
        return cache


def read(kube: KubeApi, *, with_nodes: bool = True, with_pdbs: bool = False) -> Snapshot:
    return Snapshot(
        gpunodes=list_all(kube, paths.gpunodes()),
        nodes=list_all(kube, paths.nodes()) if with_nodes else [],
        pods=list_all(kube, paths.pods(), calls.MANAGED_SELECTOR),
        pdbs=list_all(kube, paths.pdbs()) if with_pdbs else [],
    )
