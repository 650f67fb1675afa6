"""The GPUs the cluster has, for the quota charge: a GPUNode informer's view, read once per review.

The informer runs in each worker's own thread and keeps, per GPUNode, the memory of its largest GPU of each
model; every change rebuilds one immutable `quota.Fleet`, so a review reads one attribute and never waits on
the API. A GPUNode that does not fit its schema counts as having no GPU (and is logged once per change).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from app.core import log
from app.core.quota import Fleet
from app.kube import gpunode, paths
from app.kube.client import Kube
from app.kube.informers import Informer, InformerConfig, object_key

_log = log.get("gpupack.webhook.fleet")
# GPUNodes change when hardware does; the agents' heartbeats patch status only every few seconds, so the
# watch is never quiet for long. A relist every 5 minutes heals anything a watch missed.
INFORMER = InformerConfig(resync_s=300, watch_timeout_s=60, live_within_s=90)


def models_of(obj: Mapping[str, Any]) -> dict[str, int]:
    """Each GPU model of one GPUNode object and the memory of its largest GPU of that model (MiB)."""
    try:
        spec = gpunode.read(obj).spec
    except gpunode.GPUNodeError as exc:
        _log.warning("GPUNode not read for quota", extra={"gpunode": exc.name, "error": str(exc.error)})
        return {}
    out: dict[str, int] = {}
    for g in spec.gpus:
        out[g.model] = max(out.get(g.model, 0), g.memory_mib)
    return out


class FleetView:
    """The informer's handler (app.kube.informers.Handler) and the fleet the reviews read."""

    def __init__(self, fallback_memory_mib: int | None = None) -> None:
        self._fallback = fallback_memory_mib
        self._nodes: dict[str, dict[str, int]] = {}
        self.fleet = Fleet(fallback_memory_mib=fallback_memory_mib)

    def listing(self) -> None:
        """Nothing to mark: `replace` gets the whole list."""

    def replace(self, objs: list[dict[str, Any]]) -> None:
        self._nodes = {object_key(o): models_of(o) for o in objs}
        self._rebuild()

    def upsert(self, obj: dict[str, Any]) -> None:
        self._nodes[object_key(obj)] = models_of(obj)
        self._rebuild()

    def delete(self, obj: dict[str, Any]) -> None:
        self._nodes.pop(object_key(obj), None)
        self._rebuild()

    def _rebuild(self) -> None:
        largest: dict[str, int] = {}
        for models in self._nodes.values():
            for model, mib in models.items():
                largest[model] = max(largest.get(model, 0), mib)
        # One assignment: a review on the event loop sees the old fleet or the new one, never a mix.
        self.fleet = Fleet(MappingProxyType(largest), self._fallback)


def watch(kubeconfig: str | None, view: FleetView) -> Informer:
    """Start the GPUNode informer that keeps `view` current (a daemon thread of this worker)."""
    informer = Informer(Kube.connect(kubeconfig), paths.gpunodes(), view, name="gpunodes", config=INFORMER)
    informer.start()
    return informer
