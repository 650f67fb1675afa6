"""One reading of every GPU through the NVML interface, where one broken GPU never spoils the rest."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import TypeVar

from agent.nvml.base import FATAL_CODES, ComputeMode, MigDeviceInfo, Nvml, NvmlCode, NvmlError, ProcessInfo
from app.core import catalog

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's reading: NVML's own value types (MigDeviceInfo, ProcessInfo) plus what the agent derives."""

    index: int
    uuid: str
    product_name: str
    model: str  # catalogue name, or NVML's product name for a GPU the catalogue does not know
    memory_total_mib: int
    memory_used_mib: int | None = None  # None: could not be read this time
    memory_free_mib: int | None = None
    utilization_percent: int | None = None
    temperature_c: int | None = None
    power_mw: int | None = None
    ecc_uncorrected: int | None = None
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()
    healthy: bool = True
    reason: str = ""  # why it is unhealthy
    errors: tuple[NvmlCode, ...] = ()  # codes raised while reading it (NOT_SUPPORTED included)
    compute_mode: ComputeMode | None = None  # None: could not be read (or a MIG-enabled GPU)


@dataclass(frozen=True, slots=True)
class NodeSample:
    gpus: tuple[GpuSample, ...] = ()
    driver_version: str = ""
    error: str = ""  # NVML failed for the whole node (init or device count)


@cache
def application_xids() -> frozenset[int]:
    raw = json.loads(resources.files("agent.data").joinpath("health.json").read_text())
    return frozenset(int(x) for x in raw["application_xids"])


def model_name(product_name: str) -> str:
    try:
        return catalog.lookup(product_name).name
    except KeyError:
        return product_name


@dataclass(slots=True)
class Sampler:
    """Reads all GPUs; remembers each GPU's identity so a GPU that is lost later still has a UUID.

    Fatal XIDs are sticky: the GPU stays unhealthy until the agent restarts (as NVIDIA's device
    plugin does), because NVML reports them once and the GPU needs a reset afterwards.
    """

    nvml: Nvml
    on_error: Callable[[NvmlCode], None] = lambda _code: None
    _known: dict[int, tuple[str, str, int]] = field(default_factory=dict)  # index → uuid, name, total MiB
    _sticky: dict[str, str] = field(default_factory=dict)  # uuid → reason

    def sample(self) -> NodeSample:
        try:
            count = self.nvml.device_count()
            driver = self.nvml.driver_version()
        except NvmlError as exc:
            self.on_error(exc.code)
            return NodeSample(error=str(exc))
        return NodeSample(gpus=tuple(self._gpu(i) for i in range(count)), driver_version=driver)

    def _gpu(self, index: int) -> GpuSample:
        errors: list[NvmlCode] = []

        def opt(fn: Callable[[], T]) -> T | None:
            # Optional readings: NOT_SUPPORTED and friends leave the field empty; fatal codes propagate.
            try:
                return fn()
            except NvmlError as exc:
                errors.append(exc.code)
                self.on_error(exc.code)
                if exc.code in FATAL_CODES:
                    raise
                return None

        nv = self.nvml
        try:
            uuid, name = nv.uuid(index), nv.name(index)
            mem = nv.memory(index)
        except NvmlError as exc:
            self.on_error(exc.code)
            return _broken(index, self._known.get(index, ("", "", 0)), exc, ())
        self._known[index] = (uuid, name, mem.total_mib)
        try:
            util = opt(lambda: nv.utilization(index))
            temp = opt(lambda: nv.temperature_c(index))
            power = opt(lambda: nv.power_mw(index))
            ecc = opt(lambda: nv.ecc_uncorrected(index))
            xids = opt(lambda: nv.xid_errors(index)) or ()
            mig = bool(opt(lambda: nv.mig_enabled(index)))
            migs = self._migs(index) if mig else ()
            mode = None if mig else opt(lambda: nv.compute_mode(index))
            procs = self._processes(index, mig, migs)
        except NvmlError as exc:
            return _broken(index, self._known[index], exc, errors)
        fatal = [x for x in xids if x not in application_xids()]
        if fatal:
            self._sticky.setdefault(uuid, f"critical XID {fatal[0]}")
        reason = self._sticky.get(uuid, "")
        if not reason and ecc:
            reason = f"{ecc} uncorrected ECC errors since driver load"
        return GpuSample(
            index=index,
            uuid=uuid,
            product_name=name,
            model=model_name(name),
            memory_total_mib=mem.total_mib,
            memory_used_mib=mem.used_mib,
            memory_free_mib=mem.free_mib,
            utilization_percent=None if util is None else util.gpu_percent,
            temperature_c=temp,
            power_mw=power,
            ecc_uncorrected=ecc,
            mig_enabled=mig,
            mig_devices=migs,
            processes=procs,
            healthy=not reason,
            reason=reason,
            errors=tuple(errors),
            compute_mode=mode,
        )

    def _migs(self, index: int) -> tuple[MigDeviceInfo, ...]:
        out: list[MigDeviceInfo] = []
        for slot in range(self.nvml.mig_device_count(index)):
            try:
                m = self.nvml.mig_device(index, slot)
            except NvmlError as exc:
                if exc.code is NvmlCode.NOT_FOUND:  # an empty slot, as NVML reports it
                    continue
                raise
            out.append(m)
        return tuple(out)

    def _processes(self, index: int, mig: bool, migs: tuple[MigDeviceInfo, ...]) -> tuple[ProcessInfo, ...]:
        if not mig:
            return self.nvml.processes(index)
        return tuple(
            replace(p, mig_uuid=m.uuid) for m in migs for p in self.nvml.processes(index, m.mig_index)
        )


def _broken(
    index: int, known: tuple[str, str, int], exc: NvmlError, errors: list[NvmlCode] | tuple[()]
) -> GpuSample:
    """A GPU whose reading failed with `exc`: what is known of it (uuid, name, MiB), marked unhealthy."""
    uuid, name, total_mib = known
    return GpuSample(
        index=index,
        uuid=uuid,
        product_name=name,
        model=model_name(name) if name else "unknown",
        memory_total_mib=total_mib,
        healthy=False,
        reason=str(exc),
        errors=(*errors, exc.code),
    )
