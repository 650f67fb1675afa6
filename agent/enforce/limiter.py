"""Sets and clears each container's per-cgroup GPU memory limits through NVML, and remembers what it set.

Driven by the node server (agent.runtime.nodeserver): `apply` when the runtime handler's createRuntime hook
reports a new container instance (its cgroup exists, its first process has not run), `clear` when the handler
passes on the container's `runc delete`, and `sweep` for containers whose pod has left the node (a missed
delete: the agent was down). Clearing zeroes the soft limit and lifts the hard one (NVML: soft 0, hard
NVML_DEVICE_MEMORY_LIMIT_MAX): on the dmem backend a soft limit left on a removed cgroup keeps reserving
memory in every ancestor (NVIDIA, mpsv3-memory-partitioning).

What was set is kept as one JSON file per container under `records` (a host directory), so an agent that
restarts still clears what an earlier one set.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from agent.enforce.memlimits import Limits
from agent.mpsdaemon.mpsv3 import Namespaces
from agent.nvml.base import MEMORY_LIMIT_MAX, Nvml, NvmlCode, NvmlError
from app.core import log

_log = log.get("gpupack.agent.limiter")


@dataclass(frozen=True, slots=True)
class Record:
    """The limits one container instance got: what `clear` undoes."""

    container_id: str
    pod_uid: str
    namespace: str  # the cgroup v2 directory the limits are keyed by
    gpu_uuids: tuple[str, ...]
    soft_mib: int
    hard_mib: int
    mps_namespace: str = ""  # the container's MPS v3 namespace ("" without one)
    created_s: float = 0.0  # wall clock when first remembered (a sweep spares younger records)


class Limiter:
    """`nvml()` gives the agent's NVML once it is initialised (None before); `records` a host directory;
    `namespaces` the MPS v3 namespaces whose deletion goes with a container's end (None: no MPS v3)."""

    def __init__(
        self, nvml: Callable[[], Nvml | None], records: Path, namespaces: Namespaces | None = None
    ) -> None:
        self.nvml = nvml
        self.records = records
        self.namespaces = namespaces

    def remember(self, record: Record) -> None:
        """Keep a record (e.g. a namespace made at create) without setting anything."""
        self._write(record)

    def _indexes(self, nvml: Nvml, uuids: Sequence[str]) -> dict[str, int] | str:
        by_uuid = {nvml.uuid(i): i for i in range(nvml.device_count())}
        missing = [u for u in uuids if u not in by_uuid]
        if missing:
            return f"GPU(s) {', '.join(missing)} of the allocation are not on this node"
        return {u: by_uuid[u] for u in uuids}

    def apply(self, record: Record) -> str:
        """Set the record's limits on every GPU, read them back, keep the record; "" or why it failed (the
        caller fails the container closed). A failure part-way clears what was set."""
        nvml = self.nvml()
        if nvml is None:
            return "NVML is not initialised in the agent yet; the container starts once it is"
        limits = Limits(record.soft_mib, record.hard_mib)
        earlier = self.read(record.container_id)
        record = replace(record, created_s=earlier.created_s if earlier else time.time())
        try:
            found = self._indexes(nvml, record.gpu_uuids)
            if isinstance(found, str):
                return found
            self._write(record)  # first: a crash after the first set still leaves something to clear
            for uuid, index in found.items():
                nvml.set_memory_limits(index, record.namespace, limits.soft_bytes, limits.hard_bytes)
                got = nvml.memory_limits(index, record.namespace)
                if (got.soft_bytes, got.hard_bytes) != (limits.soft_bytes, limits.hard_bytes):
                    raise NvmlError(
                        NvmlCode.OTHER, f"GPU {uuid} reads back soft {got.soft_bytes} hard {got.hard_bytes}"
                    )
        except NvmlError as exc:
            self.clear(record.container_id)
            return f"setting GPU memory limits on cgroup {record.namespace} failed: {exc}"
        _log.info("GPU memory limits set", extra=asdict(record))
        return ""

    def clear(self, container_id: str) -> Record | None:
        """Zero the soft limit and lift the hard one on every GPU of the container, delete its MPS v3
        namespace; forget it. The record stays where something failed (tried again by `sweep`)."""
        record = self.read(container_id)
        if record is None:
            return None
        failed = self._clear_limits(record) if record.namespace else []
        if record.mps_namespace and self.namespaces is not None:
            why = self.namespaces.delete(record.mps_namespace)
            if why:
                failed.append(f"MPS v3 namespace {record.mps_namespace}: {why}")
        if failed:
            _log.warning(
                "container not cleaned up", extra={"container": container_id, "error": "; ".join(failed)}
            )
            return None
        with contextlib.suppress(FileNotFoundError):
            self._path(container_id).unlink()
        _log.info(
            "GPU memory limits cleared",
            extra={
                "container": container_id,
                "cgroup": record.namespace,
                "mps_namespace": record.mps_namespace,
            },
        )
        return record

    def _clear_limits(self, record: Record) -> list[str]:
        nvml = self.nvml()
        if nvml is None:
            return ["NVML is not initialised in the agent"]
        try:
            found = {nvml.uuid(i): i for i in range(nvml.device_count())}
        except NvmlError as exc:
            return [str(exc)]
        failed = []
        for uuid in record.gpu_uuids:
            if uuid not in found:
                continue  # the GPU is gone, and its limits with it
            try:
                nvml.set_memory_limits(found[uuid], record.namespace, 0, MEMORY_LIMIT_MAX)
            except NvmlError as exc:
                failed.append(f"{uuid}: {exc}")
        return failed

    def sweep(
        self, pods_on_node: Iterable[str], older_than_s: float, now: float | None = None
    ) -> list[Record]:
        """Clear every container whose pod is no longer on the node, if remembered at least `older_than_s`
        ago (a younger one's pod may be newer than the listing); the records cleared."""
        keep = set(pods_on_node)
        now = time.time() if now is None else now
        out = []
        for record in self.all():
            if record.pod_uid in keep or now - record.created_s < older_than_s:
                continue
            if (done := self.clear(record.container_id)) is not None:
                out.append(done)
        return out

    def all(self) -> list[Record]:
        try:
            names = sorted(p.stem for p in self.records.glob("*.json"))
        except OSError:
            return []
        return [r for n in names if (r := self.read(n)) is not None]

    def read(self, container_id: str) -> Record | None:
        try:
            raw = json.loads(self._path(container_id).read_text())
            raw["gpu_uuids"] = tuple(raw["gpu_uuids"])
            return Record(**raw)
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _path(self, container_id: str) -> Path:
        return self.records / f"{Path(container_id).name}.json"

    def _write(self, record: Record) -> None:
        if not record.created_s:
            record = replace(record, created_s=time.time())
        self.records.mkdir(parents=True, exist_ok=True)
        tmp = self._path(record.container_id).with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(record)))
        tmp.replace(self._path(record.container_id))
