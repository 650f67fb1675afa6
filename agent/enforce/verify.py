"""Check that each gpupack container runs on the GPUs of its allocation and within its memory (pure)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from agent.enforce.cgroup import PodRef
from agent.nvml.sample import NodeSample
from app.core import names
from app.core.model import mig_index
from app.core.pods import PodInfo
from app.kube import calls, paths
from app.kube.calls import Request
from app.kube.gpunode import GpuStatus, format_time

COMPONENT = "gpupack-agent"


class Kind(StrEnum):
    WRONG_GPU = "wrong_gpu"  # a process of the pod runs on a GPU outside its allocation
    OVER_MEMORY = "over_memory"  # the pod's processes on one GPU use more than its cap (Allocation.cap_mib)
    WRONG_CONTAINER = "wrong_container"  # a container other than the GPU container uses a GPU
    NO_ALLOCATION = "no_allocation"  # a gpupack pod uses a GPU but has no (valid) allocation
    WRONG_ENV = (
        "wrong_env"  # a process of the pod runs with other GPU env than the allocation gives (envcheck)
    )
    GPU_UNHEALTHY = "gpu_unhealthy"  # a GPU of the pod's allocation turned unhealthy (told, not evicted)


REASONS: Mapping[Kind, str] = {
    Kind.WRONG_GPU: "GpupackWrongGPU",
    Kind.OVER_MEMORY: "GpupackMemoryOverLimit",
    Kind.WRONG_CONTAINER: "GpupackWrongContainer",
    Kind.NO_ALLOCATION: "GpupackNoAllocation",
    Kind.WRONG_ENV: "GpupackEnvMismatch",
    Kind.GPU_UNHEALTHY: "GpupackGPUUnhealthy",
}


@dataclass(frozen=True, slots=True)
class PodUsage:
    pod: PodInfo
    gpu_uuid: str
    gpu_index: int
    used_mib: int
    limit_mib: int | None  # None: the pod has no allocation on this GPU
    pids: tuple[int, ...]

    @property
    def borrowed_mib(self) -> int:
        """Memory used above the pod's request (its allocation) on this GPU: what a burstable pod borrows."""
        return 0 if self.limit_mib is None else max(0, self.used_mib - self.limit_mib)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: Kind
    pod: PodInfo
    gpu_uuid: str
    gpu_index: int
    pids: tuple[int, ...]
    message: str

    @property
    def key(self) -> tuple[str, Kind, str]:
        """Identity for de-duplication: one Event per pod, kind and GPU."""
        return (self.pod.uid, self.kind, self.gpu_uuid)


@dataclass(frozen=True, slots=True)
class Verdict:
    owners: Mapping[int, str]  # pid → pod UID ("" when not in any pod)
    usage: tuple[PodUsage, ...]
    violations: tuple[Violation, ...]
    foreign_pids: tuple[int, ...]  # on a GPU but in no pod we could identify


def verify(sample: NodeSample, refs: Mapping[int, PodRef | None], pods: Mapping[str, PodInfo]) -> Verdict:
    """Attribute every GPU process to a pod and check each gpupack pod against its allocation.

    `refs` maps pid → the pod its cgroup points into; `pods` are this node's gpupack pods by UID.
    A process on a MIG device is checked against that MIG device's UUID (and its node-wide index,
    app.core.model.mig_index), as a process on a whole GPU against the GPU's.
    """
    owners: dict[int, str] = {}
    foreign: list[int] = []
    per: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)  # (uid, gpu) → pid, MiB, cid
    index_of: dict[str, int] = {}
    for gpu in sample.gpus:
        index_of[gpu.uuid] = gpu.index
        for m in gpu.mig_devices:
            index_of[m.uuid] = mig_index(gpu.index, m.mig_index)
        for p in gpu.processes:
            ref = refs.get(p.pid)
            owners[p.pid] = ref.pod_uid if ref else ""
            if ref is None:
                foreign.append(p.pid)
            elif ref.pod_uid in pods and (not p.mig_uuid or p.mig_uuid in index_of):
                per[(ref.pod_uid, p.mig_uuid or gpu.uuid)].append((p.pid, p.used_mib or 0, ref.container_id))
    usage: list[PodUsage] = []
    violations: list[Violation] = []
    for (uid, gpu_uuid), procs in sorted(per.items()):
        pod, idx = pods[uid], index_of[gpu_uuid]
        alloc = pod.allocation
        on_gpu = alloc is not None and (
            gpu_uuid in alloc.gpu_uuids if alloc.gpu_uuids else idx in alloc.gpu_indexes
        )
        pids = tuple(p for p, _, _ in procs)
        used = sum(m for _, m, _ in procs)
        usage.append(PodUsage(pod, gpu_uuid, idx, used, alloc.memory_mib if alloc and on_gpu else None, pids))
        for kind, message, bad_pids in _check(pod, gpu_uuid, idx, procs, on_gpu):
            violations.append(Violation(kind, pod, gpu_uuid, idx, bad_pids, message))
    return Verdict(
        owners=owners, usage=tuple(usage), violations=tuple(violations), foreign_pids=tuple(foreign)
    )


def unhealthy(gpus: Iterable[GpuStatus], pods: Mapping[str, PodInfo]) -> tuple[Violation, ...]:
    """One notice per running pod and unhealthy GPU of its allocation; pods on other GPUs get none.

    The pod is not evicted or restarted by us: its processes may still work (an XID can be one kernel's
    fault), and only the user knows whether to move it. The GPU takes no new pods meanwhile (GPUNode).
    """
    out: list[Violation] = []
    for g in gpus:
        if g.healthy:
            continue
        for pod in pods.values():
            alloc = pod.allocation
            if alloc is None or pod.deleting or pod.phase in ("Succeeded", "Failed"):
                continue
            if g.uuid in alloc.gpu_uuids or (not alloc.gpu_uuids and g.index in alloc.gpu_indexes):
                why = g.reason or "unknown"
                message = (
                    f"GPU {g.index} ({g.uuid}) of this pod's allocation is unhealthy: {why}. "
                    "The pod keeps running and no new pod is placed on that GPU; delete the pod to have it "
                    "placed on a healthy GPU"
                )
                out.append(Violation(Kind.GPU_UNHEALTHY, pod, g.uuid, g.index, (), message))
    return tuple(out)


def _check(
    pod: PodInfo, gpu_uuid: str, idx: int, procs: list[tuple[int, int, str]], on_gpu: bool
) -> list[tuple[Kind, str, tuple[int, ...]]]:
    """One pod's processes on one GPU against its allocation: (kind, message, pids) per broken rule."""
    pids = tuple(p for p, _, _ in procs)
    used = sum(m for _, m, _ in procs)
    where = f"{'MIG device' if gpu_uuid.startswith('MIG-') else 'GPU'} {idx} ({gpu_uuid})"
    alloc = pod.allocation
    if alloc is None:
        why = pod.allocation_error or "it has no allocation annotations"
        return [(Kind.NO_ALLOCATION, f"processes {_pids(pids)} use {where} but {why}", pids)]
    out: list[tuple[Kind, str, tuple[int, ...]]] = []
    strangers = {
        p: pod.containers[c]
        for p, _, c in procs
        if pod.containers.get(c, pod.gpu_container) != pod.gpu_container
    }
    if strangers:
        out.append(
            (
                Kind.WRONG_CONTAINER,
                f"container(s) {', '.join(sorted(set(strangers.values())))} use {where}; only container "
                f"{pod.gpu_container} was given a GPU (is NVIDIA_VISIBLE_DEVICES=void honoured?)",
                tuple(strangers),
            )
        )
    if not on_gpu:
        want = ",".join(alloc.gpu_uuids) or ",".join(map(str, alloc.gpu_indexes))
        out.append(
            (
                Kind.WRONG_GPU,
                f"processes {_pids(pids)} run on {where} but the allocation is {want} "
                "(is NVIDIA_VISIBLE_DEVICES honoured by the container runtime?)",
                pids,
            )
        )
    elif used > alloc.cap_mib:  # a burstable pod may use up to its hard cap
        what = "limit" if alloc.hard_limit_mib is None else f"hard limit (request {alloc.memory_mib} MiB)"
        out.append(
            (
                Kind.OVER_MEMORY,
                f"processes {_pids(pids)} use {used} MiB on {where}, over the {alloc.cap_mib} MiB {what}",
                pids,
            )
        )
    return out


def _pids(pids: tuple[int, ...]) -> str:
    return ",".join(map(str, pids))


def event(v: Violation, node: str, now: float) -> Request:
    """A Warning Event on the pod (core/v1 Event, so `kubectl describe pod` shows it)."""
    pod = v.pod
    return pod_event(
        namespace=pod.namespace, name=pod.name, uid=pod.uid, reason=REASONS[v.kind], message=v.message,
        node=node, now=now,
    )  # fmt: skip


def pod_event(
    *, namespace: str, name: str, uid: str, reason: str, message: str, node: str, now: float
) -> Request:
    """A Warning Event from this node's agent on a pod."""
    t = format_time(now)
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": name,
            "namespace": namespace,
            "uid": uid,
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": t,
        "lastTimestamp": t,
        "count": 1,
    }
    return Request("POST", paths.events(namespace), body)


def eviction(v: Violation) -> Request:
    """Evict the pod through the Eviction API, so PodDisruptionBudgets are respected."""
    return calls.eviction(v.pod.namespace, v.pod.name)


def list_pods(node: str) -> Request:
    """This node's gpupack pods (served from the apiserver's watch cache via resourceVersion=0)."""
    query: dict[str, str | int | bool] = {
        "fieldSelector": f"spec.nodeName={node}",
        "labelSelector": f"{names.LABEL_MANAGED}=true",
        "resourceVersion": "0",
    }
    return Request("GET", paths.pods(), query=query)
