"""One typed reading of a pod: what every part of gpupack reads off a Pod object, read once (pure).

The webhook, the extender's handlers, its informer cache and the agent each get a pod as a JSON object
(validated by their own wire model, or by the apiserver). `read` turns it into a `PodView`; every rule,
plan and patch after that takes the view, so a field of the pod is read in exactly one place:

- `GpuAsk`: the gpupack.io annotations a user writes, as written (the request's rules give them meaning);
- `ContainerView`: each container with its JSON pointer, field path, kind, env by name, mounts, gpupack
  resources, whole-GPU request and host (CPU/memory) request;
- the GPU container: the one `gpu-fraction-container-name` names, else the first regular container.

A new annotation is taught here (one `GpuAsk` field) and in the one rule of `app.core.request` that gives it a
meaning. Entries of the wrong type read as empty, so no caller crashes on a hand-made or hostile object.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Final, Generic, NamedTuple, Self, TypeVar, overload

from app.core import names
from app.core.hostres import MIB, HostResources, quantity
from app.core.objects import as_list, as_object, string_map

WHOLE_GPU_RESOURCE: Final = "nvidia.com/gpu"

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


class Kind(StrEnum):
    """Where in the spec a container sits; the value is the spec's field name."""

    REGULAR = "containers"
    INIT = "initContainers"
    EPHEMERAL = "ephemeralContainers"  # `kubectl debug`: no resources, never given a GPU share


@dataclass(frozen=True, slots=True)
class Mount:
    """One volumeMount of a container."""

    volume: str
    path: str
    whole_dir: bool  # no subPath / subPathExpr: the volume's root is mounted


@dataclass(frozen=True, slots=True)
class Volume:
    """One volume of the pod; `host_path` is set for a hostPath volume."""

    name: str | None
    host_path: str | None = None


class ContainerView(NamedTuple):
    """One container of the pod, as every rule and patch reads it (a named tuple: one is built for
    every container of every pod read, at a third of a frozen dataclass's cost)."""

    kind: Kind
    position: int  # in its list of the spec
    name: str
    env: Mapping[str, Mapping[str, Any]] = _EMPTY  # by name: the last entry (the one the kubelet applies)
    has_resources: bool = False  # `resources` holds anything (even empty requests/limits)
    requests: Mapping[str, Any] = _EMPTY  # quantities as sent
    limits: Mapping[str, Any] = _EMPTY
    ours: tuple[tuple[str, str], ...] = ()  # gpupack.io/* resources in requests, then limits (first wins)
    whole_gpus: str | None = None  # nvidia.com/gpu as written in limits (or requests), if any
    sidecar: bool = False  # an init container with restartPolicy Always: runs beside the others
    source: Mapping[str, Any] = _EMPTY  # the container as sent

    @property
    def mounts(self) -> tuple[Mount, ...]:
        """Its volumeMounts (read when asked: only the MPS pipe plan needs them, for one container)."""
        return tuple(m for m in map(_mount, as_list(self.source.get("volumeMounts"))) if m is not None)

    @property
    def host(self) -> HostResources:
        """CPU (milli) and memory (MiB) requested, rounded up (worked out when asked: the webhook never
        needs it); a limit without a request defaults the request to the limit (the apiserver does too)."""
        return _host(self.requests, self.limits)

    @property
    def init(self) -> bool:
        return self.kind is Kind.INIT

    @property
    def pointer(self) -> str:
        """The container's JSON pointer (RFC 6901), for patch ops."""
        return f"/spec/{self.kind}/{self.position}"

    @property
    def where(self) -> str:
        """The container's field path, for messages."""
        return f"spec.{self.kind}[{self.name}]"

    def resource(self, key: str) -> str | None:
        """A resource as the container limits it, else as it requests it (None: neither)."""
        return _limit_or_request(self.requests, self.limits, key)

    def without(self, keys: Collection[str]) -> ContainerView:
        """The container with resources `keys` removed from its requests and limits (GPU resources: its
        CPU and memory request stays)."""
        requests = {k: v for k, v in self.requests.items() if k not in keys}
        limits = {k: v for k, v in self.limits.items() if k not in keys}
        return self._replace(
            requests=requests,
            limits=limits,
            ours=_ours(requests, limits),
            whole_gpus=_whole(requests, limits),
        )


class GpuAsk(NamedTuple):
    """The gpupack.io annotations of a GPU-share request, as written (None: absent). A named tuple: it
    is built for every pod read, and builds in a third of a frozen dataclass's time.

    Teaching gpupack a new annotation starts here: one field, filled in `ask_of`.
    """

    fraction: str | None = None  # gpu-fraction
    memory: str | None = None  # gpu-memory
    memory_limit: str | None = None  # gpupack.io/gpu-memory-limit
    # KAI-Scheduler's NvFractions annotations as (key, value), sorted by key (app.core.nvfractions reads them)
    nv_fractions: tuple[tuple[str, str], ...] = ()
    # KAI-Scheduler 0.18's limits: gpu-fraction.limit, gpu-memory.limit, and each
    # kai.scheduler/container.<c>.gpu-memory.portion.limit as (key, value), sorted by key
    fraction_limit: str | None = None
    kai_memory_limit: str | None = None
    portion_limits: tuple[tuple[str, str], ...] = ()
    mig_profile: str | None = None  # mig-profile
    num_devices: str | None = None  # gpu-fraction-num-devices
    container: str | None = None  # gpu-fraction-container-name
    model: str | None = None  # gpu-model
    isolation: str | None = None  # isolation
    memory_enforcement: str | None = None  # memory-enforcement

    @property
    def nv_container(self) -> str | None:
        """The container the first per-container NvFractions annotation names (None: none does)."""
        return next((split[0] for key, _ in self.nv_fractions if (split := nv_key(key))), None)

    @property
    def wanted(self) -> bool:
        """The pod asks gpupack for a GPU share (the webhook's matchConditions say the same): a request, a
        limit alone in any spelling (so that its missing request is refused rather than the limit silently
        ignored), or a KAI NvFractions memory request or limit (a compute mode alone asks for nothing)."""
        return (
            self.fraction is not None
            or self.memory is not None
            or self.mig_profile is not None
            or self.memory_limit is not None
            or self.fraction_limit is not None
            or self.kai_memory_limit is not None
            or bool(self.portion_limits)
            or any(
                (split := nv_key(key)) and split[1] != names.KAI_COMPUTE_MODE for key, _ in self.nv_fractions
            )
        )


def ask_of(annotations: Mapping[str, str]) -> GpuAsk:
    """The GPU-share request annotations among `annotations`."""
    if not annotations:
        return _NO_ASK  # most pods of a cluster carry no annotation at all
    get = annotations.get
    nv: list[tuple[str, str]] = []
    portions: list[tuple[str, str]] = []
    for k, v in annotations.items():  # one pass: most pods carry no KAI key, and it is built for every pod
        if k.startswith(_KAI_PREFIXES):
            if k == names.KAI_POD_COMPUTE_MODE or nv_key(k):
                nv.append((k, v))
            elif portion_key(k) is not None:
                portions.append((k, v))
    return GpuAsk(
        fraction=get(names.GPU_FRACTION),
        memory=get(names.GPU_MEMORY),
        memory_limit=get(names.GPU_MEMORY_LIMIT),
        nv_fractions=tuple(sorted(nv)) if nv else (),
        fraction_limit=get(names.KAI_FRACTION_LIMIT),
        kai_memory_limit=get(names.KAI_GPU_MEMORY_LIMIT),
        portion_limits=tuple(sorted(portions)) if portions else (),
        mig_profile=get(names.MIG_PROFILE),
        num_devices=get(names.GPU_FRACTION_NUM_DEVICES),
        container=get(names.GPU_FRACTION_CONTAINER_NAME),
        model=get(names.GPU_MODEL),
        isolation=get(names.ISOLATION),
        memory_enforcement=get(names.MEMORY_ENFORCEMENT),
    )


_NO_ASK: Final = GpuAsk()

# Where every KAI key gpupack reads per container or per pod starts (kai.scheduler/: the pod compute mode).
_KAI_PREFIXES: Final = (names.KAI_CONTAINER_PREFIX, "kai.scheduler/")
_NV_FIELDS: Final = frozenset({names.KAI_MEMORY_REQUEST, names.KAI_MEMORY_LIMIT, names.KAI_COMPUTE_MODE})


def nv_key(key: str) -> tuple[str, str] | None:
    """(container, field) of a per-container NvFractions key (`nvidia.com/container.<c>.<field>`), else None.
    A container name is a DNS label (no dots), so the first dot after the prefix ends it."""
    if not key.startswith(names.KAI_CONTAINER_PREFIX):
        return None
    container, _, field_ = key[len(names.KAI_CONTAINER_PREFIX) :].partition(".")
    return (container, field_) if field_ in _NV_FIELDS else None


def portion_key(key: str) -> str | None:
    """The container a KAI `kai.scheduler/container.<c>.gpu-memory.portion.limit` key names, else None."""
    if not key.startswith(names.KAI_PORTION_PREFIX):
        return None
    container, _, field_ = key[len(names.KAI_PORTION_PREFIX) :].partition(".")
    return container if field_ == names.KAI_PORTION_LIMIT and container else None


_T = TypeVar("_T")


class _once(Generic[_T]):  # noqa: N801 (a decorator, named like functools.cached_property)
    """functools.cached_property without its lock: Python 3.11's takes a lock shared by every instance on
    each first read, and a relist makes one such read for every pod it reads. Two threads reading a view
    at once may both work a value out; they get equal values, and the last one is kept."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self._fn = fn
        self._name = fn.__name__
        self.__doc__ = fn.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> _T | Self:
        if obj is None:
            return self
        value = obj.__dict__[self._name] = self._fn(obj)  # read from the instance from now on
        return value


@dataclass(frozen=True)
class PodView:
    """A pod as gpupack reads it.

    What only some readers need (host request, volumes, ephemeral containers, container IDs) is read
    from `source` on first use, once.
    """

    uid: str = ""
    namespace: str = ""
    name: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    ask: GpuAsk = field(init=False)  # read off `annotations`
    deleting: bool = False
    node_name: str = ""  # spec.nodeName, "" while pending
    phase: str = "Pending"
    containers: tuple[ContainerView, ...] = ()  # the regular containers in order, then the init containers
    affinity: Any = None  # spec.affinity as sent: the webhook ANDs its terms into it
    scheduler_name: str | None = None
    source: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)  # the pod as sent

    @_once
    def _spec(self) -> Mapping[str, Any]:
        return as_object(self.source.get("spec"))

    @_once
    def ephemeral(self) -> tuple[ContainerView, ...]:
        """Ephemeral containers (`kubectl debug`): never counted among `containers`."""
        items = as_list(self._spec.get(Kind.EPHEMERAL))
        return tuple(_container(Kind.EPHEMERAL, i, item) for i, item in enumerate(items))

    @_once
    def volumes(self) -> tuple[Volume, ...]:
        return tuple(_volume(v) for v in as_list(self._spec.get("volumes")))

    @_once
    def runtime_class_name(self) -> str | None:
        """spec.runtimeClassName as sent (None when unset or not a string)."""
        value = self._spec.get("runtimeClassName")
        return value if isinstance(value, str) else None

    @_once
    def container_ids(self) -> Mapping[str, str]:
        """Runtime container ID (without the runtime:// prefix) -> container name, init containers too."""
        return _container_ids(as_object(self.source.get("status")))

    @_once
    def host(self) -> HostResources:
        """The pod's effective request, as kube-scheduler's NodeResourcesFit computes it.

        max(regular containers + restartable (sidecar) init containers, each plain init container plus the
        sidecars started before it) + pod overhead. CPU rounds up to a milli-core, memory up to a MiB.
        """
        cpu = memory = sidecar_cpu = sidecar_memory = init_cpu = init_memory = 0  # plain ints: read per pod
        for c in self.containers:
            host = c.host
            if c.kind is Kind.REGULAR:
                cpu += host.cpu_milli
                memory += host.memory_mib
            elif c.sidecar:
                sidecar_cpu += host.cpu_milli
                sidecar_memory += host.memory_mib
                init_cpu, init_memory = max(init_cpu, sidecar_cpu), max(init_memory, sidecar_memory)
            else:
                init_cpu = max(init_cpu, sidecar_cpu + host.cpu_milli)
                init_memory = max(init_memory, sidecar_memory + host.memory_mib)
        overhead = _host(as_object(self._spec.get("overhead")), {})
        return HostResources(
            max(cpu + sidecar_cpu, init_cpu) + overhead.cpu_milli,
            max(memory + sidecar_memory, init_memory) + overhead.memory_mib,
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "ask", ask_of(self.annotations))

    @property
    def regular(self) -> tuple[ContainerView, ...]:
        return tuple(c for c in self.containers if c.kind is Kind.REGULAR)

    @_once
    def gpu_container(self) -> str | None:
        """The name of the container that gets the GPU: the one gpu-fraction-container-name or else an
        NvFractions annotation names, else the first regular container; None for a pod with neither.
        (Whether that name exists is a rule's business.)"""
        named = self.ask.container or self.ask.nv_container
        if named:
            return named
        return next((c.name for c in self.containers if c.kind is Kind.REGULAR), None)

    def with_takeover(self, annotations: Mapping[str, str], container: ContainerView) -> PodView:
        """The view after `annotations` were added and `container` replaced the one at its place: what our
        mutation reads after another admission step (the HAMi take-over) rewrote the pod."""
        merged = {**self.annotations, **annotations}
        place = (container.kind, container.position)
        containers = tuple(container if (c.kind, c.position) == place else c for c in self.containers)
        return replace(self, annotations=merged, containers=containers)


def read(pod: Mapping[str, Any]) -> PodView:
    """The view of a Pod object (a JSON object as the API sends it)."""
    meta = as_object(pod.get("metadata"))
    spec = as_object(pod.get("spec"))
    status = as_object(pod.get("status"))
    containers = [_container(Kind.REGULAR, i, item) for i, item in enumerate(as_list(spec.get(Kind.REGULAR)))]
    if Kind.INIT in spec:
        containers += [_container(Kind.INIT, i, item) for i, item in enumerate(as_list(spec[Kind.INIT]))]
    scheduler, node, phase = spec.get("schedulerName"), spec.get("nodeName"), status.get("phase")
    annotations = string_map(meta.get("annotations"))
    # Every field `PodView.__init__` sets, set at once: a frozen dataclass's __init__ sets each one through
    # object.__setattr__, which was a third of reading a pod that a relist reads 50 000 of.
    view = object.__new__(PodView)
    view.__dict__.update(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        labels=string_map(meta.get("labels")),
        annotations=annotations,
        ask=ask_of(annotations),
        deleting=bool(meta.get("deletionTimestamp")),
        node_name=node if isinstance(node, str) else "",
        phase=phase if isinstance(phase, str) and phase else "Pending",
        containers=tuple(containers),
        affinity=spec.get("affinity"),
        scheduler_name=scheduler if isinstance(scheduler, str) else None,
        source=pod,
    )
    return view


def _container(kind: Kind, index: int, item: Any) -> ContainerView:
    c = as_object(item)
    name = c.get("name")
    resources = as_object(c.get("resources"))
    requests, limits = as_object(resources.get("requests")), as_object(resources.get("limits"))
    env = c.get("env")
    return ContainerView(  # by position: a relist reads one for every container of every pod
        kind,
        index,
        name if isinstance(name, str) else "",
        _env(env) if env else _EMPTY,
        bool(resources),
        requests,
        limits,
        _ours(requests, limits) if requests or limits else (),
        _whole(requests, limits),
        kind is Kind.INIT and c.get("restartPolicy") == "Always",
        c,
    )


def _env(items: Any) -> Mapping[str, Mapping[str, Any]]:
    """Env entries by name; of repeated names the last, which is the one the kubelet applies."""
    if not items:
        return _EMPTY
    out: dict[str, Mapping[str, Any]] = {}
    for entry in as_list(items):
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            out[entry["name"]] = entry
    return out


def _mount(item: Any) -> Mount | None:
    m = as_object(item)
    volume, path = m.get("name"), m.get("mountPath")
    if not isinstance(volume, str) or not isinstance(path, str):
        return None
    return Mount(volume, path, whole_dir=not m.get("subPath") and not m.get("subPathExpr"))


def _volume(item: Any) -> Volume:
    v = as_object(item)
    name, path = v.get("name"), as_object(v.get("hostPath")).get("path")
    return Volume(name if isinstance(name, str) else None, path if isinstance(path, str) else None)


def _limit_or_request(requests: Mapping[str, Any], limits: Mapping[str, Any], key: str) -> str | None:
    value = limits.get(key)
    if value is None:
        value = requests.get(key)
    return None if value is None else str(value)


def _whole(requests: Mapping[str, Any], limits: Mapping[str, Any]) -> str | None:
    """nvidia.com/gpu as written in limits (or requests)."""
    whole = limits.get(WHOLE_GPU_RESOURCE, requests.get(WHOLE_GPU_RESOURCE))
    return None if whole is None else str(whole)


def _ours(requests: Mapping[str, Any], limits: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The gpupack.io/* resources of a container, requests first (a key in both: the request's value)."""
    prefix = names.RESOURCE_PREFIX
    if not any(str(key).startswith(prefix) for part in (requests, limits) for key in part):
        return ()  # most containers: CPU and memory only
    out: dict[str, str] = {}
    for part in (requests, limits):
        for key, value in part.items():
            if str(key).startswith(prefix):
                out.setdefault(str(key), str(value))
    return tuple(out.items())


def _host(requests: Mapping[str, Any], limits: Mapping[str, Any]) -> HostResources:
    """CPU (milli) and memory (MiB) requested, rounded up; a limit without a request defaults the request
    to the limit (the apiserver does it too)."""
    cpu, memory = requests.get("cpu", limits.get("cpu")), requests.get("memory", limits.get("memory"))
    if (cpu is None or type(cpu) is str) and (memory is None or type(memory) is str):
        return _host_of(cpu, memory)
    return _host_uncached(cpu, memory)


@lru_cache(maxsize=4096)
def _host_of(cpu: str | None, memory: str | None) -> HostResources:
    """Containers repeat a few request pairs ("500m", "8Gi"): the exact arithmetic on fractions is done
    once per pair, not for every container of every pod a relist reads."""
    return _host_uncached(cpu, memory)


def _host_uncached(cpu: object, memory: object) -> HostResources:
    return HostResources(math.ceil(quantity(cpu) * 1000), math.ceil(quantity(memory) / MIB))


def _container_ids(status: Mapping[str, Any]) -> dict[str, str]:
    """Runtime container ID (without the runtime:// prefix) -> container name, init containers included.

    The GPU container may be an init container (a sidecar runs beside the others), so theirs count too.
    """
    ids: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses"):
        for item in as_list(status.get(key)):
            st = as_object(item)
            cid = str(st.get("containerID") or "")
            if cid:
                ids[cid.split("://", 1)[-1]] = str(st.get("name") or "")
    return ids
