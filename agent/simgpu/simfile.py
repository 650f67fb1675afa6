"""Simulated GPU set files (YAML or JSON): parse and validate, reporting every bad field by path."""

from __future__ import annotations

import json
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from agent.nvml.base import BackendConfigError, ComputeMode, NvmlCode
from app.core import catalog
from app.core.errors import FieldError, InputError

QUERIES = ("power", "temperature", "ecc", "utilization")
_UUID_NS = uuidlib.UUID("6f1d3c52-2b7e-4d0a-9a51-1f0c7d6b9e10")  # fixed, so simulated UUIDs are stable


class SimFileError(InputError, BackendConfigError):
    """A simulated GPU set file that breaks one or more rules; lists every broken field."""

    def __init__(self, source: str, errors: list[FieldError]) -> None:
        super().__init__(errors, source)


def _brief(value: Any) -> Any:
    """A value for an error message: itself, or the start of its repr() when that is long (a whole list)."""
    text = repr(value)
    return value if len(text) <= 40 else text[:39] + "…"


@dataclass(frozen=True, slots=True)
class SimProcess:
    pid: int
    used_mib: int
    pod_uid: str  # "" for a process outside any pod (a "foreign" process)
    container: str
    mps: bool = False  # an MPS client (reaches the GPU through the MPS server), not a context of its own


@dataclass(frozen=True, slots=True)
class SimMig:
    slot: int
    uuid: str
    profile: str
    memory_mib: int
    processes: tuple[SimProcess, ...]


@dataclass(frozen=True, slots=True)
class SimGpu:
    model: str  # catalogue name
    product_name: str  # what NVML's name query returns
    uuid: str
    memory_mib: int
    base_used_mib: int  # driver/context overhead reported as used even with no processes
    utilization_percent: int
    memory_utilization_percent: int
    temperature_c: int
    power_mw: int
    ecc_uncorrected: int
    xids: tuple[int, ...]
    lost: bool
    not_supported: frozenset[str]
    mig_slots: int  # 0: the model has no MIG
    mig_enabled: bool
    mig_devices: tuple[SimMig, ...]
    processes: tuple[SimProcess, ...]
    compute_mode: ComputeMode = ComputeMode.DEFAULT  # at driver load; nvmlDeviceSetComputeMode changes it

    @property
    def used_mib(self) -> int:
        own = sum(p.used_mib for p in self.processes)
        return self.base_used_mib + own + sum(p.used_mib for m in self.mig_devices for p in m.processes)


@dataclass(frozen=True, slots=True)
class SimSet:
    driver_version: str
    init_error: NvmlCode | None  # make init() fail as on a node whose driver is missing or broken
    gpus: tuple[SimGpu, ...]

    def owners(self) -> dict[int, SimProcess]:
        """Every simulated process by pid (what /proc would tell about them)."""
        out: dict[int, SimProcess] = {}
        for g in self.gpus:
            for p in g.processes:
                out[p.pid] = p
            for m in g.mig_devices:
                for p in m.processes:
                    out[p.pid] = p
        return out


@cache
def model_behaviour() -> Mapping[str, Mapping[str, Any]]:
    raw = json.loads(resources.files("agent.data").joinpath("sim_models.json").read_text())
    models: Mapping[str, Mapping[str, Any]] = raw["models"]
    return models


def sample(name: str) -> Path:
    """Path of a sample simulated GPU set shipped in agent/data/sim/ (e.g. "a100x4")."""
    return Path(str(resources.files("agent.data").joinpath("sim", f"{name}.yaml")))


def load(path: Path, node: str = "") -> SimSet:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SimFileError(
            str(path), [FieldError("(file)", str(path), f"must be valid YAML or JSON: {exc}")]
        ) from None
    return parse(raw, str(path), node)


def parse(raw: Any, source: str, node: str = "") -> SimSet:
    """A SimSet from decoded YAML; `node` seeds default UUIDs so each node's GPUs differ."""
    errors: list[FieldError] = []
    if not isinstance(raw, dict):
        raise SimFileError(
            source, [FieldError("(file)", _brief(raw), "must be a mapping with a `gpus` list")]
        )
    init_error: NvmlCode | None = None
    raw_init = raw.get("init_error")
    if raw_init is not None:
        try:
            init_error = NvmlCode(raw_init)
        except ValueError:
            errors.append(FieldError("init_error", raw_init, "must be an NVML_ERROR_* code name"))
    gpus_raw = raw.get("gpus")
    gpus: list[SimGpu] = []
    if not isinstance(gpus_raw, list):
        errors.append(FieldError("gpus", _brief(gpus_raw), "must be a list"))
    else:
        for i, g in enumerate(gpus_raw):
            gpu = _gpu(g, f"gpus[{i}]", node, i, errors)
            if gpu is not None:
                gpus.append(gpu)
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids):
        errors.append(FieldError("gpus[].uuid", ",".join(uuids), "must be unique"))
    pids = [p for g in gpus for p in _pids(g)]
    if len(set(pids)) != len(pids):
        errors.append(FieldError("gpus[].processes[].pid", ",".join(map(str, pids)), "must be unique"))
    extra = set(raw) - {"gpus", "driver_version", "init_error", "_comment"}
    for key in sorted(extra):
        errors.append(FieldError(key, _brief(raw[key]), "is not a known field"))
    if errors:
        raise SimFileError(source, errors)
    return SimSet(
        driver_version=str(raw.get("driver_version", "550.54.15")), init_error=init_error, gpus=tuple(gpus)
    )


def _pids(g: SimGpu) -> Iterator[int]:
    yield from (p.pid for p in g.processes)
    for m in g.mig_devices:
        yield from (p.pid for p in m.processes)


_GPU_FIELDS = {
    "model",
    "uuid",
    "memory_mib",
    "base_used_mib",
    "utilization_percent",
    "memory_utilization_percent",
    "temperature_c",
    "power_mw",
    "ecc_uncorrected",
    "xids",
    "lost",
    "not_supported",
    "mig",
    "processes",
    "compute_mode",
}


def _int(
    d: Mapping[str, Any],
    key: str,
    path: str,
    default: int,
    bounds: tuple[int, int],
    *,
    errors: list[FieldError],
) -> int:
    lo, hi = bounds
    v: object = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        errors.append(FieldError(f"{path}.{key}", v, f"must be an integer in [{lo}, {hi}]"))
        return default
    return v


def _gpu(g: Any, path: str, node: str, index: int, errors: list[FieldError]) -> SimGpu | None:
    if not isinstance(g, dict):
        errors.append(FieldError(path, _brief(g), "must be a mapping"))
        return None
    for key in sorted(set(g) - _GPU_FIELDS):
        errors.append(FieldError(f"{path}.{key}", _brief(g[key]), "is not a known field"))
    try:
        model = catalog.lookup(str(g.get("model", "")))
    except KeyError as exc:
        errors.append(FieldError(f"{path}.model", g.get("model"), str(exc.args[0])))
        return None
    behaviour = model_behaviour().get(model.name, {})
    uuid = str(g.get("uuid") or f"GPU-{uuidlib.uuid5(_UUID_NS, f'{node}/{index}')}")
    if not uuid.startswith("GPU-"):
        errors.append(FieldError(f"{path}.uuid", uuid, "must start with 'GPU-' as NVML UUIDs do"))
    memory = _int(g, "memory_mib", path, model.memory_mib, (1, 1 << 22), errors=errors)
    ns_raw = g.get("not_supported", [])
    if not isinstance(ns_raw, list) or any(q not in QUERIES for q in ns_raw):
        errors.append(FieldError(f"{path}.not_supported", ns_raw, f"must be a list of {', '.join(QUERIES)}"))
        ns_raw = []
    xids = g.get("xids", [])
    if not isinstance(xids, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in xids
    ):
        errors.append(FieldError(f"{path}.xids", xids, "must be a list of positive XID numbers"))
        xids = []
    lost = g.get("lost", False)
    if not isinstance(lost, bool):
        errors.append(FieldError(f"{path}.lost", lost, "must be true or false"))
        lost = False
    mig_slots = int(behaviour.get("mig_slots", 0))
    mig_enabled, migs = _mig(
        g.get("mig"), f"{path}.mig", model=model.name, gpu_uuid=uuid, slots=mig_slots, errors=errors
    )
    processes = _processes(g.get("processes", []), f"{path}.processes", errors)
    mode_raw = g.get("compute_mode", ComputeMode.DEFAULT.value)
    try:
        mode = ComputeMode(mode_raw)
    except ValueError:
        known = ", ".join(m.value for m in ComputeMode)
        errors.append(FieldError(f"{path}.compute_mode", str(mode_raw), f"must be one of {known}"))
        mode = ComputeMode.DEFAULT
    if mig_enabled and processes:
        errors.append(
            FieldError(
                f"{path}.processes",
                f"{len(processes)} processes",
                "must be empty with MIG enabled: "
                "processes run on MIG devices (list them under mig.devices[].processes)",
            )
        )
    gpu = SimGpu(
        model=model.name,
        product_name=model.aliases[0] if model.aliases else model.name,
        uuid=uuid,
        memory_mib=memory,
        base_used_mib=_int(g, "base_used_mib", path, 0, (0, memory), errors=errors),
        utilization_percent=_int(g, "utilization_percent", path, 0, (0, 100), errors=errors),
        memory_utilization_percent=_int(g, "memory_utilization_percent", path, 0, (0, 100), errors=errors),
        temperature_c=_int(g, "temperature_c", path, 40, (0, 150), errors=errors),
        power_mw=_int(g, "power_mw", path, 60000, (0, 2_000_000), errors=errors),
        ecc_uncorrected=_int(g, "ecc_uncorrected", path, 0, (0, 1 << 31), errors=errors),
        xids=tuple(xids),
        lost=lost,
        not_supported=frozenset(ns_raw) | frozenset(behaviour.get("not_supported", ())),
        mig_slots=mig_slots,
        mig_enabled=mig_enabled,
        mig_devices=migs,
        processes=processes,
        compute_mode=mode,
    )
    if gpu.used_mib > gpu.memory_mib:
        errors.append(FieldError(path, f"{gpu.used_mib} MiB used", f"must not exceed memory_mib={memory}"))
    for m in migs:
        used = sum(p.used_mib for p in m.processes)
        if used > m.memory_mib:
            errors.append(
                FieldError(f"{path}.mig.devices[{m.slot}]", f"{used} MiB used", "must not exceed memory_mib")
            )
    return gpu


def _mig(
    raw: Any, path: str, *, model: str, gpu_uuid: str, slots: int, errors: list[FieldError]
) -> tuple[bool, tuple[SimMig, ...]]:
    if raw is None:
        return False, ()
    if not isinstance(raw, dict):
        errors.append(FieldError(path, _brief(raw), "must be a mapping with `enabled` and `devices`"))
        return False, ()
    enabled = raw.get("enabled", False)
    if not isinstance(enabled, bool):
        errors.append(FieldError(f"{path}.enabled", enabled, "must be true or false"))
        return False, ()
    if enabled and slots == 0:
        errors.append(FieldError(f"{path}.enabled", True, f"model {model} has no MIG support"))
        return False, ()
    devices_raw = raw.get("devices", [])
    if not isinstance(devices_raw, list) or len(devices_raw) > slots:
        errors.append(
            FieldError(f"{path}.devices", _brief(devices_raw), f"must be a list of at most {slots}")
        )
        return enabled, ()
    if devices_raw and not enabled:
        errors.append(
            FieldError(f"{path}.devices", f"{len(devices_raw)} devices", "must be empty with MIG disabled")
        )
        return enabled, ()
    out: list[SimMig] = []
    profiles = catalog.lookup(model).mig_profiles
    for slot, dpath, d in _mappings(devices_raw, f"{path}.devices", "must be a mapping", errors):
        for key in sorted(set(d) - {"profile", "memory_mib", "processes"}):
            errors.append(FieldError(f"{dpath}.{key}", _brief(d[key]), "is not a known field"))
        name = str(d.get("profile", ""))
        profile = next((p for p in profiles if p.name == name), None)
        if profile is None:
            known = ", ".join(p.name for p in profiles)
            errors.append(FieldError(f"{dpath}.profile", name, f"must be a MIG profile of {model} ({known})"))
            continue
        out.append(
            SimMig(
                slot=slot,
                uuid=f"MIG-{uuidlib.uuid5(_UUID_NS, f'{gpu_uuid}/{slot}')}",
                profile=profile.name,
                memory_mib=_int(d, "memory_mib", dpath, profile.memory_mib, (1, 1 << 22), errors=errors),
                processes=_processes(d.get("processes", []), f"{dpath}.processes", errors),
            )
        )
    layout = tuple(m.profile for m in out)
    if layout and (rule := catalog.mig_layout_error(catalog.lookup(model), layout)):
        errors.append(FieldError(f"{path}.devices", ",".join(layout), rule))
    return enabled, tuple(out)


def _mappings(
    items: list[Any], path: str, rule: str, errors: list[FieldError]
) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """Each item that is a mapping, with its index and path; any other item is reported under `rule`."""
    for i, item in enumerate(items):
        item_path = f"{path}[{i}]"
        if isinstance(item, dict):
            yield i, item_path, item
        else:
            errors.append(FieldError(item_path, _brief(item), rule))


def _processes(raw: Any, path: str, errors: list[FieldError]) -> tuple[SimProcess, ...]:
    if not isinstance(raw, list):
        errors.append(FieldError(path, _brief(raw), "must be a list"))
        return ()
    out: list[SimProcess] = []
    for _, ppath, p in _mappings(raw, path, "must be a mapping with pid and used_mib", errors):
        for key in sorted(set(p) - {"pid", "used_mib", "pod_uid", "container", "mps"}):
            errors.append(FieldError(f"{ppath}.{key}", _brief(p[key]), "is not a known field"))
        mps = p.get("mps", False)
        if not isinstance(mps, bool):
            errors.append(FieldError(f"{ppath}.mps", repr(mps), "must be true or false"))
            mps = False
        out.append(
            SimProcess(
                pid=_int(p, "pid", ppath, 0, (1, 1 << 22), errors=errors),
                used_mib=_int(p, "used_mib", ppath, 0, (0, 1 << 22), errors=errors),
                pod_uid=str(p.get("pod_uid", "")),
                container=str(p.get("container", "")),
                mps=mps,
            )
        )
    return tuple(out)
