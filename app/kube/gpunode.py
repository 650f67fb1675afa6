"""The GPUNode custom resource: typed spec/status (pydantic, its wire format), the placement view, its
heartbeat's freshness, and pure request builders.

Written by the agent (one object per node, name = node name), read by the extender's cache through
`read(obj).to_model_node()`; whether the heartbeat is fresh is judged by `Heartbeat` (the one place), at
each request.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    computed_field,
    field_validator,
)
from pydantic.alias_generators import to_camel

from app.core import catalog, names
from app.core.errors import FieldError, InputError
from app.core.isolation import ComputeEnforcement, MemoryEnforcement, Sharing
from app.core.model import MILLI_PER_GPU, Gpu, Node, mig_index
from app.kube import paths
from app.kube.calls import MERGE_PATCH, Request, parse_time

API_VERSION = f"{names.GPUNODE_GROUP}/{names.GPUNODE_VERSION}"
DEFAULT_HEARTBEAT_S = 30  # heartbeatIntervalSeconds of a status that does not say
STALE_FACTOR = 3  # a heartbeat older than this many intervals means "the agent is gone: do not place"
DEFAULT_STALE_AFTER_S = DEFAULT_HEARTBEAT_S * STALE_FACTOR

ISOLATION_MPS = "mps"
ISOLATION_NONE = "none"


def format_time(ts: float) -> str:
    """A Unix time as a Kubernetes Time (RFC 3339, seconds, Z)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def label_value(raw: str) -> str:
    """Any string as a valid label value (alphanumerics, '-', '_', '.', at most 63, alnum at both ends)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)[:63].strip("-_.")


def _unix_time(raw: Any) -> float:
    """heartbeatTime: an RFC 3339 string on the wire (a number when built in Python); "" means never."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return float(raw)
    if raw == "":
        return 0.0
    parsed = parse_time(raw) if isinstance(raw, str) else None
    if parsed is None:
        raise ValueError("must be an RFC 3339 time such as 2023-11-14T22:13:20Z")
    return parsed


_ACRONYMS = (("Mib", "MiB"), ("Uuid", "UUID"), ("Uid", "UID"))


def wire_name(field: str) -> str:
    """The CRD's name of a field: camelCase, with its acronyms as written there (memoryMiB, podUID)."""
    if field == "power_mw":
        return "powerMilliWatts"
    name = to_camel(field)
    for camel, acronym in _ACRONYMS:
        name = re.sub(camel + "(?![a-z])", acronym, name)
    return name


# Unix seconds in Python, a Kubernetes Time in JSON.
KubeTime = Annotated[float, BeforeValidator(_unix_time), PlainSerializer(format_time, when_used="json")]


class _Wire(BaseModel):
    """A part of the GPUNode resource: camelCase on the wire (as the CRD names it), snake_case here.

    Immutable. Scalars are strict: a string where the CRD says integer is an error naming the field, not
    a guess. Fields the CRD does not require have defaults, so an older agent's object still reads.
    """

    model_config = ConfigDict(frozen=True, alias_generator=wire_name, populate_by_name=True, extra="ignore")

    def wire(self) -> dict[str, Any]:
        """The JSON object the agent writes (absent optional readings are left out, never null)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _empty(value: str) -> bool:
    return not value


# --- spec ---


class MigDeviceSpec(_Wire):
    """One MIG device of a GPU in MIG mode: its own UUID, memory and profile; `index` is its NVML slot."""

    uuid: StrictStr = ""
    index: StrictInt = 0
    memory_mib: StrictInt = 0
    profile: StrictStr = ""


class GpuSpec(_Wire):
    """One GPU's inventory (changes only when hardware, MIG mode or MPS availability change)."""

    uuid: StrictStr
    index: StrictInt
    model: StrictStr  # catalogue name (app.core.catalog), else NVML's product name
    product_name: StrictStr = ""
    memory_mib: StrictInt
    mig_enabled: StrictBool = False
    mig_devices: tuple[MigDeviceSpec, ...] = ()
    mps_capable: StrictBool = False  # an MPS control daemon serves this GPU

    @computed_field  # type: ignore[prop-decorator]  # written for `kubectl get -o wide`; never read back
    @property
    def shared(self) -> bool:
        """Offered for fractional sharing; MIG-enabled GPUs are not: their MIG devices are offered whole."""
        return not self.mig_enabled

    @property
    def mig_targets(self) -> tuple[MigDeviceSpec, ...]:
        """The MIG devices placement may hand out whole (none unless the GPU is in MIG mode)."""
        return self.mig_devices if self.mig_enabled else ()


class GPUNodeSpec(_Wire):
    node_name: StrictStr
    driver_version: StrictStr = ""
    gpus: tuple[GpuSpec, ...]

    @property
    def shared_gpus(self) -> tuple[GpuSpec, ...]:
        return tuple(g for g in self.gpus if g.shared)

    @property
    def mig_gpus(self) -> tuple[GpuSpec, ...]:
        """GPUs in MIG mode with at least one MIG device."""
        return tuple(g for g in self.gpus if g.mig_targets)


# --- status ---


class ProcessStatus(_Wire):
    pid: StrictInt
    pod_uid: StrictStr  # "" for a process of no pod we could identify ("foreign")
    used_mib: StrictInt | None = None
    mig_uuid: StrictStr = Field(default="", exclude_if=_empty)


class GpuIsolation(_Wire):
    """What one whole GPU enforces between the pods sharing it (agent.report.isolation decides it)."""

    driver_version: StrictStr = ""
    compute_mode: StrictStr = ""  # NVML's: Default | ExclusiveProcess | Prohibited ("" could not be read)
    mps_mode: Sharing = Sharing.UNKNOWN  # exclusive | shared | off | closed (app.core.isolation.Sharing)
    memory: MemoryEnforcement = MemoryEnforcement.NONE  # none | client-env | daemon-default | per-cgroup
    compute: ComputeEnforcement = ComputeEnforcement.TIME_SLICE  # time-slice | mps-percentage


class GpuStatus(_Wire):
    """One GPU's live reading. Memory fields are None when NVML could not be read this time."""

    uuid: StrictStr
    index: StrictInt
    healthy: StrictBool
    reason: StrictStr = Field(default="", exclude_if=_empty)
    memory_used_mib: StrictInt | None = None
    memory_free_mib: StrictInt | None = None
    utilization_percent: StrictInt | None = None
    temperature_c: StrictInt | None = None
    power_mw: StrictInt | None = None
    # Memory used by processes that belong to no gpupack pod on this node (placement adds it to the
    # reservations); None when NVML gave no per-process memory this time.
    foreign_memory_mib: StrictInt | None = None
    processes: tuple[ProcessStatus, ...] = ()
    isolation: GpuIsolation | None = None  # None: a MIG-enabled GPU, or an agent from before it was reported


class MpsStatus(_Wire):
    state: StrictStr = "disabled"  # running | starting | backoff | unavailable | disabled
    isolation: StrictStr = ISOLATION_NONE  # what MPS pods on this node actually get: "mps" or "none"
    message: StrictStr = ""
    restarts: StrictInt = 0


class Summary(_Wire):
    """Node totals, so `kubectl get gpunodes` printer columns have plain fields to point at."""

    gpus: StrictInt = 0
    healthy_gpus: StrictInt = 0
    model: StrictStr = ""
    memory_total_mib: StrictInt = 0
    # Reserved by gpupack allocations on this node (from pod annotations).
    memory_allocated_mib: StrictInt = 0
    memory_used_mib: StrictInt = 0  # NVML's reading, whoever uses it
    # The weakest levels among the healthy shared GPUs ("" when none reports one): what every pod here gets.
    memory_enforcement: StrictStr = Field(default="", exclude_if=_empty)
    compute_enforcement: StrictStr = Field(default="", exclude_if=_empty)
    mps_modes: StrictStr = Field(
        default="", exclude_if=_empty
    )  # each GPU's mpsMode, by index: "exclusive,shared"


class GPUNodeStatus(_Wire):
    heartbeat_time: KubeTime = 0.0  # Unix time of the agent's last write (0: never); see `Heartbeat`
    heartbeat_interval_seconds: StrictInt = DEFAULT_HEARTBEAT_S
    # Readers treat a heartbeat older than this as "the agent is gone: do not place here".
    stale_after_seconds: StrictInt = DEFAULT_STALE_AFTER_S
    gpus: tuple[GpuStatus, ...] = ()
    mps: MpsStatus = MpsStatus()
    summary: Summary = Summary()
    env_device_selection: StrictStr = (
        "unknown"  # allowed | disabled | unknown: NVIDIA_VISIBLE_DEVICES honoured?
    )
    nvml_error: StrictStr = ""  # NVML failed for the whole node


# --- the whole object ---


class ObjectMeta(_Wire):
    """The parts of the apiserver's metadata we read (the rest: uid, managedFields... is ignored)."""

    name: StrictStr = ""
    resource_version: StrictStr = ""


class GPUNode(_Wire):
    """A GPUNode as served: metadata, spec, and status (None until the agent's first status write)."""

    metadata: ObjectMeta = ObjectMeta()
    spec: GPUNodeSpec
    status: GPUNodeStatus | None = None

    @field_validator("status", mode="before")
    @classmethod
    def _no_status_yet(cls, raw: Any) -> Any:
        return raw or None  # `status: {}` before the first write reads as no status

    @classmethod
    def of(cls, name: str, spec: GPUNodeSpec, status: GPUNodeStatus | None = None) -> GPUNode:
        return cls(metadata=ObjectMeta(name=name), spec=spec, status=status)

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def resource_version(self) -> str:
        return self.metadata.resource_version

    @property
    def heartbeat(self) -> Heartbeat:
        """The heartbeat by the agent's own limit (a reader with its own limit: `Heartbeat.of`)."""
        return Heartbeat.of(self.status)

    def to_model_node(self) -> Node:
        """The placement view: shared GPUs with foreign usage, live readings and health.

        Unschedulable when the node ignores NVIDIA_VISIBLE_DEVICES (gpupack could not give a pod its
        GPU); `mps` says whether `isolation: mps` pods get MPS here. Whether the agent is still there is
        the heartbeat's question, asked at the time of each request (`Heartbeat.stale_reason`).
        """
        status = self.status
        live = {g.uuid: g for g in status.gpus} if status else {}
        gpus = tuple(_model_gpu(g, live.get(g.uuid)) for g in self.spec.shared_gpus) + tuple(
            _model_mig(g, m, live.get(g.uuid)) for g in self.spec.mig_gpus for m in g.mig_targets
        )
        if status is None:
            return Node(name=self.name, gpus=gpus)
        reason = (
            ENV_SELECTION_DISABLED_REASON if status.env_device_selection == ENV_SELECTION_DISABLED else ""
        )
        mps = status.mps.isolation == ISOLATION_MPS
        return Node(
            name=self.name,
            gpus=gpus,
            schedulable=not reason,
            unschedulable_reason=reason,
            mps=mps,
            mps_reason="" if mps else f"MPS is {status.mps.state} on this node",
        )


def read(obj: Mapping[str, Any]) -> GPUNode:
    """A served GPUNode object; raises GPUNodeError naming the first field that breaks the CRD's types."""
    try:
        return GPUNode.model_validate(obj)
    except ValidationError as exc:
        raise GPUNodeError.of(obj, exc) from None


class GPUNodeError(InputError):
    """A GPUNode object that does not fit its schema (the CRD normally keeps such objects out)."""

    def __init__(self, name: str, error: FieldError) -> None:
        super().__init__([error], f"GPUNode {name or '(unnamed)'} does not fit its schema")
        self.name = name

    @property
    def error(self) -> FieldError:
        return self.errors[0]

    @classmethod
    def of(cls, obj: Mapping[str, Any], exc: ValidationError) -> GPUNodeError:
        """The first field pydantic found wrong (absent: value None), by its path in the object."""
        first = exc.errors(include_url=False)[0]
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        where = ".".join(str(p) for p in first["loc"])
        if first["type"] == "missing":
            error = FieldError(where, None, "is required")
        else:
            error = FieldError(where, first.get("input"), first["msg"])
        return cls(name if isinstance(name, str) else "", error)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """When a node's agent last wrote its status, and how long that write vouches for the node.

    The one judgement of staleness: the extender's cache, `gpupack explain`/`top` and repack (through
    the cache) all ask `stale_reason(now)`.
    """

    at: float | None  # Unix time of the last status write; None: never
    limit_s: float  # older than this: the agent is gone, place nothing there

    @classmethod
    def of(cls, status: GPUNodeStatus | None, timeout_s: float | None = None) -> Heartbeat:
        """By `timeout_s` (the extender's --heartbeat-timeout) when set, else the agent's own limit."""
        own = status.stale_after_seconds if status else 0
        return cls(
            status.heartbeat_time or None if status else None, timeout_s or own or DEFAULT_STALE_AFTER_S
        )

    @property
    def fresh_until(self) -> float:
        """The Unix time the heartbeat goes stale (-inf: it never was fresh)."""
        return -math.inf if self.at is None else self.at + self.limit_s

    def stale_reason(self, now: float) -> str:
        """Why the node must not get gpupack pods because of its agent's heartbeat ("" when it is fresh)."""
        if self.at is None:
            return "gpupack agent has not reported a heartbeat"
        age = now - self.at
        if age <= self.limit_s:
            return ""
        # Rounded up, so the message never reads "6s old (limit 6s)" for 6.4 s.
        return f"gpupack agent heartbeat is {math.ceil(age)}s old (limit {self.limit_s:g}s)"


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
        sharing=live.isolation.mps_mode if live and live.isolation else Sharing.UNKNOWN,
        memory_enforcement=live.isolation.memory if live and live.isolation else MemoryEnforcement.NONE,
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
        gpus=tuple(
            GpuSpec(uuid=u, index=i, model=model, product_name=model, memory_mib=memory, mps_capable=mps)
            for i, u in enumerate(uuids)
        ),
    )
    free = memory if live_memory else None
    status = GPUNodeStatus(
        heartbeat_time=heartbeat,
        gpus=tuple(
            GpuStatus(uuid=u, index=i, healthy=True, memory_free_mib=free) for i, u in enumerate(uuids)
        ),
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
    body = {"apiVersion": API_VERSION, "kind": names.GPUNODE_KIND, "metadata": meta, "spec": spec.wire()}
    return Request("POST", paths.gpunodes(), body)


def patch_spec(name: str, spec: GPUNodeSpec) -> Request:
    return Request("PATCH", paths.gpunode(name), {"spec": spec.wire()}, content_type=MERGE_PATCH)


def patch_status(name: str, status: GPUNodeStatus) -> Request:
    """Merge-patch the whole status (every key is always present, lists are replaced whole)."""
    return Request("PATCH", paths.gpunode_status(name), {"status": status.wire()}, content_type=MERGE_PATCH)


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
