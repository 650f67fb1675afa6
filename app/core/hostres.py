"""Host CPU and memory: the amounts and what a node offers, as kube-scheduler counts them (pure).

What a pod requests is read with the rest of the pod (app.core.podview).

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

from app.core import units
from app.core.objects import as_object

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

    def max(self, other: HostResources) -> HostResources:
        """The larger of each."""
        return HostResources(max(self.cpu_milli, other.cpu_milli), max(self.memory_mib, other.memory_mib))


ZERO = HostResources()


def quantity(raw: Any) -> Fraction:
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


def node_allocatable(node: Mapping[str, Any]) -> HostResources | None:
    """A Node's allocatable CPU (milli, rounded down) and memory (MiB, rounded down); None if not reported."""
    alloc = as_object(as_object(node.get("status")).get("allocatable"))
    if "cpu" not in alloc:
        return None
    return HostResources(
        math.floor(quantity(alloc.get("cpu")) * 1000), math.floor(quantity(alloc.get("memory")) / MIB)
    )
