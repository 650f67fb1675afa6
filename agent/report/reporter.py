"""Publish GPUNode spec/status, node labels and extended resources, on change (rate-limited) and heartbeat."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent.nvml.base import ComputeMode
from agent.nvml.sample import GpuSample, NodeSample
from agent.report import isolation as iso
from app.core import log
from app.core.errors import KubeError
from app.core.pods import PodInfo
from app.kube import gpunode
from app.kube.calls import Request
from app.kube.gpunode import (
    GpuIsolation,
    GPUNodeSpec,
    GPUNodeStatus,
    GpuSpec,
    GpuStatus,
    MigDeviceSpec,
    MpsStatus,
    ProcessStatus,
    Summary,
)

_log = log.get("gpupack.agent.reporter")

Send = Callable[[Request], dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReporterConfig:
    """The reporter's cadence, from the agent's settings (their defaults are written there only)."""

    heartbeat_s: int  # status + node resources are written at least this often
    min_interval_s: float  # no two status writes closer than this, however much changes
    memory_threshold_mib: int  # a GPU's used memory must move this much to count as a change

    @property
    def stale_after_s(self) -> int:
        return self.heartbeat_s * gpunode.STALE_FACTOR


# --- sample → GPUNode (pure) ---


def build_spec(
    node: str, sample: NodeSample, mps_capable: bool, previous: GPUNodeSpec | None = None
) -> GPUNodeSpec:
    """Inventory from a sample; a GPU that cannot be read keeps its last known entry."""
    before = {g.index: g for g in previous.gpus} if previous else {}
    gpus: list[GpuSpec] = []
    for g in sample.gpus:
        if not g.memory_total_mib and g.index in before:
            gpus.append(before[g.index])
            continue
        gpus.append(
            GpuSpec(
                uuid=g.uuid,
                index=g.index,
                model=g.model,
                product_name=g.product_name,
                memory_mib=g.memory_total_mib,
                mig_enabled=g.mig_enabled,
                mig_devices=tuple(
                    MigDeviceSpec(
                        uuid=m.uuid, index=m.mig_index, memory_mib=m.memory_total_mib, profile=m.profile
                    )
                    for m in g.mig_devices
                ),
                mps_capable=mps_capable and not g.mig_enabled,
            )
        )
    if sample.error and previous:  # NVML down for the whole node: keep the inventory we had
        return previous
    return GPUNodeSpec(
        node_name=node,
        driver_version=sample.driver_version or (previous.driver_version if previous else ""),
        gpus=tuple(gpus),
    )


def foreign_mib(g: GpuSample, owners: Mapping[int, str], gpupack_pods: Collection[str]) -> int | None:
    """Memory on a shared GPU used by processes of no gpupack pod (None: NVML gave no per-process memory).

    Those are processes outside any pod, or in pods of other device plugins; gpupack pods' own usage is
    already covered by their reservations, so placement must not count it again.
    """
    if g.mig_enabled or g.memory_used_mib is None:
        return None
    procs = [p for p in g.processes if owners.get(p.pid, "") not in gpupack_pods]
    if any(p.used_mib is None for p in procs):
        return None
    return sum(p.used_mib or 0 for p in procs)


def _gpu_status(
    g: GpuSample, owners: Mapping[int, str], gpupack_pods: Collection[str], isolation: GpuIsolation | None
) -> GpuStatus:
    return GpuStatus(
        uuid=g.uuid,
        index=g.index,
        healthy=g.healthy,
        reason=g.reason,
        memory_used_mib=g.memory_used_mib,
        memory_free_mib=g.memory_free_mib,
        utilization_percent=g.utilization_percent,
        temperature_c=g.temperature_c,
        power_mw=g.power_mw,
        processes=tuple(
            ProcessStatus(pid=p.pid, pod_uid=owners.get(p.pid, ""), used_mib=p.used_mib, mig_uuid=p.mig_uuid)
            for p in g.processes
        ),
        foreign_memory_mib=foreign_mib(g, owners, gpupack_pods),
        isolation=isolation,
    )


def allocated_mib(pods: Mapping[str, PodInfo]) -> int:
    """Memory reserved on this node by gpupack allocations (per-device MiB times devices)."""
    return sum(p.allocation.memory_mib * len(p.allocation.gpu_indexes) for p in pods.values() if p.allocation)


def build_status(
    *,
    spec: GPUNodeSpec,
    sample: NodeSample,
    owners: Mapping[int, str],
    gpupack_pods: Collection[str] = (),
    mps: MpsStatus,
    allocated: int,
    now: float,
    config: ReporterConfig,
    env_device_selection: str = "unknown",
    node_facts: iso.NodeFacts = iso.NO_NODE_FACTS,
    mps_server: bool,
    mps_defaults_current: bool,
) -> GPUNodeStatus:
    """`mps_server`: an MPS server ran when the agent last asked the daemon (MpsSupervisor.server_running);
    `mps_defaults_current`: no server runs with the daemon's earlier defaults (MpsSupervisor.stale_server)."""
    serving = mps.isolation == gpunode.ISOLATION_MPS
    # A server started before the daemon's memory cap was set does not have it: no daemon-wide cap to claim.
    node_facts = replace(node_facts, daemon_memory_cap=node_facts.daemon_memory_cap and mps_defaults_current)

    def isolation(g: GpuSample) -> GpuIsolation | None:  # a MIG device is its own hardware partition
        if g.mig_enabled:
            return None
        # Measured: EXCLUSIVE_PROCESS refuses a plain process only while a server runs; with none, the first
        # plain process takes the GPU and MPS clients wait. So such a GPU is taken as one without MPS
        # (`closed`), never `exclusive`, until a server runs.
        serves = serving and (mps_server or g.compute_mode is not ComputeMode.EXCLUSIVE_PROCESS)
        return iso.decide(node_facts.of(g.compute_mode, serves, sample.driver_version))

    gpus = tuple(_gpu_status(g, owners, gpupack_pods, isolation(g)) for g in sample.gpus)
    if sample.error:  # no reading at all: every known GPU is unhealthy, with NVML's reason
        gpus = tuple(
            GpuStatus(uuid=g.uuid, index=g.index, healthy=False, reason=sample.error) for g in spec.gpus
        )
    summary = Summary(
        gpus=len(spec.gpus),
        healthy_gpus=sum(1 for g in gpus if g.healthy),
        model=gpunode.node_model(spec) or (spec.gpus[0].model if spec.gpus else ""),
        memory_total_mib=sum(g.memory_mib for g in spec.gpus),
        memory_allocated_mib=allocated,
        memory_used_mib=sum(g.memory_used_mib or 0 for g in gpus),
    )
    memory, compute = iso.weakest([g.isolation for g in gpus if g.healthy and g.isolation])
    modes = ",".join(g.isolation.mps_mode.value for g in gpus if g.isolation)  # a printer column: one string
    summary = summary.model_copy(
        update={"memory_enforcement": memory, "compute_enforcement": compute, "mps_modes": modes}
    )
    return GPUNodeStatus(
        heartbeat_time=now,
        heartbeat_interval_seconds=config.heartbeat_s,
        stale_after_seconds=config.stale_after_s,
        gpus=gpus,
        mps=mps,
        summary=summary,
        env_device_selection=env_device_selection,
        nvml_error=sample.error,
    )


def significant_change(old: GPUNodeStatus | None, new: GPUNodeStatus, threshold_mib: int) -> str:
    """Why `new` is worth writing before the next heartbeat ("" if it is not): anything but small drift."""
    if old is None:
        return "first status"
    if len(old.gpus) != len(new.gpus):
        return "GPU count"
    for a, b in zip(old.gpus, new.gpus, strict=True):
        if (a.uuid, a.healthy, a.reason) != (b.uuid, b.healthy, b.reason):
            return f"GPU {b.index} health"
        if {(p.pid, p.pod_uid) for p in a.processes} != {(p.pid, p.pod_uid) for p in b.processes}:
            return f"GPU {b.index} processes"
        if a.isolation != b.isolation:
            return f"GPU {b.index} isolation"
        if (a.memory_used_mib is None) != (b.memory_used_mib is None) or abs(
            (a.memory_used_mib or 0) - (b.memory_used_mib or 0)
        ) >= threshold_mib:
            return f"GPU {b.index} memory"
    if old.mps != new.mps:
        return "MPS"
    if (old.env_device_selection, old.nvml_error, old.summary.memory_allocated_mib) != (
        new.env_device_selection,
        new.nvml_error,
        new.summary.memory_allocated_mib,
    ):
        return "node"
    return ""


def capacity_grew(
    old: GPUNodeStatus | None, new: GPUNodeStatus, threshold_mib: int, stale_after_s: int
) -> str:
    """Why the node can now take pods it could not before ("" if it cannot): worth a scheduler retry.

    Pods the extender turned down are only retried by kube-scheduler on a cluster event; GPUNode
    changes are not one, so the agent turns these into a Node annotation change.
    """
    if old is None:
        return "agent started"
    if new.heartbeat_time - old.heartbeat_time > stale_after_s:
        return "heartbeat resumed"
    for a, b in zip(old.gpus, new.gpus, strict=False):
        if b.healthy and not a.healthy:
            return f"GPU {b.index} healthy"
        if a.isolation != b.isolation:  # e.g. switched to EXCLUSIVE_PROCESS: pods of that mode fit now
            return f"GPU {b.index} isolation"
        before, after = a.memory_used_mib, b.memory_used_mib
        if before is not None and after is not None and before - after >= threshold_mib:
            return f"GPU {b.index} memory freed"
    return ""


# --- writing ---


@dataclass(slots=True)
class Reporter:
    """Holds what was last written and decides, each tick, what (if anything) to write.

    Per node, in steady state: one GPUNode status patch and one Node status patch per heartbeat.
    A significant change is written at once unless a status write happened within `min_interval_s`,
    in which case it is written as soon as that interval has passed. Labels are re-checked against the
    Node object returned by the status patch and rewritten only if they differ.
    """

    node: str
    send: Send
    config: ReporterConfig
    on_write: Callable[[str, str], None] = lambda _kind, _outcome: None  # (kind, "ok"|"error")
    _spec: GPUNodeSpec | None = None  # last spec known to be stored
    _exists: bool = False
    _node_uid: str = ""
    _status: GPUNodeStatus | None = None  # last status written
    _status_at: float = float("-inf")
    _node_at: float = float("-inf")
    _labels: dict[str, str] = field(default_factory=dict)
    _resources: dict[str, str] = field(default_factory=dict)

    _retry_at: dict[str, float] = field(default_factory=dict)  # kind → earliest retry after a failure

    @property
    def last_heartbeat(self) -> float | None:
        return self._status.heartbeat_time if self._status else None

    def tick(self, spec: GPUNodeSpec, status: GPUNodeStatus, now: float) -> list[str]:
        """Write what is due and return the kinds written; a KubeError is logged and retried later."""
        written: list[str] = []
        heartbeat_due = now - self._status_at >= self.config.heartbeat_s
        calm = now - self._status_at >= self.config.min_interval_s
        labels = gpunode.node_labels(spec)
        resources = gpunode.extended_resources(spec, frozenset(g.uuid for g in status.gpus if g.healthy))
        node_changed = labels != self._labels or resources != self._resources or not self._node_uid
        node_due = now - self._node_at >= self.config.heartbeat_s or (
            node_changed and now - self._node_at >= self.config.min_interval_s
        )
        if node_due and self._may("node", now) and self._write_node(labels, resources, now):
            written.append("node")
        if not self._exists or spec != self._spec:
            if not self._may("spec", now):
                return written
            if not self._write_spec(spec, now):
                return written
            written.append("spec")
        why = significant_change(self._status, status, self.config.memory_threshold_mib)
        due = (heartbeat_due or (why and calm)) and self._may("status", now)
        if due and self._write("status", gpunode.patch_status(self.node, status), now) is not None:
            grew = capacity_grew(
                self._status, status, self.config.memory_threshold_mib, self.config.stale_after_s
            )
            self._status, self._status_at = status, now
            written.append("status")
            # After the status, so the extender already sees the room when the scheduler retries.
            if grew and self._write(
                "node_capacity", gpunode.patch_node_capacity_changed(self.node, now), now
            ):
                _log.info("capacity grew; nudging the scheduler", extra={"node": self.node, "why": grew})
                written.append("node_capacity")
        return written

    def _may(self, kind: str, now: float) -> bool:
        return now >= self._retry_at.get(kind, float("-inf"))

    def _write(self, kind: str, req: Request, now: float) -> dict[str, Any] | None:
        try:
            out = self.send(req)
        except KubeError as exc:
            self._failed(kind, exc, now)
            if kind == "status" and exc.is_not_found:
                self._exists = False  # someone deleted our GPUNode: recreate it next tick
            return None
        self.on_write(kind, "ok")
        self._retry_at.pop(self._group(kind), None)
        return out

    @staticmethod
    def _group(kind: str) -> str:
        return {"node_status": "node", "node_labels": "node", "node_capacity": "node", "create": "spec"}.get(
            kind, kind
        )

    def _failed(self, kind: str, exc: KubeError, now: float) -> None:
        # A failed write is retried after min_interval, not on every tick.
        self.on_write(kind, "error")
        self._retry_at[self._group(kind)] = now + self.config.min_interval_s
        _log.warning(
            "write failed", extra={"kind": kind, "code": exc.code, "reason": exc.reason, "error": exc.message}
        )

    def _write_node(self, labels: dict[str, str], resources: dict[str, str], now: float) -> bool:
        node = self._write("node_status", gpunode.patch_node_resources(self.node, resources), now)
        if node is None:
            return False
        self._resources, self._node_at = resources, now
        meta = node.get("metadata", {})
        self._node_uid = str(meta.get("uid", ""))
        current = meta.get("labels") or {}
        stale = any(current.get(k) != v for k, v in labels.items())
        if stale and self._write("node_labels", gpunode.patch_node_labels(self.node, labels), now) is None:
            return False
        self._labels = labels
        return True

    def _write_spec(self, spec: GPUNodeSpec, now: float) -> bool:
        if not self._exists:
            try:
                self.send(gpunode.create(self.node, spec, self._node_uid))
            except KubeError as exc:
                if not exc.is_conflict:  # 404 here usually means the CRD is not installed
                    self._failed("create", exc, now)
                    return False
                self.on_write("create", "conflict")  # it exists (agent restart): patch its spec below
            else:
                self.on_write("create", "ok")
                self._exists, self._spec, self._status = True, spec, None
                return True
        if self._write("spec", gpunode.patch_spec(self.node, spec), now) is None:
            return False
        self._exists, self._spec = True, spec
        return True
