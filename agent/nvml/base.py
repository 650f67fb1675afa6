"""The narrow NVML interface the agent uses, its value types and its NVML-shaped error."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol


class NvmlCode(StrEnum):
    """NVML return codes the agent tells apart, spelled as in nvml.h."""

    UNINITIALIZED = "NVML_ERROR_UNINITIALIZED"
    INVALID_ARGUMENT = "NVML_ERROR_INVALID_ARGUMENT"
    NOT_SUPPORTED = "NVML_ERROR_NOT_SUPPORTED"
    NO_PERMISSION = "NVML_ERROR_NO_PERMISSION"
    NOT_FOUND = "NVML_ERROR_NOT_FOUND"
    DRIVER_NOT_LOADED = "NVML_ERROR_DRIVER_NOT_LOADED"
    TIMEOUT = "NVML_ERROR_TIMEOUT"
    LIBRARY_NOT_FOUND = "NVML_ERROR_LIBRARY_NOT_FOUND"
    FUNCTION_NOT_FOUND = "NVML_ERROR_FUNCTION_NOT_FOUND"
    CORRUPTED_INFOROM = "NVML_ERROR_CORRUPTED_INFOROM"
    GPU_IS_LOST = "NVML_ERROR_GPU_IS_LOST"
    RESET_REQUIRED = "NVML_ERROR_RESET_REQUIRED"
    LIB_RM_VERSION_MISMATCH = "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
    NO_DATA = "NVML_ERROR_NO_DATA"
    UNKNOWN = "NVML_ERROR_UNKNOWN"
    OTHER = "NVML_ERROR_OTHER"  # any code not listed above (the message keeps NVML's own text)


class ComputeMode(StrEnum):
    """A GPU's compute mode, spelled as nvml.h's nvmlComputeMode_t (EXCLUSIVE_THREAD is gone from NVML)."""

    DEFAULT = "NVML_COMPUTEMODE_DEFAULT"  # any number of processes, each with its own context
    PROHIBITED = "NVML_COMPUTEMODE_PROHIBITED"  # no compute context at all
    # One process at a time; with an MPS server running, that process is the server and only MPS clients
    # reach the GPU (a process without the pipe directory is refused instead of bypassing MPS).
    EXCLUSIVE_PROCESS = "NVML_COMPUTEMODE_EXCLUSIVE_PROCESS"


# Codes meaning "this GPU is broken", as opposed to "this query does not apply to it".
FATAL_CODES = frozenset(
    {NvmlCode.GPU_IS_LOST, NvmlCode.RESET_REQUIRED, NvmlCode.CORRUPTED_INFOROM, NvmlCode.UNKNOWN}
)


class BackendConfigError(Exception):
    """The chosen backend's own configuration is invalid (e.g. a simulated GPU set file): the agent stops with
    exit status 2 rather than report GPUs it cannot read as configured."""


class NvmlError(Exception):
    """A failed NVML call: the NVML return code name plus NVML's (or our) message."""

    def __init__(self, code: NvmlCode, message: str = "") -> None:
        super().__init__(f"{code.value}: {message}" if message else code.value)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    total_mib: int
    used_mib: int
    free_mib: int


# nvml.h's NVML_DEVICE_MEMORY_LIMIT_MAX: a hard limit of "no limit"; soft 0 + hard MAX clears a cgroup.
MEMORY_LIMIT_MAX = 0xFFFFFFFFFFFFFFFF
# The first driver branch with per-cgroup GPU memory limits (nvmlDeviceSetMemoryLimits_v1, MPS v3: r615).
MEMORY_LIMITS_DRIVER_MAJOR = 615


@dataclass(frozen=True, slots=True)
class MemoryLimits:
    """nvmlGetMemoryLimits_v1_t for one cgroup on one GPU, in bytes (as NVML has them).

    `hard_bytes` = MEMORY_LIMIT_MAX where the cgroup has no hard limit; `soft_bytes` = 0 where it has no
    guaranteed share; `current_used_bytes`: GPU memory the cgroup's processes hold now.
    """

    soft_bytes: int
    hard_bytes: int
    current_used_bytes: int

    @property
    def cleared(self) -> bool:
        return self.soft_bytes == 0 and self.hard_bytes == MEMORY_LIMIT_MAX


@dataclass(frozen=True, slots=True)
class Utilization:
    gpu_percent: int  # share of time a kernel ran over NVML's last sample period
    memory_percent: int  # share of time device memory was read or written


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    used_mib: int | None  # None where NVML cannot attribute memory (it reports "not available")
    mig_uuid: str = ""  # the MIG device it runs on ("" for a whole GPU); set by the sampler


@dataclass(frozen=True, slots=True)
class MigDeviceInfo:
    mig_index: int
    uuid: str  # "MIG-..."
    memory_total_mib: int
    memory_used_mib: int
    profile: str = ""  # e.g. "1g.10gb": the suffix of the MIG device's NVML name ("" when it has none)


class Nvml(Protocol):
    """Everything the agent asks of NVML: GPUs addressed by NVML index; any method may raise NvmlError."""

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def uuid(self, index: int) -> str: ...

    def name(self, index: int) -> str:
        """NVML product name, e.g. "NVIDIA A100-SXM4-40GB" (app.core.catalog maps it to a model)."""
        ...

    def memory(self, index: int) -> MemoryInfo: ...

    def utilization(self, index: int) -> Utilization: ...

    def temperature_c(self, index: int) -> int: ...

    def power_mw(self, index: int) -> int: ...

    def ecc_uncorrected(self, index: int) -> int:
        """Volatile (since last driver load) uncorrected ECC error count."""
        ...

    def xid_errors(self, index: int) -> tuple[int, ...]:
        """Critical XID errors seen on this GPU since the previous call (drained)."""
        ...

    def mig_enabled(self, index: int) -> bool:
        """Current MIG mode; NOT_SUPPORTED on GPUs without MIG."""
        ...

    def mig_device_count(self, index: int) -> int:
        """Maximum MIG device slots; NOT_SUPPORTED on GPUs without MIG."""
        ...

    def mig_device(self, index: int, mig_index: int) -> MigDeviceInfo:
        """One MIG device; NOT_FOUND for an empty slot or MIG disabled, NOT_SUPPORTED without MIG."""
        ...

    def processes(self, index: int, mig_index: int | None = None) -> tuple[ProcessInfo, ...]:
        """Compute processes on a GPU (or one of its MIG devices); NO_PERMISSION on a MIG-enabled parent."""
        ...

    def compute_mode(self, index: int) -> ComputeMode:
        """nvmlDeviceGetComputeMode: needs no privilege."""
        ...

    def set_compute_mode(self, index: int, mode: ComputeMode) -> None:
        """nvmlDeviceSetComputeMode: root only (NO_PERMISSION otherwise); NOT_SUPPORTED where the GPU has
        no compute modes. Not persistent: a reboot or driver reload puts every GPU back to DEFAULT."""
        ...

    def memory_limits(self, index: int, namespace: str) -> MemoryLimits:
        """nvmlDeviceGetMemoryLimits_v1 for the cgroup v2 directory `namespace` (a full /sys/fs/cgroup/...
        path): needs no privilege. NOT_SUPPORTED below driver r615, on a MIG-enabled GPU, or where the
        binding lacks the call; NOT_FOUND where the cgroup cannot carry limits."""
        ...

    def set_memory_limits(self, index: int, namespace: str, soft_bytes: int, hard_bytes: int) -> None:
        """nvmlDeviceSetMemoryLimits_v1: root only (NO_PERMISSION otherwise); INVALID_ARGUMENT where soft >
        hard. soft 0 and hard MEMORY_LIMIT_MAX clear the cgroup's limits."""
        ...
