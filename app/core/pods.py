"""What gpupack reads off one pod: identity, phase, recorded allocation, demand and containers (pure).

One reading serves the extender's cache (which allocations count on which node) and the agent's
verification (which container got which GPU), so both see a pod the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from app.core import hostres, names, podview, request
from app.core.hostres import HostResources
from app.core.model import Allocation
from app.core.objects import NotAnArray, NotAnObject
from app.core.podview import PodView

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class PodInfo:
    """One pod as gpupack sees it."""

    uid: str
    namespace: str
    name: str
    resource_version: str = ""  # of the object this was read from: a write's precondition
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
    return info_of(podview.read(pod))


def allocation_of(view: PodView) -> tuple[Allocation | None, str]:
    """The allocation the pod's annotations record (None when absent), or why it cannot be read."""
    try:
        return Allocation.from_annotations(view.annotations), ""
    except ValueError as exc:
        return None, str(exc)


def info_of(view: PodView) -> PodInfo:
    """The record of a pod already read."""
    allocation, error = allocation_of(view)
    return PodInfo(
        uid=view.uid,
        namespace=view.namespace,
        name=view.name,
        resource_version=view.resource_version,
        node_name=view.node_name,
        phase=view.phase,
        allocation=allocation,
        allocation_error=error,
        demand=request.pod_demand(view),
        deleting=view.deleting,
        host=view.host,
        gpu_container=view.gpu_container or "",
        containers=view.container_ids,
    )


# What app.core.podview reads for pod_info and is_gpupack, as shapes (app.core.objects): everything else of a
# pod is dropped as it is read. Each field keeps whatever the object holds there (the readers tolerate it).


class SlimMetadata(TypedDict, total=False):
    name: Any
    namespace: Any
    uid: Any
    resourceVersion: Any
    annotations: Any
    labels: Any
    deletionTimestamp: Any


class SlimContainer(TypedDict, total=False):
    name: Any
    resources: Any
    restartPolicy: Any


class SlimContainerStatus(TypedDict, total=False):
    name: Any
    containerID: Any


class SlimSpec(TypedDict, total=False):
    nodeName: Any
    overhead: Any
    containers: list[SlimContainer | NotAnObject] | NotAnArray
    initContainers: list[SlimContainer | NotAnObject] | NotAnArray


class SlimStatus(TypedDict, total=False):
    phase: Any
    containerStatuses: list[SlimContainerStatus | NotAnObject] | NotAnArray
    initContainerStatuses: list[SlimContainerStatus | NotAnObject] | NotAnArray


class SlimPod(TypedDict, total=False):
    """The parts of a pod gpupack reads (identity, annotations, labels, node, phase, container resources
    and IDs): a listed pod without managedFields, images, env, volumes and conditions, about a fifth of it.
    The pod informer's list pages are read straight into it (`objects.read_list`)."""

    metadata: SlimMetadata | NotAnObject
    spec: SlimSpec | NotAnObject
    status: SlimStatus | NotAnObject


def is_gpupack(pod: PodView) -> bool:
    """The pod is ours to account: managed, carrying an allocation, or asking for a gpupack resource.

    Not the label alone: a label anyone could remove must not make a share be forgotten.
    """
    if pod.labels.get(names.LABEL_MANAGED) == "true":
        return True
    if names.ALLOC_NODE in pod.annotations or pod.ask.wanted:
        return True
    return any(c.ours for c in pod.containers)
