"""The request model: a pod's view (app.core.podview) → GpuRequest, or every rule its annotations break
(pure).

The rules read `Asked`, the part of the view they need (the GPU-share annotations and a few facts per
container): a value, so each distinct one is checked once and the pods that share it (a workload's
replicas) get its verdict from a table. Each rule is one function over `_Reading`, which holds the `Asked`
and each unit-valued annotation parsed once (its value, or the error its rule reports); `_build` takes the
parsed values as they are.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from fractions import Fraction
from functools import lru_cache
from typing import Final, NamedTuple, TypeVar

from app.core import catalog, names, nvfractions, units
from app.core.errors import RequestError
from app.core.hostres import HostResources
from app.core.isolation import MemoryEnforcement, memory_levels
from app.core.model import MILLI_PER_GPU, Demand
from app.core.podview import WHOLE_GPU_RESOURCE, ContainerView, GpuAsk, Kind, PodView, portion_key

MAX_DEVICES: Final = 16  # more GPUs than any node we know of carries; a typo guard, not a policy

PodDemand = Demand | tuple[RequestError, ...]  # what a pod asks for, or every rule its request breaks

# A Kubernetes label value (the node label gpupack.io/gpu-model is matched with `In`).
_LABEL_VALUE: Final = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


class Isolation(StrEnum):
    """How co-located pods are kept apart on a GPU."""

    MPS = "mps"  # MPS client limits (thread share, pinned memory); inert where no MPS daemon runs
    NONE = "none"  # co-location only
    MIG = "mig"  # hardware isolation: a whole MIG device (gpu-memory picks the smallest that fits), no MPS


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """A valid GPU request: `count` GPUs, each giving `milli` compute share or `memory_mib` memory."""

    container: str  # the container that gets the GPU (a regular or an init container)
    count: int
    milli: int | None  # set for a gpu-fraction request
    memory_mib: int | None  # set for a gpu-memory request
    mig_profile: str = ""  # set for a gpupack.io/mig-profile request (neither milli nor memory_mib)
    models: tuple[str, ...] = ()  # acceptable GPU models (node label values); empty = any
    # The hard cap on GPU memory per GPU the pod may use when it bursts above its request: MiB (set by
    # gpupack.io/gpu-memory-limit, KAI's gpu-memory.limit or its NvFractions limit), or a share of the GPU's
    # memory (KAI's gpu-fraction.limit or per-container portion limit); both None: no burst, the cap is the
    # share itself.
    memory_limit_mib: int | None = None
    memory_limit_share: Fraction | None = None
    isolation: Isolation = Isolation.MPS
    isolation_explicit: bool = False  # written by the pod: then MPS is required, not best effort
    isolation_written: str = ""  # what the pod wrote that made it explicit, as key=value
    memory_enforcement: MemoryEnforcement = MemoryEnforcement.NONE  # the least a GPU must enforce
    warnings: tuple[str, ...] = ()  # accepted, but the user should know (e.g. rounding)

    @property
    def burstable(self) -> bool:
        """The pod may use more memory than its request, up to a limit."""
        return self.memory_limit_mib is not None or self.memory_limit_share is not None

    @property
    def resource(self) -> tuple[str, int]:
        """The extended resource and amount the GPU container requests (all devices together)."""
        if self.milli is not None:
            return names.RESOURCE_GPU_MILLI, self.milli * self.count
        if self.mig_profile:  # the least memory a device of that profile has on any model
            return names.RESOURCE_GPU_MEMORY_MIB, catalog.mig_profile_memory(self.mig_profile) * self.count
        assert self.memory_mib is not None
        return names.RESOURCE_GPU_MEMORY_MIB, self.memory_mib * self.count

    def demand(self) -> Demand:
        return Demand(
            count=self.count,
            milli=self.milli,
            memory_mib=self.memory_mib,
            models=frozenset(self.models),
            needs_mps=self.isolation_explicit and self.isolation is Isolation.MPS,
            mps_asked_by=self.isolation_written if self.isolation is Isolation.MPS else "",
            mig=self.isolation is Isolation.MIG,
            mig_profile=self.mig_profile,
            timeslice=self.isolation_explicit and self.isolation is Isolation.NONE,
            memory_enforcement=self.memory_enforcement,
            memory_limit_mib=self.memory_limit_mib,
            memory_limit_share=self.memory_limit_share,
        )


def unannotated_errors(pod: PodView) -> tuple[RequestError, ...]:
    """For a pod without gpu-fraction/gpu-memory: one error per gpupack resource a container asks for.

    Those resources are the webhook's output, not an input: without the annotations the pod would get
    no allocation env (a CUDA image's default NVIDIA_VISIBLE_DEVICES=all exposes every GPU of the node)
    and the extender would not track its share.
    """
    return tuple(
        RequestError(
            resource,
            raw,
            f"requested by {_kind(c)} {c.name!r} without a GPU-share annotation; gpupack resources are "
            f"set by the gpupack webhook: remove {resource} and annotate the pod with "
            f'{names.GPU_FRACTION} (e.g. "0.5") or {names.GPU_MEMORY} (e.g. "4Gi") instead',
        )
        for c in pod.containers
        for resource, raw in c.ours
    )


def _kind(c: ContainerView | ContainerFacts) -> str:
    return "init container" if c.init else "container"


def parse(pod: PodView) -> GpuRequest | tuple[RequestError, ...]:
    """Check every rule; return the request, or all errors in rule order."""
    return _verdict(Asked.of(pod))


class ContainerFacts(NamedTuple):
    """What the rules read of one container."""

    kind: Kind
    name: str
    whole_gpus: str | None  # nvidia.com/gpu as written, if any
    ours: tuple[tuple[str, str], ...]  # its gpupack.io/* resources

    @property
    def init(self) -> bool:
        return self.kind is Kind.INIT


class Asked(NamedTuple):
    """Everything of a pod that the rules read: its GPU-share annotations and a few facts per container.

    A value: the pods of one workload (a Deployment's replicas, a Job's) share it, so its verdict is worked
    out once (`_verdict`) and every later pod of that kind only reads it.
    """

    ask: GpuAsk
    containers: tuple[ContainerFacts, ...]  # the regular containers in order, then the init containers
    gpu_container: str | None  # as PodView.gpu_container names it

    @classmethod
    def of(cls, pod: PodView) -> Asked:
        facts = tuple(ContainerFacts(c.kind, c.name, c.whole_gpus, c.ours) for c in pod.containers)
        return cls(pod.ask, facts, pod.gpu_container)

    @property
    def regular(self) -> tuple[ContainerFacts, ...]:
        return tuple(c for c in self.containers if c.kind is Kind.REGULAR)


@lru_cache(maxsize=1024)
def _verdict(asked: Asked) -> GpuRequest | tuple[RequestError, ...]:
    # A bounded table: the values are the users', and a cluster runs far fewer kinds of GPU pod than this.
    reading = _Reading.of(asked)
    errors = tuple(err for rule in RULES for err in rule(reading))
    if errors:
        return errors
    return _build(reading)


def pod_demand(pod: PodView) -> PodDemand:
    """What a pod asks of a node, or every rule its request breaks.

    The GPU share comes from the annotations (`parse`, the webhook's rules); a pod without them is read
    from the gpupack resources its containers request. CPU and memory are the pod's host request, so
    placement scores exactly as the simulator does.

    Pods of one workload ask alike: the answer is worked out once per distinct set of what it depends on
    (the request annotations, each container's kind, name and gpupack and whole-GPU resources, the host
    request), so a relist of 25 000 gpupack pods runs the rules a few times, not 25 000 times.
    """
    return _demand(Asked.of(pod), pod.host)


@lru_cache(maxsize=4096)
def _demand(asked: Asked, host: HostResources) -> PodDemand:
    # A bounded table, keyed as `_verdict` is plus the host request: the answers are immutable, so pods share
    # them, and a cluster runs far fewer kinds of pod than this.
    if asked.ask.wanted:
        parsed = _verdict(asked)
        if not isinstance(parsed, GpuRequest):
            return parsed
        demand = parsed.demand()
    else:
        from_resources = _resource_demand(asked)
        if not isinstance(from_resources, Demand):
            return from_resources
        demand = from_resources
    return replace(demand, cpu_milli=host.cpu_milli, host_memory_mib=host.memory_mib)


def _resource_demand(asked: Asked) -> PodDemand:
    """A pod's GPU demand from the gpupack resources of its regular containers (limits = requests)."""
    raw_count = asked.ask.num_devices if asked.ask.num_devices is not None else "1"
    try:
        count = units.positive_int(raw_count, MAX_DEVICES)
    except units.UnitError as err:
        return (RequestError(names.GPU_FRACTION_NUM_DEVICES, raw_count, err.rule),)
    totals: dict[str, int] = {}
    errors: list[RequestError] = []
    for c in asked.containers:
        for resource, raw in c.ours if not c.init else ():
            if resource not in (names.RESOURCE_GPU_MILLI, names.RESOURCE_GPU_MEMORY_MIB):
                continue
            # The apiserver stores quantities canonically ("1000" comes back as "1k"): parse, don't match.
            value = units.quantity_value(raw)
            if value is None or value < 0 or value.denominator != 1:
                rule = f"must be a whole, non-negative quantity (container {c.name!r})"
                errors.append(RequestError(resource, raw, rule))
            else:
                totals[resource] = totals.get(resource, 0) + int(value)
    if errors:
        return tuple(errors)
    milli = totals.get(names.RESOURCE_GPU_MILLI, 0)
    memory = totals.get(names.RESOURCE_GPU_MEMORY_MIB, 0)
    if milli and memory:
        rule = f"must not be requested together with {names.RESOURCE_GPU_MILLI}; pick one"
        return (RequestError(names.RESOURCE_GPU_MEMORY_MIB, str(memory), rule),)
    resource, total = (names.RESOURCE_GPU_MILLI, milli) if milli else (names.RESOURCE_GPU_MEMORY_MIB, memory)
    if not total:
        rule = f"the pod requests neither {names.RESOURCE_GPU_MILLI} nor {names.RESOURCE_GPU_MEMORY_MIB}"
        return (RequestError(names.RESOURCE_GPU_MILLI, "", rule),)
    if total % count:
        return (RequestError(resource, str(total), f"does not split evenly over {count} devices"),)
    models = frozenset(gpu_models(asked.ask.model))
    if not milli:
        return Demand(count=count, memory_mib=total // count, models=models)
    if total // count > MILLI_PER_GPU:
        rule = f"is more than {MILLI_PER_GPU} per device over {count} devices"
        return (RequestError(resource, str(total), rule),)
    return Demand(count=count, milli=total // count, models=models)


def render(errors: Iterable[RequestError]) -> str:
    """Errors as one line, in rule order: what a user reads in a denial or a scheduling event."""
    return "; ".join(str(e) for e in errors)


_T = TypeVar("_T")


def _parsed(key: str, raw: str | None, parser: Callable[[str], _T]) -> _T | RequestError | None:
    """A unit-valued annotation: its value, why it is invalid (the error its rule reports), or absent."""
    if raw is None:
        return None
    try:
        return parser(raw)
    except units.UnitError as err:
        return RequestError(key, raw, err.rule)


@dataclass(frozen=True, slots=True)
class _Reading:
    """What the rules read: the pod's `Asked` and each unit-valued annotation parsed once."""

    asked: Asked
    milli: int | RequestError | None
    memory: units.Memory | RequestError | None
    limit: units.Memory | RequestError | None
    # A limit as a share of each GPU's memory (KAI's gpu-fraction.limit or per-container portion limit).
    share: Fraction | RequestError | None
    count: int | RequestError | None
    nv: nvfractions.NvAsk
    # Where the memory request and limits were written: gpupack's names, or KAI's.
    memory_at: tuple[str, str | None] = (names.GPU_MEMORY, None)  # (key, raw)
    limit_at: tuple[str, str | None] = (names.GPU_MEMORY_LIMIT, None)
    share_at: tuple[str, str | None] = (names.KAI_FRACTION_LIMIT, None)

    @classmethod
    def of(cls, asked: Asked) -> _Reading:
        return cls(asked, *_read_ask(asked.ask))


class _AskValues(NamedTuple):
    """`_Reading`'s fields after `asked`, in order."""

    milli: int | RequestError | None
    memory: units.Memory | RequestError | None
    limit: units.Memory | RequestError | None
    share: Fraction | RequestError | None
    devices: int | RequestError | None  # _Reading.count (a named tuple has a method of that name)
    nv: nvfractions.NvAsk
    memory_at: tuple[str, str | None]
    limit_at: tuple[str, str | None]
    share_at: tuple[str, str | None]


@lru_cache(maxsize=1024)
def _read_ask(ask: GpuAsk) -> _AskValues:
    """Each unit-valued annotation parsed: they read only the `GpuAsk`, which the pods of one workload
    share, and so do pods of other workloads that ask alike in other containers."""
    nv = nvfractions.read(ask.nv_fractions)
    memory_at: tuple[str, str | None] = (names.GPU_MEMORY, ask.memory)
    limit_at: tuple[str, str | None] = (names.GPU_MEMORY_LIMIT, ask.memory_limit)
    parser = limit_parser = units.memory_mib
    # KAI's names: quantities of bytes; a limit alone is also the request, parsed (and reported) once.
    if nv.memory is not None:
        memory_at, parser = nv.memory, units.quantity_mib
        limit_at = nv.limit if nv.request is not None and nv.limit is not None else (limit_at[0], None)
        limit_parser = parser
    elif ask.memory_limit is None and ask.kai_memory_limit is not None and ask.memory is not None:
        # KAI 0.18's gpu-memory.limit, read only where it may stand (_kai_limits refuses it elsewhere).
        limit_at, limit_parser = (
            (names.KAI_GPU_MEMORY_LIMIT, ask.kai_memory_limit),
            units.unit_quantity_mib,
        )
    share_at: tuple[str, str | None] = (names.KAI_FRACTION_LIMIT, None)
    if ask.fraction is not None:  # a share limit is read only beside gpu-fraction (else _kai_limits)
        share_at = next(
            (
                (k, v)
                for k, v in ((names.KAI_FRACTION_LIMIT, ask.fraction_limit), *ask.portion_limits)
                if v is not None
            ),
            share_at,
        )
    return _AskValues(
        milli=_parsed(names.GPU_FRACTION, ask.fraction, units.fraction_milli),
        memory=_parsed(*memory_at, parser),
        limit=_parsed(*limit_at, limit_parser),
        share=_parsed(*share_at, units.memory_share),
        devices=_parsed(
            names.GPU_FRACTION_NUM_DEVICES,
            ask.num_devices,
            lambda raw: units.positive_int(raw, MAX_DEVICES),
        ),
        nv=nv,
        memory_at=memory_at,
        limit_at=limit_at,
        share_at=share_at,
    )


# --- rules: one function per rule, each yields errors naming the annotation, raw value and rule ---


def _one_of_fraction_or_memory(r: _Reading) -> Iterable[RequestError]:
    fraction, memory, profile = r.asked.ask.fraction, r.asked.ask.memory, r.asked.ask.mig_profile
    if r.nv.memory is not None:
        return  # KAI's names ask for memory; _nv_fractions refuses gpupack's request names beside them
    if profile is not None and (fraction is not None or memory is not None):
        other = names.GPU_FRACTION if fraction is not None else names.GPU_MEMORY
        yield RequestError(
            names.MIG_PROFILE,
            profile,
            f"must not be set together with {other}: a MIG device of a profile is taken whole "
            f"(for the smallest MIG device with some memory, use {names.GPU_MEMORY} with "
            f"{names.ISOLATION}: mig)",
        )
    elif profile is not None:
        return
    if fraction is None and memory is None:
        yield RequestError(
            names.GPU_FRACTION, "", f"one of {names.GPU_FRACTION} or {names.GPU_MEMORY} is required"
        )
    elif fraction is not None and memory is not None:
        yield RequestError(
            names.GPU_MEMORY, memory, f"must not be set together with {names.GPU_FRACTION}; use one"
        )


def _no_whole_gpus(r: _Reading) -> Iterable[RequestError]:
    ask = r.asked.ask
    key, raw = next(
        (
            (k, v)
            for k, v in (
                (names.GPU_FRACTION, ask.fraction),
                r.memory_at,
                (names.MIG_PROFILE, ask.mig_profile),
            )
            if v is not None
        ),
        (names.GPU_MEMORY, None),
    )
    # An explicit 0 asks for no whole GPU, so charts that template `nvidia.com/gpu: 0` still work.
    offenders = [c.name for c in r.asked.containers if c.whole_gpus not in (None, "0")]
    if raw is not None and offenders:
        which = ", ".join(repr(n) for n in offenders)
        yield RequestError(
            key, raw, f"must not be combined with {WHOLE_GPU_RESOURCE} (requested by container {which})"
        )


def _fraction_value(r: _Reading) -> Iterable[RequestError]:
    if isinstance(r.milli, RequestError):
        yield r.milli


def _memory_value(r: _Reading) -> Iterable[RequestError]:
    if isinstance(r.memory, RequestError):
        yield r.memory


def _num_devices(r: _Reading) -> Iterable[RequestError]:
    if isinstance(r.count, RequestError):
        yield r.count


def _container_name(r: _Reading) -> Iterable[RequestError]:
    """Any container may get the share, init containers (sidecars included) too, as in KAI-Scheduler."""
    raw = r.asked.ask.container
    every = tuple(c.name for c in r.asked.containers)
    if r.asked.gpu_container is None or not r.asked.regular:
        yield RequestError(
            names.GPU_FRACTION_CONTAINER_NAME, raw or "", "the pod has no container to give the GPU to"
        )
    elif raw is not None and raw not in every:
        known = ", ".join(repr(n) for n in every)
        yield RequestError(
            names.GPU_FRACTION_CONTAINER_NAME,
            raw,
            f"must name one of the pod's containers or init containers ({known})",
        )


def _gpu_models(r: _Reading) -> Iterable[RequestError]:
    raw = r.asked.ask.model
    return () if raw is None else _read_models(raw).errors


def _gpupack_resources_only_on_the_gpu_container(r: _Reading) -> Iterable[RequestError]:
    """The webhook writes our resource on the GPU container; one elsewhere would be an unaccounted share."""
    target = r.asked.gpu_container
    for c in r.asked.containers:
        if c.name != target:
            for resource, raw in c.ours:
                yield RequestError(
                    resource,
                    raw,
                    f"requested by {_kind(c)} {c.name!r}, which is not the GPU container "
                    f"({target!r}); remove it: the gpupack webhook sets {resource} on the GPU container "
                    f"from {names.GPU_FRACTION} or {names.GPU_MEMORY}",
                )


def _isolation(r: _Reading) -> Iterable[RequestError]:
    raw = r.asked.ask.isolation
    if raw is not None and raw not in {i.value for i in Isolation}:
        yield RequestError(names.ISOLATION, raw, "must be one of 'mps', 'none', 'mig'")
    elif raw is None:
        return
    elif raw == Isolation.MIG and r.asked.ask.fraction is not None:
        yield RequestError(
            names.ISOLATION,
            raw,
            f"needs {names.GPU_MEMORY} or {names.MIG_PROFILE}, not {names.GPU_FRACTION}: a MIG device is "
            "taken whole, never shared",
        )
    elif raw != Isolation.MIG and r.asked.ask.mig_profile is not None:
        yield RequestError(
            names.ISOLATION, raw, f"must be 'mig' or absent with {names.MIG_PROFILE}: a MIG device has no MPS"
        )


def _memory_enforcement(r: _Reading) -> Iterable[RequestError]:
    raw = r.asked.ask.memory_enforcement
    if raw is not None and raw not in {m.value for m in MemoryEnforcement}:
        yield RequestError(
            names.MEMORY_ENFORCEMENT,
            raw,
            f"must be one of {memory_levels()} (weakest first): the least a GPU must enforce",
        )
    elif raw in _MPS_LEVELS and r.asked.ask.isolation == Isolation.NONE:
        yield RequestError(
            names.MEMORY_ENFORCEMENT,
            raw,
            f"is an MPS limit, and {names.ISOLATION}: none makes the pod no MPS client: ask "
            f"'{MemoryEnforcement.PER_CGROUP.value}', or drop {names.ISOLATION}: none",
        )


_MPS_LEVELS: Final = frozenset({MemoryEnforcement.CLIENT_ENV.value, MemoryEnforcement.DAEMON_DEFAULT.value})


def _mig_profile_value(r: _Reading) -> Iterable[RequestError]:
    raw = r.asked.ask.mig_profile
    known = catalog.mig_profile_names()
    if raw is not None and raw not in known:
        yield RequestError(
            names.MIG_PROFILE, raw, f"must be a MIG profile gpupack knows ({', '.join(known)})"
        )


def _memory_fits_a_gpu(r: _Reading) -> Iterable[RequestError]:
    key, raw = r.memory_at
    if raw is None or not isinstance(r.memory, units.Memory):
        return  # absent, or already reported by _memory_value
    mib = r.memory.mib
    if r.asked.ask.isolation == Isolation.MIG:
        profile = max(
            (p for m in catalog.models().values() for p in m.mig_profiles), key=lambda p: p.memory_mib
        )
        if mib > profile.memory_mib:
            yield RequestError(
                key,
                raw,
                f"is {mib} MiB, more than any MIG device gpupack knows "
                f"({profile.name} has {profile.memory_mib} MiB)",
            )
        return
    largest, scope = _largest_gpu(r.asked.ask.model)
    if mib > largest.memory_mib:
        yield RequestError(
            key, raw, f"is {mib} MiB, more than any GPU{scope} ({largest.name} has {largest.memory_mib} MiB)"
        )


def _memory_limit(r: _Reading) -> Iterable[RequestError]:
    """The limit is the most the pod may use on each GPU, its request the least it is guaranteed there;
    a fraction's request is its share of the GPU it lands on, so it is judged on the largest GPU it may
    land on (the webhook cannot know which)."""
    ask, limit = r.asked.ask, r.limit
    if isinstance(limit, RequestError):
        yield limit
        return
    if limit is None:
        return
    (key, raw), mib = r.limit_at, limit.mib
    if ask.mig_profile is not None or ask.isolation == Isolation.MIG:
        yield RequestError(
            key, raw, "must not be set with MIG: a MIG device's memory is fixed and cannot be borrowed above"
        )
        return
    largest, scope = _largest_gpu(ask.model)
    if mib > largest.memory_mib:
        rule = f"is {mib} MiB, more than any GPU{scope} ({largest.name} has {largest.memory_mib} MiB)"
        yield RequestError(key, raw, rule)
    if isinstance(r.memory, units.Memory) and mib < r.memory.mib:
        rule = f"is {mib} MiB, less than {r.memory_at[0]} ({r.memory.mib} MiB): the limit must be at least "
        rule += "the request"
        yield RequestError(key, raw, rule)
    elif isinstance(r.milli, int) and mib < (share := r.milli * largest.memory_mib // MILLI_PER_GPU):
        yield RequestError(
            key,
            raw,
            f"is {mib} MiB, less than {names.GPU_FRACTION}={ask.fraction} of {largest.name} ({share} MiB), "
            f"the largest GPU{scope}: the limit must be at least the request on every GPU the pod may "
            f"land on (raise it, or narrow the GPUs with {names.GPU_MODEL})",
        )


def _nv_fractions(r: _Reading) -> Iterable[RequestError]:
    """KAI's NvFractions names: one container, which the pod has; not beside gpupack's own request names
    (both would say how much, and a silent winner would ignore what the user wrote); sm-sharing needs MPS."""
    nv, ask = r.nv, r.asked.ask
    yield from nv.errors
    every = tuple(c.name for c in r.asked.containers)
    key, value = next(((k, v) for k, v in ask.nv_fractions if k != names.KAI_POD_COMPUTE_MODE), ("", ""))
    if nv.container is not None and nv.container not in every:
        rule = (
            f"names container {nv.container!r}, which the pod does not have ({', '.join(map(repr, every))})"
        )
        yield RequestError(key, value, rule)
    if nv.container is not None and ask.container is not None and ask.container != nv.container:
        rule = f"must name the container {key} names ({nv.container!r}), or be left out"
        yield RequestError(names.GPU_FRACTION_CONTAINER_NAME, ask.container, rule)
    if nv.memory is not None:
        for other, raw in (
            (names.GPU_FRACTION, ask.fraction),
            (names.GPU_MEMORY, ask.memory),
            (names.GPU_MEMORY_LIMIT, ask.memory_limit),
            (names.MIG_PROFILE, ask.mig_profile),
        ):
            if raw is not None:
                rule = (
                    f"must not be set together with {other}: both ask for the GPU share; use one of the two"
                )
                yield RequestError(nv.memory[0], nv.memory[1], rule)
    if _sm_sharing(nv) and ask.isolation not in (None, Isolation.MPS):
        assert nv.mode is not None
        rule = f"needs MPS (SMs shared at once by MPS clients), but {names.ISOLATION} is {ask.isolation!r}"
        yield RequestError(nv.mode[0], nv.mode[1], rule)


def _kai_limits(r: _Reading) -> Iterable[RequestError]:
    """KAI 0.18's limits, as KAI reads them: gpu-fraction.limit and the per-container portion limit only
    beside gpu-fraction, on the GPU container, agreeing when both are written; gpu-memory.limit only beside
    gpu-memory; none beside gpupack's own limit name (both would set the limit, one silently ignored)."""
    ask = r.asked.ask
    shares: tuple[tuple[str, str], ...] = ask.portion_limits
    if ask.fraction_limit is not None:
        shares = ((names.KAI_FRACTION_LIMIT, ask.fraction_limit), *shares)
    if ask.fraction is None:
        for key, raw in shares:
            rule = (
                f"limits the share of GPU memory a {names.GPU_FRACTION} pod may use, and the pod sets no "
                f"{names.GPU_FRACTION}: add {names.GPU_FRACTION}, or for a {names.GPU_MEMORY} pod write "
                f"{names.KAI_GPU_MEMORY_LIMIT}"
            )
            yield RequestError(key, raw, rule)
    if ask.kai_memory_limit is not None and ask.memory is None:
        rule = (
            f"limits the memory of a {names.GPU_MEMORY} pod, and the pod sets no {names.GPU_MEMORY}: add "
            f"{names.GPU_MEMORY}, or for a {names.GPU_FRACTION} pod write {names.KAI_FRACTION_LIMIT}"
        )
        yield RequestError(names.KAI_GPU_MEMORY_LIMIT, ask.kai_memory_limit, rule)
    if ask.memory_limit is not None:
        limit = ask.kai_memory_limit
        memory = ((names.KAI_GPU_MEMORY_LIMIT, limit),) if limit is not None else ()
        for key, raw in (*shares, *memory):
            rule = f"must not be set together with {names.GPU_MEMORY_LIMIT}: both set the limit; use one"
            yield RequestError(key, raw, rule)
    for key, raw in ask.portion_limits:
        container, target = portion_key(key), r.asked.gpu_container
        if target is not None and container != target:
            rule = (
                f"names container {container!r}, but the GPU share goes to {target!r} "
                f"({names.GPU_FRACTION_CONTAINER_NAME}, else the first container)"
            )
            yield RequestError(key, raw, rule)
        if ask.fraction_limit is not None and _share_value(raw) != _share_value(ask.fraction_limit):
            other = f"{names.KAI_FRACTION_LIMIT}={ask.fraction_limit!r}"
            yield RequestError(key, raw, f"disagrees with {other} (KAI's two spellings of it): set one")


def _share_value(raw: str) -> Fraction | str:
    """A share limit's value, to compare two spellings ("0.8" is "0.80"); the raw text when it is invalid."""
    try:
        return units.memory_share(raw)
    except units.UnitError:
        return raw


def _memory_share_limit(r: _Reading) -> Iterable[RequestError]:
    """A share limit is the most of each GPU's memory the pod may use; gpu-fraction is the least it gets."""
    (key, raw), share = r.share_at, r.share
    if isinstance(share, RequestError):
        yield share
    elif share is not None and isinstance(r.milli, int) and share * MILLI_PER_GPU < r.milli:
        fraction = r.asked.ask.fraction
        rule = f"is less than {names.GPU_FRACTION}={fraction}: the limit must be at least the request"
        yield RequestError(key, raw or "", rule)


RULES: Final[tuple[Callable[[_Reading], Iterable[RequestError]], ...]] = (
    _one_of_fraction_or_memory,
    _nv_fractions,
    _kai_limits,
    _no_whole_gpus,
    _fraction_value,
    _memory_value,
    _num_devices,
    _container_name,
    _gpu_models,
    _isolation,
    _memory_enforcement,
    _mig_profile_value,
    _memory_fits_a_gpu,
    _memory_limit,
    _memory_share_limit,
    _gpupack_resources_only_on_the_gpu_container,
)


# --- helpers ---


def _canonical_model(name: str) -> str | None:
    """The catalogue name for a known model or NVML alias; else the name itself if it is a label value."""
    try:
        return catalog.lookup(name).name
    except KeyError:
        return name if _LABEL_VALUE.fullmatch(name) else None


def gpu_models(raw: str | None) -> tuple[str, ...]:
    """The acceptable models a |-separated list names, canonical, in the user's order, repeats dropped."""
    return () if raw is None else _read_models(raw).models


@dataclass(frozen=True, slots=True)
class _Models:
    """A gpupack.io/gpu-model value, read once."""

    models: tuple[str, ...]  # canonical, in the user's order, repeats dropped
    errors: tuple[RequestError, ...]  # the rule it breaks
    warnings: tuple[str, ...]  # for a valid value: a name read as another, or one a typo of a known model


@lru_cache(maxsize=256)
def _read_models(raw: str) -> _Models:
    # Pods repeat a few values ("A100-40GB", "V100M16|V100M32"), and the catalogue is fixed: each value is
    # checked against it once (a bounded cache: the value is the user's).
    out: dict[str, None] = {}  # ordered set: keep the user's order, drop repeats
    errors: list[RequestError] = []
    warnings: list[str] = []
    entries = raw.split("|")
    if "" in entries:
        errors.append(
            RequestError(
                names.GPU_MODEL, raw, "must be a |-separated list of GPU model names with no empty entry"
            )
        )
    for model in entries:
        canonical = _canonical_model(model)
        if canonical is not None:
            out[canonical] = None
        if not model:
            continue
        if canonical is None:
            errors.append(
                RequestError(
                    names.GPU_MODEL,
                    raw,
                    f"model {model!r} must be a known GPU model or a node label value "
                    "(at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or "
                    "digit)",
                )
            )
        elif canonical != model:
            warnings.append(f"{names.GPU_MODEL}: {model!r} is read as {canonical!r}")
        elif model not in catalog.models() and (close := _close_models(model)):
            meant = " or ".join(map(repr, close))
            warnings.append(
                f"{names.GPU_MODEL}: {model!r} is no GPU model gpupack knows, so only nodes labelled "
                f"{names.NODE_LABEL_GPU_MODEL}={model} match it; did you mean {meant}?"
            )
    return _Models(tuple(out), tuple(errors), tuple(warnings))


def _largest_gpu(raw_models: str | None) -> tuple[catalog.GpuModel, str]:
    """The largest GPU a request may land on: among the listed models when all are known, else any."""
    table = catalog.models()
    listed = gpu_models(raw_models)
    if listed and all(m in table for m in listed):
        return max((table[m] for m in listed), key=lambda g: g.memory_mib), f" allowed by {names.GPU_MODEL}"
    return max(table.values(), key=lambda g: g.memory_mib), " gpupack knows"


def _close_models(name: str) -> list[str]:
    """The catalogue models whose name (or an NVML alias of it) is within a few edits of `name`, closest
    first (case ignored): a likely typo of a known model."""
    spellings = {m.name.lower(): m.name for m in catalog.models().values()}
    spellings |= {a.lower(): m.name for m in catalog.models().values() for a in m.aliases}
    close = difflib.get_close_matches(name.lower(), spellings, n=4, cutoff=_MODEL_CUTOFF)
    return list(dict.fromkeys(spellings[c] for c in close))[:2]


_MODEL_CUTOFF: Final = 0.85  # difflib's similarity: 'A100-40G' and 'A100-40GB' score 0.94, 'A10' 0.55


def _sm_sharing(nv: nvfractions.NvAsk) -> bool:
    return nv.mode is not None and nv.mode[1] == nvfractions.ComputeMode.SM_SHARING


def _isolation_written(isolation: str | None, nv: nvfractions.NvAsk) -> str:
    """The annotation, as key=value, that made the pod's isolation explicit ("" where none did)."""
    if isolation is not None:
        return f"{names.ISOLATION}={isolation}"
    if nv.mode is not None and _sm_sharing(nv):
        return f"{nv.mode[0]}={nv.mode[1]}"
    return ""


def _first_container_warning(pod: Asked) -> str | None:
    """With several containers and none named, the GPU goes to the first: say which, so a sidecar listed
    first (a log shipper) is not silently the one that gets it."""
    regular = pod.regular
    if pod.ask.container or pod.ask.nv_container or len(regular) < 2:
        return None
    others = ", ".join(repr(c.name) for c in regular[1:])
    key = names.GPU_FRACTION_CONTAINER_NAME
    return (
        f"{key} is not set: the GPU goes to the first container, {regular[0].name!r}, none to {others} "
        f"(set {key} to the container that should have it)"
    )


def _build(r: _Reading) -> GpuRequest:
    """The request, from a pod that passed every rule (so every parsed value is a value)."""
    ask = r.asked.ask
    assert not isinstance(r.milli, RequestError) and not isinstance(r.memory, RequestError)
    assert not isinstance(r.count, RequestError) and r.asked.gpu_container is not None
    assert not isinstance(r.limit, RequestError) and not isinstance(r.share, RequestError)
    warnings: list[str] = []
    for (key, raw), memory in ((r.memory_at, r.memory), (r.limit_at, r.limit)):
        if memory is not None and memory.rounded_from is not None:
            warnings.append(f"{key}={raw!r} is {memory.rounded_from} MiB; rounded up to {memory.mib} MiB")
    models = _read_models(ask.model) if ask.model is not None else None
    if models is not None:
        warnings += models.warnings
    if warning := _first_container_warning(r.asked):
        warnings.append(warning)
    return GpuRequest(
        container=r.asked.gpu_container,
        count=r.count if r.count is not None else 1,
        milli=r.milli,
        memory_mib=None if r.memory is None else r.memory.mib,
        mig_profile=ask.mig_profile or "",
        models=models.models if models is not None else (),
        memory_limit_mib=None if r.limit is None else r.limit.mib,
        memory_limit_share=r.share,
        isolation=Isolation.MIG if ask.mig_profile else Isolation(ask.isolation or Isolation.MPS),
        # KAI's sm-sharing runs SMs at once through MPS, so it requires MPS like an explicit isolation: mps;
        # time-slicing asks for nothing more than gpupack's default.
        isolation_explicit=ask.isolation is not None or _sm_sharing(r.nv),
        isolation_written=_isolation_written(ask.isolation, r.nv),
        memory_enforcement=MemoryEnforcement(ask.memory_enforcement or MemoryEnforcement.NONE),
        warnings=tuple(warnings),
    )
