"""What gpupack reads off one pod: identity, phase, recorded allocation, demand and containers (pure).

One reading serves the extender's cache (which allocations count on which node) and the agent's
verification (which container got which GPU), so both see a pod the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app import hostres, names, objects, request
from app.hostres import HostResources
from app.model import Allocation

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodInfo:
    """One pod as gpupack sees it."""

    uid: str
    namespace: str
    name: str
    node_name: str = ""  # spec.nodeName, "" while pending
    phase: str = "Pending"
    allocation: Allocation | None = None  # as recorded in the pod's annotations
    allocation_error: str = ""  # why the recorded allocation cannot be read ("" when it can, or is absent)
    demand: request.PodDemand = ()  # what it asks for, or every rule its request breaks
    deleting: bool = False
    host: HostResources = hostres.ZERO  # CPU and memory it requests (charged to its node once bound)
    gpu_container: str = ""  # the container that gets the GPU
    containers: Mapping[str, str] = field(default_factory=dict)  # runtime container ID -> name (init too)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def pending(self) -> bool:
        return not self.node_name and self.phase not in TERMINAL_PHASES and not self.deleting

    @property
    def alloc(self) -> Allocation | None:
        """The allocation that counts on its node now: only while the pod may hold its GPU.

        Finished pods free their share; an annotation naming another node than the binding is stale. An
        annotated pod that is not bound yet still counts: its bind may be in flight in a replica that just
        lost leadership, or its extender died between the patch and the Binding. Counting it can only
        delay a placement, never hand a GPU out twice; its own next bind overwrites it.
        """
        a = self.allocation
        if a is None or self.phase in TERMINAL_PHASES or (self.node_name and self.node_name != a.node):
            return None
        return a


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """Read a pod dict; entries of the wrong type read as empty (the informer hands over what it got)."""
    meta = objects.as_object(pod.get("metadata"))
    spec = objects.as_object(pod.get("spec"))
    status = objects.as_object(pod.get("status"))
    annotations = objects.string_map(meta.get("annotations"))
    allocation: Allocation | None = None
    error = ""
    try:
        allocation = Allocation.from_annotations(annotations)
    except ValueError as exc:
        error = str(exc)
    regular = [c.name for c in request.containers_of(spec) if not c.init]
    host = hostres.pod_requests(spec)
    return PodInfo(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        allocation=allocation,
        allocation_error=error,
        demand=request.pod_demand(pod, host),
        deleting=bool(meta.get("deletionTimestamp")),
        host=host,
        gpu_container=annotations.get(names.GPU_FRACTION_CONTAINER_NAME) or (regular[0] if regular else ""),
        containers=_container_ids(status),
    )


# What pod_info, is_gpupack_pod and hostres.pod_requests read; everything else of a pod is dropped.
_META_KEYS = ("name", "namespace", "uid", "resourceVersion", "annotations", "labels", "deletionTimestamp")
_CONTAINER_KEYS = ("name", "resources", "restartPolicy")


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a pod gpupack reads (identity, annotations, labels, node, phase, container resources
    and IDs): a listed pod without managedFields, images, env, volumes and conditions, about a fifth of it.
    """
    meta = objects.as_object(pod.get("metadata"))
    spec = objects.as_object(pod.get("spec"))
    status = objects.as_object(pod.get("status"))

    def containers(items: Any) -> list[Any]:
        return [_keep(c, _CONTAINER_KEYS) if isinstance(c, Mapping) else c for c in objects.as_list(items)]

    def statuses(items: Any) -> list[Any]:
        return [
            _keep(c, ("name", "containerID")) if isinstance(c, Mapping) else c for c in objects.as_list(items)
        ]

    out_spec = _keep(spec, ("nodeName", "overhead"))
    for key in ("containers", "initContainers"):
        if key in spec:
            out_spec[key] = containers(spec[key])
    out_status = _keep(status, ("phase",))
    for key in ("containerStatuses", "initContainerStatuses"):
        if key in status:
            out_status[key] = statuses(status[key])
    return {"metadata": _keep(meta, _META_KEYS), "spec": out_spec, "status": out_status}


def _keep(obj: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: obj[k] for k in keys if k in obj}


def _container_ids(status: Mapping[str, Any]) -> dict[str, str]:
    """Runtime container ID (without the runtime:// prefix) -> container name, init containers included.

    The GPU container may be an init container (a sidecar runs beside the others), so theirs count too.
    """
    ids: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for item in objects.as_list(status.get(key)):
            st = objects.as_object(item)
            cid = str(st.get("containerID") or "")
            if cid:
                ids[cid.split("://", 1)[-1]] = str(st.get("name") or "")
    return ids


def is_gpupack_pod(pod: Mapping[str, Any]) -> bool:
    """The pod is ours to account: managed, carrying an allocation, or asking for a gpupack resource.

    Not the label alone: a label anyone could remove must not make a share be forgotten.
    """
    meta = objects.as_object(pod.get("metadata"))
    if objects.string_map(meta.get("labels")).get(names.LABEL_MANAGED) == "true":
        return True
    ann = objects.string_map(meta.get("annotations"))
    if names.ALLOC_NODE in ann or request.wants_gpu(ann):
        return True
    return any(c.ours for c in request.containers_of(objects.as_object(pod.get("spec"))))
