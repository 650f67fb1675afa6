"""The real NVML backend, through pynvml (package nvidia-ml-py); every NVMLError becomes an NvmlError.

pynvml's unversioned wrappers (e.g. nvmlDeviceGetComputeRunningProcesses) raise NVMLLibraryMismatchError,
which is not an NVMLError, when the driver's libnvidia-ml lacks the versioned symbol they call; that too
becomes NVML_ERROR_FUNCTION_NOT_FOUND here, so no raw pynvml exception reaches the agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from agent.nvml.base import (
    ComputeMode,
    MemoryInfo,
    MemoryLimits,
    MigDeviceInfo,
    NvmlCode,
    NvmlError,
    ProcessInfo,
    Utilization,
)

T = TypeVar("T")
MIB = 1 << 20

# pynvml's numeric return codes → our names, built from pynvml's own NVML_ERROR_* constants.
_CODES: dict[int, NvmlCode] = {int(getattr(pynvml, c.value)): c for c in NvmlCode if hasattr(pynvml, c.value)}


def mig_profile_of(name: str) -> str:
    """The profile in a MIG device's NVML name ("NVIDIA A100-SXM4-80GB MIG 1g.10gb" -> "1g.10gb")."""
    head, sep, tail = name.rpartition(" MIG ")
    return tail.strip() if sep and head else ""


def translate(exc: Exception) -> NvmlError:
    """An NVMLError (or anything raised while loading the library) as an NvmlError."""
    if isinstance(exc, pynvml.NVMLLibraryMismatchError):
        return NvmlError(NvmlCode.FUNCTION_NOT_FOUND, str(exc))
    value = getattr(exc, "value", None)
    code = _CODES.get(value, NvmlCode.OTHER) if isinstance(value, int) else NvmlCode.OTHER
    return NvmlError(code, str(exc))


def _call(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
        raise translate(exc) from None


_MODES: dict[int, ComputeMode] = {int(getattr(pynvml, m.value)): m for m in ComputeMode}


# Codes meaning "this GPU or driver has no MPS process query", which leaves the plain compute list.
_NO_MPS_QUERY = frozenset({NvmlCode.NOT_SUPPORTED, NvmlCode.FUNCTION_NOT_FOUND})


class PynvmlBackend:
    """NVML on a real GPU node. Handles are looked up per call, so a GPU that vanished fails alone."""

    def __init__(self) -> None:
        self._events: Any = None
        self._xids: dict[str, list[int]] = {}

    def init(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            err = translate(exc)
            raise NvmlError(err.code, f"NVML not available: {exc}") from None
        except OSError as exc:  # a broken libnvidia-ml.so can fail in the loader, not in NVML
            raise NvmlError(NvmlCode.LIBRARY_NOT_FOUND, f"NVML not available: {exc}") from None
        self._register_xid_events()

    def shutdown(self) -> None:
        events, self._events = self._events, None
        try:
            if events is not None:
                _call(pynvml.nvmlEventSetFree, events)
        finally:  # a failed free must not leave NVML initialized
            _call(pynvml.nvmlShutdown)

    def driver_version(self) -> str:
        return str(_call(pynvml.nvmlSystemGetDriverVersion))

    def device_count(self) -> int:
        return int(_call(pynvml.nvmlDeviceGetCount))

    def _handle(self, index: int) -> Any:
        return _call(pynvml.nvmlDeviceGetHandleByIndex, index)

    def uuid(self, index: int) -> str:
        return str(_call(pynvml.nvmlDeviceGetUUID, self._handle(index)))

    def name(self, index: int) -> str:
        return str(_call(pynvml.nvmlDeviceGetName, self._handle(index)))

    def memory(self, index: int) -> MemoryInfo:
        m = _call(pynvml.nvmlDeviceGetMemoryInfo, self._handle(index))
        return MemoryInfo(
            total_mib=int(m.total) // MIB, used_mib=int(m.used) // MIB, free_mib=int(m.free) // MIB
        )

    def utilization(self, index: int) -> Utilization:
        u = _call(pynvml.nvmlDeviceGetUtilizationRates, self._handle(index))
        return Utilization(gpu_percent=int(u.gpu), memory_percent=int(u.memory))

    def temperature_c(self, index: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetTemperature, self._handle(index), pynvml.NVML_TEMPERATURE_GPU))

    def power_mw(self, index: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetPowerUsage, self._handle(index)))

    def ecc_uncorrected(self, index: int) -> int:
        return int(
            _call(
                pynvml.nvmlDeviceGetTotalEccErrors,
                self._handle(index),
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
        )

    def xid_errors(self, index: int) -> tuple[int, ...]:
        self._drain_events()
        return tuple(self._xids.pop(self.uuid(index), []))

    def mig_enabled(self, index: int) -> bool:
        current, _pending = _call(pynvml.nvmlDeviceGetMigMode, self._handle(index))
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def mig_device_count(self, index: int) -> int:
        return int(_call(pynvml.nvmlDeviceGetMaxMigDeviceCount, self._handle(index)))

    def _mig_handle(self, index: int, mig_index: int) -> Any:
        return _call(pynvml.nvmlDeviceGetMigDeviceHandleByIndex, self._handle(index), mig_index)

    def mig_device(self, index: int, mig_index: int) -> MigDeviceInfo:
        h = self._mig_handle(index, mig_index)
        m = _call(pynvml.nvmlDeviceGetMemoryInfo, h)
        return MigDeviceInfo(
            mig_index=mig_index,
            uuid=str(_call(pynvml.nvmlDeviceGetUUID, h)),
            memory_total_mib=int(m.total) // MIB,
            memory_used_mib=int(m.used) // MIB,
            profile=mig_profile_of(str(_call(pynvml.nvmlDeviceGetName, h))),
        )

    def processes(self, index: int, mig_index: int | None = None) -> tuple[ProcessInfo, ...]:
        """Compute processes plus MPS clients, one entry per pid.

        NVML has a separate query for processes with an MPS compute context (a pod behind the MPS
        server); the plain compute list may show only the nvidia-cuda-mps-server in their place. The
        GPU suite (tests/gpu) records which list names an MPS client on a real GPU.
        """
        h = self._handle(index) if mig_index is None else self._mig_handle(index, mig_index)
        procs = list(_call(pynvml.nvmlDeviceGetComputeRunningProcesses, h))
        try:
            procs += _call(pynvml.nvmlDeviceGetMPSComputeRunningProcesses, h)
        except NvmlError as exc:  # no MPS query on this GPU or driver: plain compute processes only
            if exc.code not in _NO_MPS_QUERY:
                raise
        out: dict[int, ProcessInfo] = {}
        for p in procs:
            info = ProcessInfo(
                pid=int(p.pid), used_mib=None if p.usedGpuMemory is None else int(p.usedGpuMemory) // MIB
            )
            seen = out.get(info.pid)
            if seen is None or (seen.used_mib is None and info.used_mib is not None):
                out[info.pid] = info
        return tuple(out.values())

    def compute_mode(self, index: int) -> ComputeMode:
        raw = int(_call(pynvml.nvmlDeviceGetComputeMode, self._handle(index)))
        if raw not in _MODES:
            raise NvmlError(
                NvmlCode.OTHER, f"compute mode {raw} (EXCLUSIVE_THREAD?) is not one NVML still has"
            )
        return _MODES[raw]

    def set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        _call(pynvml.nvmlDeviceSetComputeMode, self._handle(index), int(getattr(pynvml, mode.value)))

    @property
    def limits_bound(self) -> bool:
        """Whether this nvidia-ml-py binds the per-cgroup memory limit calls (13.615+)."""
        return hasattr(pynvml, "nvmlDeviceSetMemoryLimits_v1")

    def _limits_binding(self) -> tuple[Any, Any, Any, Any]:
        """pynvml's per-cgroup memory limit calls and structs (nvidia-ml-py 13.615+), or NOT_SUPPORTED: an
        older binding cannot reach them, whatever the driver has."""
        names = (
            "nvmlDeviceGetMemoryLimits_v1",
            "nvmlDeviceSetMemoryLimits_v1",
            "c_nvmlGetMemoryLimits_v1_t",
            "c_nvmlSetMemoryLimits_v1_t",
        )
        found = [getattr(pynvml, n, None) for n in names]
        if any(f is None for f in found):
            raise NvmlError(
                NvmlCode.NOT_SUPPORTED, "this nvidia-ml-py does not bind nvmlDevice{Get,Set}MemoryLimits_v1"
            )
        return found[0], found[1], found[2], found[3]

    def memory_limits(self, index: int, namespace: str) -> MemoryLimits:
        get, _set, get_t, _set_t = self._limits_binding()
        limits = get_t()
        limits.nameSpace = namespace.encode()
        _call(get, self._handle(index), limits)
        return MemoryLimits(
            soft_bytes=int(limits.softLimit),
            hard_bytes=int(limits.hardLimit),
            current_used_bytes=int(limits.currentUsed),
        )

    def set_memory_limits(self, index: int, namespace: str, soft_bytes: int, hard_bytes: int) -> None:
        _get, set_, _get_t, set_t = self._limits_binding()
        limits = set_t()
        limits.nameSpace = namespace.encode()
        limits.softLimit, limits.hardLimit = soft_bytes, hard_bytes
        _call(set_, self._handle(index), limits)

    def _register_xid_events(self) -> None:
        # XIDs only arrive as events; a GPU that cannot register (NOT_SUPPORTED) simply reports none.
        try:
            self._events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError:
            return
        for i in range(self.device_count()):
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    self._handle(i), pynvml.nvmlEventTypeXidCriticalError, self._events
                )
            except (pynvml.NVMLError, NvmlError):
                continue

    def _drain_events(self) -> None:
        if self._events is None:
            return
        while True:
            try:
                ev = pynvml.nvmlEventSetWait(self._events, 0)
            except pynvml.NVMLError:  # TIMEOUT: nothing pending
                return
            try:
                uuid = str(pynvml.nvmlDeviceGetUUID(ev.device))
            except pynvml.NVMLError:
                continue
            self._xids.setdefault(uuid, []).append(int(ev.eventData))
