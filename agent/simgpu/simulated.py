"""A simulated GPU set that answers like NVML, driven by a file the agent re-reads when it changes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agent.enforce.cgroup import PodRef
from agent.nvml.base import (
    MEMORY_LIMIT_MAX,
    MEMORY_LIMITS_DRIVER_MAJOR,
    ComputeMode,
    MemoryInfo,
    MemoryLimits,
    MigDeviceInfo,
    NvmlCode,
    NvmlError,
    ProcessInfo,
    Utilization,
)
from agent.simgpu import simfile
from agent.simgpu.simfile import SimFileError, SimGpu, SimProcess, SimSet
from agent.simgpu.simlimits import LimitTable, Refused
from app.core import log

_log = log.get("gpupack.agent.simgpu")
# CUDA's error when the compute mode refuses a context (measured: EXCLUSIVE_PROCESS, a server running).
DEVICE_UNAVAILABLE = "CUDA_ERROR_DEVICE_UNAVAILABLE"


@dataclass(frozen=True, slots=True)
class MpsView:
    """The node's MPS servers as the driver knows them: whether one runs, and the pids of their clients
    (the daemon's `get_server_list` and `get_client_list`, host pids)."""

    servers: tuple[int, ...] = ()
    clients: frozenset[int] = frozenset()


class SimulatedNvml:
    """NVML over a SimSet. Raises the codes real NVML raises in the same situations.

    The file is re-read (if its mtime or size changed) on every `device_count()` call, which is how
    each agent sample starts; an invalid edit is logged and the previous set is kept.

    Compute modes are the simulated driver's state: set with `set_compute_mode` (root only, as NVML), kept
    in `state_dir` (one file per GPU) where given, so that every process using the same directory sees
    the same driver, else in this object. An empty state directory is a freshly loaded driver: every GPU
    at its file's `compute_mode` (DEFAULT unless the file says otherwise). A process the file lists
    without `mps: true` on a GPU in EXCLUSIVE_PROCESS is refused its context, as NVML's driver refuses it,
    when an MPS client or another process holds the GPU: it is not among the GPU's processes.

    Per-cgroup memory limits (driver r615+, agent.simgpu.simlimits) are kept in the same state directory.
    `cgroup_root` is where the node's cgroup v2 hierarchy is mounted: /sys/fs/cgroup on a v2 node, as
    NVIDIA requires; /sys/fs/cgroup/unified on a hybrid node, which only the simulation accepts.
    """

    def __init__(
        self,
        path: Path,
        node: str = "",
        state_dir: Path | None = None,
        privileged: bool | None = None,
        cgroup_root: str = "/sys/fs/cgroup",
    ) -> None:
        self.path = path
        self.node = node
        self.state_dir = state_dir
        self.privileged = os.geteuid() == 0 if privileged is None else privileged
        self._modes: dict[str, ComputeMode] = {}
        self.cgroup_root = cgroup_root.rstrip("/")
        self.limits = LimitTable(state_dir)
        self._set: SimSet | None = None
        self._stamp: tuple[int, int] | None = None
        self._initialized = False
        self._xids_delivered: dict[str, int] = {}  # uuid → how many of its listed XIDs were already drained
        self.last_reload_error: str = ""

    # --- lifecycle ---

    def init(self) -> None:
        self._reload(strict=True)
        assert self._set is not None
        if self._set.init_error is not None:
            raise NvmlError(
                self._set.init_error, f"NVML not available: simulated {self._set.init_error.value}"
            )
        self._initialized = True

    def shutdown(self) -> None:
        self._require()
        self._initialized = False

    def owners(self) -> dict[int, SimProcess]:
        """pid → simulated process (carries its pod UID), standing in for /proc/<pid>/cgroup."""
        return self._set.owners() if self._set else {}

    def _reload(self, strict: bool) -> None:
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            new = simfile.load(self.path, self.node)
        except SimFileError as exc:
            if strict or self._set is None:
                raise
            self.last_reload_error = str(exc)
            _log.warning("simulated GPU file rejected; keeping the previous one", extra={"error": str(exc)})
            self._stamp = stamp
            return
        self._set, self._stamp, self.last_reload_error = new, stamp, ""
        self._xids_delivered = {g.uuid: 0 for g in new.gpus} | {
            u: n for u, n in self._xids_delivered.items() if u in {g.uuid for g in new.gpus}
        }

    def _require(self) -> SimSet:
        if not self._initialized or self._set is None:
            raise NvmlError(NvmlCode.UNINITIALIZED, "nvmlInit was not called")
        return self._set

    def _gpu(self, index: int) -> SimGpu:
        s = self._require()
        if not 0 <= index < len(s.gpus):
            raise NvmlError(NvmlCode.INVALID_ARGUMENT, f"no GPU at index {index}")
        gpu = s.gpus[index]
        if gpu.lost:
            raise NvmlError(NvmlCode.GPU_IS_LOST, "GPU is lost")
        return gpu

    def _supported(self, gpu: SimGpu, query: str) -> None:
        if query in gpu.not_supported:
            raise NvmlError(NvmlCode.NOT_SUPPORTED, f"{query} query not supported on {gpu.product_name}")

    # --- queries ---

    def driver_version(self) -> str:
        return self._require().driver_version

    def device_count(self) -> int:
        self._require()
        self._reload(strict=False)
        return len(self._require().gpus)

    def uuid(self, index: int) -> str:
        return self._gpu(index).uuid

    def name(self, index: int) -> str:
        return self._gpu(index).product_name

    def memory(self, index: int) -> MemoryInfo:
        g = self._gpu(index)
        return MemoryInfo(total_mib=g.memory_mib, used_mib=g.used_mib, free_mib=g.memory_mib - g.used_mib)

    def utilization(self, index: int) -> Utilization:
        g = self._gpu(index)
        self._supported(g, "utilization")
        if g.mig_enabled:  # NVML has no whole-GPU utilization in MIG mode
            raise NvmlError(NvmlCode.NOT_SUPPORTED, "utilization not supported in MIG mode")
        return Utilization(gpu_percent=g.utilization_percent, memory_percent=g.memory_utilization_percent)

    def temperature_c(self, index: int) -> int:
        g = self._gpu(index)
        self._supported(g, "temperature")
        return g.temperature_c

    def power_mw(self, index: int) -> int:
        g = self._gpu(index)
        self._supported(g, "power")
        return g.power_mw

    def ecc_uncorrected(self, index: int) -> int:
        g = self._gpu(index)
        self._supported(g, "ecc")
        return g.ecc_uncorrected

    def xid_errors(self, index: int) -> tuple[int, ...]:
        # Each XID listed in the file is delivered once, as NVML's event queue would.
        g = self._gpu(index)
        seen = self._xids_delivered.get(g.uuid, 0)
        self._xids_delivered[g.uuid] = len(g.xids)
        return g.xids[seen:]

    def mig_enabled(self, index: int) -> bool:
        g = self._gpu(index)
        if not g.mig_slots:
            raise NvmlError(NvmlCode.NOT_SUPPORTED, f"{g.product_name} has no MIG")
        return g.mig_enabled

    def mig_device_count(self, index: int) -> int:
        g = self._gpu(index)
        if not g.mig_slots:
            raise NvmlError(NvmlCode.NOT_SUPPORTED, f"{g.product_name} has no MIG")
        return g.mig_slots

    def _mig(self, index: int, mig_index: int) -> tuple[SimGpu, int]:
        g = self._gpu(index)
        if not g.mig_slots:
            raise NvmlError(NvmlCode.NOT_SUPPORTED, f"{g.product_name} has no MIG")
        if not 0 <= mig_index < g.mig_slots:
            raise NvmlError(NvmlCode.INVALID_ARGUMENT, f"MIG index {mig_index} out of range")
        if not g.mig_enabled or mig_index >= len(g.mig_devices):
            raise NvmlError(NvmlCode.NOT_FOUND, f"no MIG device at index {mig_index}")
        return g, mig_index

    def mig_device(self, index: int, mig_index: int) -> MigDeviceInfo:
        g, i = self._mig(index, mig_index)
        m = g.mig_devices[i]
        return MigDeviceInfo(
            mig_index=i,
            uuid=m.uuid,
            memory_total_mib=m.memory_mib,
            memory_used_mib=sum(p.used_mib for p in m.processes),
            profile=m.profile,
        )

    def processes(self, index: int, mig_index: int | None = None) -> tuple[ProcessInfo, ...]:
        if mig_index is not None:
            g, i = self._mig(index, mig_index)
            return tuple(ProcessInfo(p.pid, p.used_mib) for p in g.mig_devices[i].processes)
        g = self._gpu(index)
        # Per-instance data needs MIG device handles; the parent refuses unprivileged callers.
        if g.mig_enabled:
            raise NvmlError(NvmlCode.NO_PERMISSION, "process query on a MIG-enabled GPU")
        listed = tuple(ProcessInfo(p.pid, p.used_mib) for p in self._admitted(g))
        # Real processes the simulated allocator serves (agent.simgpu.simalloc) have a context too.
        real = self.limits.holders(g.uuid)
        return listed + tuple(ProcessInfo(pid, real[pid] >> 20) for pid in sorted(real))

    def _admitted(self, g: SimGpu) -> tuple[SimProcess, ...]:
        """The file's processes that got a context: in EXCLUSIVE_PROCESS, MPS clients (behind one server)
        or else the first plain process; any other plain process was refused."""
        if self._mode(g) is not ComputeMode.EXCLUSIVE_PROCESS:
            return g.processes
        clients = tuple(p for p in g.processes if p.mps)
        if clients:
            return clients
        return g.processes[:1]

    # --- compute mode (the simulated driver's state) ---

    def _mode_file(self, g: SimGpu) -> Path | None:
        return None if self.state_dir is None else self.state_dir / f"{g.uuid}.compute-mode"

    def _mode(self, g: SimGpu) -> ComputeMode:
        path = self._mode_file(g)
        if path is None:
            return self._modes.get(g.uuid, g.compute_mode)
        try:
            return ComputeMode(path.read_text().strip())
        except (OSError, ValueError):
            return g.compute_mode

    def compute_mode(self, index: int) -> ComputeMode:
        return self._mode(self._gpu(index))

    def set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        g = self._gpu(index)
        if not isinstance(mode, ComputeMode):
            raise NvmlError(NvmlCode.INVALID_ARGUMENT, f"{mode!r} is not a compute mode")
        if not self.privileged:
            raise NvmlError(NvmlCode.NO_PERMISSION, "setting the compute mode needs root")
        path = self._mode_file(g)
        if path is None:
            self._modes[g.uuid] = mode
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(mode.value + "\n")
        tmp.replace(path)

    def pod_of(self, pid: int) -> PodRef | None:
        """The pod of a simulated process, as its /proc/<pid>/cgroup would name it."""
        p = self.owners().get(pid)
        return PodRef(p.pod_uid, p.container) if p and p.pod_uid else None

    # --- per-cgroup memory limits (MPS v3 memory partitioning) ---

    def _limits_gpu(self, index: int, namespace: str) -> SimGpu:
        """The GPU, once the driver, the GPU and the cgroup can carry limits; else NVML's refusal."""
        g = self._gpu(index)
        version = self._require().driver_version
        major = version.split(".")[0]
        if not major.isdigit() or int(major) < MEMORY_LIMITS_DRIVER_MAJOR:
            raise NvmlError(
                NvmlCode.NOT_SUPPORTED,
                f"per-cgroup memory limits need driver r{MEMORY_LIMITS_DRIVER_MAJOR}+, this one is {version}",
            )
        if g.mig_enabled:
            raise NvmlError(NvmlCode.NOT_SUPPORTED, "memory partitioning does not support MIG")
        norm = os.path.normpath(namespace) if namespace.startswith("/") else ""
        if norm != namespace or not _within(namespace, self.cgroup_root) or namespace == self.cgroup_root:
            raise NvmlError(
                NvmlCode.NOT_FOUND,
                f"{namespace!r} is no cgroup v2 directory below {self.cgroup_root} that can carry limits",
            )
        return g

    def memory_limits(self, index: int, namespace: str) -> MemoryLimits:
        g = self._limits_gpu(index, namespace)
        soft, hard, used = self.limits.get(g.uuid, namespace)
        return MemoryLimits(soft_bytes=soft, hard_bytes=hard, current_used_bytes=used)

    def set_memory_limits(self, index: int, namespace: str, soft_bytes: int, hard_bytes: int) -> None:
        g = self._limits_gpu(index, namespace)
        if not self.privileged:
            raise NvmlError(NvmlCode.NO_PERMISSION, "setting memory limits needs root")
        for value in (soft_bytes, hard_bytes):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MEMORY_LIMIT_MAX:
                raise NvmlError(NvmlCode.INVALID_ARGUMENT, f"limit {value!r} is not a byte count")
        if soft_bytes > hard_bytes:
            raise NvmlError(
                NvmlCode.INVALID_ARGUMENT, f"soft limit {soft_bytes} is above hard limit {hard_bytes}"
            )
        self.limits.set(g.uuid, namespace, soft_bytes, hard_bytes)

    # --- the simulated allocator's side (no NVML call: what cuMemAlloc meets in the driver) ---

    def context_refusal(self, uuid: str, pid: int, mps: MpsView) -> Refused | None:
        """Whether process `pid` (a host pid; 0: not known) may open a context on GPU `uuid` now, by the
        GPU's compute mode, as measured (docs/node-side.md, "MPS as measured", "Compute mode"):

        - DEFAULT: every process;
        - EXCLUSIVE_PROCESS and an MPS server runs: the server's clients; a plain process is refused
          (CUDA_ERROR_DEVICE_UNAVAILABLE);
        - EXCLUSIVE_PROCESS and no server (no daemon, or a daemon before its first server): the first plain
          process takes the GPU, a second is refused;
        - PROHIBITED: no process (unmeasured; NVIDIA documents it).
        A process this GPU's allocations already name keeps its context. Not modelled: an MPS client that
        waits while a plain process holds the GPU (measured: it runs once that one exits).
        """
        s = self._require()
        g = next((g for g in s.gpus if g.uuid == uuid), None)
        if g is None or g.lost:
            return Refused(f"CUDA_ERROR_INVALID_DEVICE: no GPU {uuid} on this node")
        mode = self._mode(g)
        holders = self.limits.holders(uuid)
        if mode is ComputeMode.DEFAULT or pid <= 0 or pid in holders:
            return None  # pid 0: the caller is unknown to the driver's accounting as to MPS's
        if mode is ComputeMode.PROHIBITED:
            return Refused(f"{DEVICE_UNAVAILABLE}: GPU {uuid} is in PROHIBITED compute mode")
        if mps.servers:
            if pid in mps.clients:
                return None
            return Refused(
                f"{DEVICE_UNAVAILABLE}: GPU {uuid} is in EXCLUSIVE_PROCESS and an MPS server runs "
                f"(pid {mps.servers[0]}): only its clients may use it"
            )
        plain = sorted(p for p in holders if p not in mps.clients)
        if plain:
            return Refused(
                f"{DEVICE_UNAVAILABLE}: GPU {uuid} is in EXCLUSIVE_PROCESS and process {plain[0]} holds it"
            )
        return None

    def allocate(self, uuid: str, namespace: str, holder: str, nbytes: int, *, pid: int = 0) -> int | Refused:
        """Charge an allocation of process `pid` (0: unknown) in cgroup `namespace` on GPU `uuid`: its
        cgroup's usage after it, or the driver's refusal."""
        s = self._require()
        g = next((g for g in s.gpus if g.uuid == uuid), None)
        if g is None or g.lost:
            return Refused(f"CUDA_ERROR_INVALID_DEVICE: no GPU {uuid} on this node")
        capacity = (g.memory_mib - g.used_mib) << 20
        return self.limits.allocate(g.uuid, namespace, holder, nbytes, capacity, pid=pid)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")
