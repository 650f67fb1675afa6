"""Host CPU and memory: what a pod requests and what a node offers, as kube-scheduler counts them (pure).

Placement scores with each node's free CPU and memory (the simulator tracks them from the trace); in a
cluster the extender derives them from Node allocatable minus the requests of every pod bound there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from app import units
from app.objects import as_list, as_object

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class HostResources:
    """CPU in milli-cores and memory in MiB."""

    cpu_milli: int = 0
    memory_mib: int = 0

    def __add__(self, other: HostResources) -> HostResources:
        return HostResources(self.cpu_milli + other.cpu_milli, self.memory_mib + other.memory_mib)

    def __sub__(self, other: HostResources) -> HostResources:
        return HostResources(self.cpu_milli - other.cpu_milli, self.memory_mib - other.memory_mib)


ZERO = HostResources()


def _value(raw: Any) -> Fraction:
    """A quantity's value; anything that is not a non-negative quantity counts as 0 (the apiserver
    validated the pod already, so this only guards against hand-made test objects)."""
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        return Fraction(0)
    return _quantity(str(raw))


@lru_cache(maxsize=4096)
def _quantity(raw: str) -> Fraction:
    """Pods repeat a few request strings ("500m", "8Gi"): each is parsed once (a relist reads every pod)."""
    value = units.quantity_value(raw)
    return value if value is not None and value > 0 else Fraction(0)


def _requests(container: Any) -> HostResources:
    """One container's CPU (milli) and memory (MiB) requests, rounded up."""
    res = as_object(as_object(container).get("resources"))
    requests, limits = as_object(res.get("requests")), as_object(res.get("limits"))

    def value(name: str) -> Fraction:
        # A limit without a request defaults the request to the limit (the apiserver does it too).
        return _value(requests.get(name, limits.get(name)))

    return HostResources(math.ceil(value("cpu") * 1000), math.ceil(value("memory") / MIB))


def _max(a: HostResources, b: HostResources) -> HostResources:
    return HostResources(max(a.cpu_milli, b.cpu_milli), max(a.memory_mib, b.memory_mib))


def pod_requests(spec: Any) -> HostResources:
    """A pod's effective request, as kube-scheduler's NodeResourcesFit computes it.

    max(regular containers + restartable (sidecar) init containers, each plain init container plus the
    sidecars started before it) + pod overhead. CPU rounds up to a milli-core, memory up to a MiB.
    """
    spec = as_object(spec)
    running = sum((_requests(c) for c in as_list(spec.get("containers"))), ZERO)
    sidecars = ZERO
    init_peak = ZERO
    for c in as_list(spec.get("initContainers")):
        req = _requests(c)
        if as_object(c).get("restartPolicy") == "Always":
            sidecars = sidecars + req
            init_peak = _max(init_peak, sidecars)
        else:
            init_peak = _max(init_peak, sidecars + req)
    return _max(running + sidecars, init_peak) + _requests({"resources": {"requests": spec.get("overhead")}})


def node_allocatable(node: Mapping[str, Any]) -> HostResources | None:
    """A Node's allocatable CPU (milli, rounded down) and memory (MiB, rounded down); None if not reported."""
    alloc = as_object(as_object(node.get("status")).get("allocatable"))
    if "cpu" not in alloc:
        return None
    return HostResources(
        math.floor(_value(alloc.get("cpu")) * 1000), math.floor(_value(alloc.get("memory")) / MIB)
    )
