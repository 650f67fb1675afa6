"""The GPUNode custom resource: typed spec/status, dict round-trips, and pure request builders.

Written by the agent (one object per node, name = node name), read by the extender through
`GPUNode.from_dict(obj).to_model_node(now)`; staleness is judged by `stale_reason` at each request.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from app import catalog, names
from app.kube import paths
from app.kube.calls import MERGE_PATCH, Request, parse_time
from app.model import MILLI_PER_GPU, Gpu, Node, mig_index

API_VERSION = f"{names.GPUNODE_GROUP}/{names.GPUNODE_VERSION}"
DEFAULT_HEARTBEAT_S = 30
STALE_FACTOR = 3  # a heartbeat older than this many intervals means "the agent is gone: do not place"

ISOLATION_MPS = "mps"
ISOLATION_NONE = "none"


def format_time(ts: float) -> str:
    """A Unix time as a Kubernetes Time (RFC 3339, seconds, Z)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def label_value(raw: str) -> str:
    """Any string as a valid label value (alphanumerics, '-', '_', '.', at most 63, alnum at both ends)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)[:63].strip("-_.")


def _get(d: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    v = d.get(key, default)
    return v if isinstance(v, kind) and not (kind is int and isinstance(v, bool)) else default


# --- spec ---


@dataclass(frozen=True, slots=True)
class MigDeviceSpec:
    """One MIG device of a GPU in MIG mode: its own UUID, memory and profile; `index` is its NVML slot."""

    uuid: str
    index: int
    memory_mib: int
    profile: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "index": self.index, "memoryMiB": self.memory_mib, "profile": self.profile}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MigDeviceSpec:
        return cls(
            _get(d, "uuid", str, ""),
            _get(d, "index", int, 0),
            _get(d, "memoryMiB", int, 0),
            _get(d, "profile", str, ""),
        )


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU's inventory (changes only when hardware, MIG mode or MPS availability change)."""

    uuid: str
    index: int
    model: str  # catalogue name (app.catalog), else NVML's product name
    product_name: str
    memory_mib: int
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceSpec, ...] = ()
    mps_capable: bool = False  # an MPS control daemon serves this GPU

    @property
    def shared(self) -> bool:
        """Offered for fractional sharing; MIG-enabled GPUs are not: their MIG devices are offered whole."""
        return not self.mig_enabled

    @property
    def mig_targets(self) -> tuple[MigDeviceSpec, ...]:
        """The MIG devices placement may hand out whole (none unless the GPU is in MIG mode)."""
        return self.mig_devices if self.mig_enabled else ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "model": self.model,
            "productName": self.product_name,
            "memoryMiB": self.memory_mib,
            "migEnabled": self.mig_enabled,
            "migDevices": [m.to_dict() for m in self.mig_devices],
            "mpsCapable": self.mps_capable,
            "shared": self.shared,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuSpec:
        return cls(
            uuid=_get(d, "uuid", str, ""),
            index=_get(d, "index", int, 0),
            model=_get(d, "model", str, ""),
            product_name=_get(d, "productName", str, ""),
            memory_mib=_get(d, "memoryMiB", int, 0),
            mig_enabled=_get(d, "migEnabled", bool, False),
            mig_devices=tuple(MigDeviceSpec.from_dict(m) for m in _get(d, "migDevices", list, [])),
            mps_capable=_get(d, "mpsCapable", bool, False),
        )


@dataclass(frozen=True, slots=True)
class GPUNodeSpec:
    node_name: str
    driver_version: str = ""
    gpus: tuple[GpuSpec, ...] = ()

    @property
    def shared_gpus(self) -> tuple[GpuSpec, ...]:
        return tuple(g for g in self.gpus if g.shared)

    @property
    def mig_gpus(self) -> tuple[GpuSpec, ...]:
        """GPUs in MIG mode with at least one MIG device."""
        return tuple(g for g in self.gpus if g.mig_targets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodeName": self.node_name,
            "driverVersion": self.driver_version,
            "gpus": [g.to_dict() for g in self.gpus],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GPUNodeSpec:
        return cls(
            node_name=_get(d, "nodeName", str, ""),
            driver_version=_get(d, "driverVersion", str, ""),
            gpus=tuple(GpuSpec.from_dict(g) for g in _get(d, "gpus", list, []) if isinstance(g, dict)),
        )


# --- status ---


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    pid: int
    pod_uid: str  # "" when the process belongs to no pod we could identify (a "foreign" process)
    used_mib: int | None = None
    mig_uuid: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": self.pid, "podUID": self.pod_uid}
        if self.used_mib is not None:
            out["usedMiB"] = self.used_mib
        if self.mig_uuid:
            out["migUUID"] = self.mig_uuid
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProcessStatus:
        used = d.get("usedMiB")
        return cls(
            pid=_get(d, "pid", int, 0),
            pod_uid=_get(d, "podUID", str, ""),
            used_mib=used if isinstance(used, int) else None,
            mig_uuid=_get(d, "migUUID", str, ""),
        )


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """One GPU's live reading. Memory fields are None when NVML could not be read this time."""

    uuid: str
    index: int
    healthy: bool = True
    reason: str = ""
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    utilization_percent: int | None = None
    temperature_c: int | None = None
    power_mw: int | None = None
    processes: tuple[ProcessStatus, ...] = ()
    # Memory used by processes that belong to no gpupack pod on this node (placement adds it to the
    # reservations); None when NVML gave no per-process memory this time.
    foreign_memory_mib: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uuid": self.uuid, "index": self.index, "healthy": self.healthy}
        if self.reason:
            out["reason"] = self.reason
        for key, v in (
            ("memoryUsedMiB", self.memory_used_mib),
            ("memoryFreeMiB", self.memory_free_mib),
            ("utilizationPercent", self.utilization_percent),
            ("temperatureC", self.temperature_c),
            ("powerMilliWatts", self.power_mw),
            ("foreignMemoryMiB", self.foreign_memory_mib),
        ):
            if v is not None:
                out[key] = v
        out["processes"] = [p.to_dict() for p in self.processes]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuStatus:
        def opt(key: str) -> int | None:
            v = d.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else None

        return cls(
            uuid=_get(d, "uuid", str, ""),
            index=_get(d, "index", int, 0),
            healthy=_get(d, "healthy", bool, False),
            reason=_get(d, "reason", str, ""),
            memory_used_mib=opt("memoryUsedMiB"),
            memory_free_mib=opt("memoryFreeMiB"),
            utilization_percent=opt("utilizationPercent"),
            temperature_c=opt("temperatureC"),
            power_mw=opt("powerMilliWatts"),
            foreign_memory_mib=opt("foreignMemoryMiB"),
            processes=tuple(
                ProcessStatus.from_dict(p) for p in _get(d, "processes", list, []) if isinstance(p, dict)
            ),
        )


@dataclass(frozen=True, slots=True)
class MpsStatus:
    state: str = "disabled"  # running | starting | backoff | unavailable | disabled
    isolation: str = ISOLATION_NONE  # what MPS pods on this node actually get: "mps" or "none"
    message: str = ""
    restarts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "isolation": self.isolation,
            "message": self.message,
            "restarts": self.restarts,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MpsStatus:
        return cls(
            state=_get(d, "state", str, "disabled"),
            isolation=_get(d, "isolation", str, ISOLATION_NONE),
            message=_get(d, "message", str, ""),
            restarts=_get(d, "restarts", int, 0),
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """Node totals, so `kubectl get gpunodes` printer columns have plain fields to point at."""

    gpus: int = 0
    healthy_gpus: int = 0
    model: str = ""
    memory_total_mib: int = 0
    memory_allocated_mib: int = 0  # reserved by gpupack allocations on this node (from pod annotations)
    memory_used_mib: int = 0  # NVML's reading, whoever uses it

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "healthyGpus": self.healthy_gpus,
            "model": self.model,
            "memoryTotalMiB": self.memory_total_mib,
            "memoryAllocatedMiB": self.memory_allocated_mib,
            "memoryUsedMiB": self.memory_used_mib,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Summary:
        return cls(
            gpus=_get(d, "gpus", int, 0),
            healthy_gpus=_get(d, "healthyGpus", int, 0),
            model=_get(d, "model", str, ""),
            memory_total_mib=_get(d, "memoryTotalMiB", int, 0),
            memory_allocated_mib=_get(d, "memoryAllocatedMiB", int, 0),
            memory_used_mib=_get(d, "memoryUsedMiB", int, 0),
        )


@dataclass(frozen=True, slots=True)
class GPUNodeStatus:
    heartbeat_time: float  # Unix time of the agent's last write; see `stale_after_seconds`
    heartbeat_interval_seconds: int = DEFAULT_HEARTBEAT_S
    # Readers treat a heartbeat older than this as "the agent is gone: do not place here".
    stale_after_seconds: int = DEFAULT_HEARTBEAT_S * STALE_FACTOR
    gpus: tuple[GpuStatus, ...] = ()
    mps: MpsStatus = field(default_factory=MpsStatus)
    summary: Summary = field(default_factory=Summary)
    env_device_selection: str = "unknown"  # allowed | disabled | unknown: NVIDIA_VISIBLE_DEVICES honoured?
    nvml_error: str = ""  # NVML failed for the whole node

    def to_dict(self) -> dict[str, Any]:
        return {
            "heartbeatTime": format_time(self.heartbeat_time),
            "heartbeatIntervalSeconds": self.heartbeat_interval_seconds,
            "staleAfterSeconds": self.stale_after_seconds,
            "gpus": [g.to_dict() for g in self.gpus],
            "mps": self.mps.to_dict(),
            "summary": self.summary.to_dict(),
            "envDeviceSelection": self.env_device_selection,
            "nvmlError": self.nvml_error,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GPUNodeStatus:
        return cls(
            heartbeat_time=parse_time(_get(d, "heartbeatTime", str, "")) or 0.0,
            heartbeat_interval_seconds=_get(d, "heartbeatIntervalSeconds", int, DEFAULT_HEARTBEAT_S),
            stale_after_seconds=_get(d, "staleAfterSeconds", int, DEFAULT_HEARTBEAT_S * STALE_FACTOR),
            gpus=tuple(GpuStatus.from_dict(g) for g in _get(d, "gpus", list, []) if isinstance(g, dict)),
            mps=MpsStatus.from_dict(_get(d, "mps", dict, {})),
            summary=Summary.from_dict(_get(d, "summary", dict, {})),
            env_device_selection=_get(d, "envDeviceSelection", str, "unknown"),
            nvml_error=_get(d, "nvmlError", str, ""),
        )


# --- the whole object ---


@dataclass(frozen=True, slots=True)
class GPUNode:
    name: str
    spec: GPUNodeSpec
    status: GPUNodeStatus | None = None  # None until the agent's first status write
    resource_version: str = ""

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> GPUNode:
        meta = _get(obj, "metadata", dict, {})
        raw_status = obj.get("status")
        return cls(
            name=_get(meta, "name", str, ""),
            spec=GPUNodeSpec.from_dict(_get(obj, "spec", dict, {})),
            status=GPUNodeStatus.from_dict(raw_status)
            if isinstance(raw_status, dict) and raw_status
            else None,
            resource_version=_get(meta, "resourceVersion", str, ""),
        )

    def to_model_node(self, now: float) -> Node:
        """The placement view: shared GPUs with foreign usage, live readings and health.

        Unschedulable when the heartbeat is stale or the node ignores NVIDIA_VISIBLE_DEVICES (gpupack
        could not give a pod its GPU); `mps` says whether `isolation: mps` pods get MPS here.
        """
        status = self.status
        live = {g.uuid: g for g in status.gpus} if status else {}
        gpus = tuple(_model_gpu(g, live.get(g.uuid)) for g in self.spec.shared_gpus) + tuple(
            _model_mig(g, m, live.get(g.uuid)) for g in self.spec.mig_gpus for m in g.mig_targets
        )
        if status is None:
            return Node(
                name=self.name, gpus=gpus, schedulable=False, unschedulable_reason=stale_reason(None, 0, now)
            )
        reason = stale_reason(status.heartbeat_time or None, status.stale_after_seconds, now)
        if not reason and status.env_device_selection == ENV_SELECTION_DISABLED:
            reason = ENV_SELECTION_DISABLED_REASON
        mps = status.mps.isolation == ISOLATION_MPS
        return Node(
            name=self.name,
            gpus=gpus,
            schedulable=not reason,
            unschedulable_reason=reason,
            mps=mps,
            mps_reason="" if mps else f"MPS is {status.mps.state} on this node",
        )


ENV_SELECTION_DISABLED = "disabled"
ENV_SELECTION_DISABLED_REASON = (
    "the NVIDIA container toolkit on this node ignores NVIDIA_VISIBLE_DEVICES for unprivileged containers"
    " (accept-nvidia-visible-devices-envvar-when-unprivileged = false), so gpupack cannot select GPUs here"
)


def _model_gpu(spec: GpuSpec, live: GpuStatus | None) -> Gpu:
    return Gpu(
        index=spec.index,
        model=spec.model,
        memory_mib=spec.memory_mib,
        uuid=spec.uuid,
        foreign_mib=max(0, live.foreign_memory_mib or 0) if live else 0,
        live_free_mib=live.memory_free_mib if live else None,
        utilization_percent=live.utilization_percent if live else None,
        healthy=live is not None and live.healthy,
    )


def _model_mig(parent: GpuSpec, mig: MigDeviceSpec, live: GpuStatus | None) -> Gpu:
    """A MIG device as a placement target: the parent's model and health, its own UUID, memory and profile.

    Foreign memory is what processes of no gpupack pod use on this MIG device.
    """
    foreign = (
        sum(p.used_mib or 0 for p in live.processes if p.mig_uuid == mig.uuid and not p.pod_uid)
        if live
        else 0
    )
    return Gpu(
        index=mig_index(parent.index, mig.index),
        model=parent.model,
        memory_mib=mig.memory_mib,
        uuid=mig.uuid,
        foreign_mib=foreign,
        healthy=live is not None and live.healthy,
        mig_profile=mig.profile or f"{mig.memory_mib}mib",  # a profile NVML did not name: by its memory
        parent=parent.index,
    )


def stale_reason(heartbeat: float | None, limit_s: float, now: float) -> str:
    """Why a node must not get gpupack pods because of its agent's heartbeat ("" when it is fresh)."""
    if heartbeat is None:
        return "gpupack agent has not reported a heartbeat"
    age = now - heartbeat
    if age <= limit_s:
        return ""
    # Rounded up, so the message never reads "6s old (limit 6s)" for 6.4 s.
    return f"gpupack agent heartbeat is {math.ceil(age)}s old (limit {limit_s:g}s)"


def idle(
    node_name: str, model: str, count: int, heartbeat: float, *, mps: bool = False, live_memory: bool = True
) -> tuple[GPUNodeSpec, GPUNodeStatus]:
    """The GPUNode a healthy agent reports for `count` idle GPUs of a catalogue model (UUIDs from the name).

    For rigs and benchmarks that run no agent; `live_memory=False` publishes no NVML memory reading.
    """
    memory = catalog.lookup(model).memory_mib
    uuids = [f"GPU-{node_name}-{i}" for i in range(count)]
    spec = GPUNodeSpec(
        node_name=node_name,
        gpus=tuple(GpuSpec(u, i, model, model, memory, mps_capable=mps) for i, u in enumerate(uuids)),
    )
    free = memory if live_memory else None
    status = GPUNodeStatus(
        heartbeat_time=heartbeat,
        gpus=tuple(GpuStatus(u, i, True, memory_free_mib=free) for i, u in enumerate(uuids)),
    )
    return spec, status


# --- what the node advertises ---


def node_model(spec: GPUNodeSpec) -> str:
    """The node's model label: the most common model among its shared and MIG GPUs (first seen wins a tie)."""
    offered = spec.shared_gpus + spec.mig_gpus
    if not offered:
        return ""
    return Counter(g.model for g in offered).most_common(1)[0][0]


def _target_sizes(spec: GPUNodeSpec, healthy_uuids: frozenset[str] | None = None) -> list[int]:
    """Memory of every placement target: shared GPUs and the MIG devices of GPUs in MIG mode."""

    def ok(g: GpuSpec) -> bool:
        return healthy_uuids is None or g.uuid in healthy_uuids

    return [g.memory_mib for g in spec.shared_gpus if ok(g)] + [
        m.memory_mib for g in spec.mig_gpus if ok(g) for m in g.mig_targets
    ]


def node_labels(spec: GPUNodeSpec) -> dict[str, str]:
    sizes = _target_sizes(spec)
    return {
        names.NODE_LABEL_ENABLED: "true" if sizes else "false",
        names.NODE_LABEL_GPU_MODEL: label_value(node_model(spec)),
        names.NODE_LABEL_GPU_MEMORY_MAX_MIB: str(max(sizes, default=0)),
    }


def extended_resources(spec: GPUNodeSpec, healthy_uuids: frozenset[str]) -> dict[str, str]:
    """Node-status quantities: 1000 milli and its memory for each healthy shared GPU and MIG device."""
    sizes = _target_sizes(spec, healthy_uuids)
    return {
        names.RESOURCE_GPU_MILLI: str(MILLI_PER_GPU * len(sizes)),
        names.RESOURCE_GPU_MEMORY_MIB: str(sum(sizes)),
    }


# --- request builders ---


def create(name: str, spec: GPUNodeSpec, node_uid: str = "") -> Request:
    """POST a new GPUNode; owned by its Node (when the node's UID is known) so it goes when the node goes."""
    meta: dict[str, Any] = {"name": name}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
    body = {"apiVersion": API_VERSION, "kind": names.GPUNODE_KIND, "metadata": meta, "spec": spec.to_dict()}
    return Request("POST", paths.gpunodes(), body)


def patch_spec(name: str, spec: GPUNodeSpec) -> Request:
    return Request("PATCH", paths.gpunode(name), {"spec": spec.to_dict()}, content_type=MERGE_PATCH)


def patch_status(name: str, status: GPUNodeStatus) -> Request:
    """Merge-patch the whole status (every key is always present, lists are replaced whole)."""
    return Request(
        "PATCH", paths.gpunode_status(name), {"status": status.to_dict()}, content_type=MERGE_PATCH
    )


def patch_node_labels(name: str, labels: Mapping[str, str]) -> Request:
    return Request(
        "PATCH", paths.node(name), {"metadata": {"labels": dict(labels)}}, content_type=MERGE_PATCH
    )


def patch_node_capacity_changed(name: str, at: float) -> Request:
    """Bump the Node annotation whose change makes kube-scheduler retry pods it could not place."""
    body = {"metadata": {"annotations": {names.NODE_ANNOTATION_CAPACITY_CHANGED: format_time(at)}}}
    return Request("PATCH", paths.node(name), body, content_type=MERGE_PATCH)


def patch_node_resources(name: str, resources: Mapping[str, str]) -> Request:
    """Set capacity and allocatable for our extended resources (the kubelet drops them on re-register)."""
    body = {"status": {"capacity": dict(resources), "allocatable": dict(resources)}}
    return Request("PATCH", paths.node_status(name), body, content_type=MERGE_PATCH)
