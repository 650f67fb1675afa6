"""Which target workload the extender's policy judges against, and when it is worth a new policy.

The simulator judges against the trace's own pods on the trace's fleet; the extender does the same with
what its cache holds: every gpupack pod not finished (bound and pending, `gpu-model` pins and host CPU
included) on the GPUNodes' fleet. A new workload means a new policy and new rankings (a first call per
shape), so it is looked at only on a slow cadence, or at once when the fleet's GPUs per model change.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from app.core.model import Demand, Node
from app.core.placement import TargetWorkload, default_workload
from app.core.placement.workload import learned
from app.core.pods import TERMINAL_PHASES
from app.kube.cache import ClusterCache

LEARNED = "learned"
BUILTIN = "builtin"
SOURCES = (LEARNED, BUILTIN)
LEARN_EVERY_S = 300.0  # how often the pods are read again; the fleet is compared on every check
CHECK_EVERY_S = 5.0  # the runtime's check period: a fleet change is seen within this

Fleet = tuple[tuple[str, int], ...]


def fleet_of(nodes: list[Node]) -> Fleet:
    """GPUs per model (MIG-partitioned GPUs left out), sorted: what `TargetWorkload.on_fleet` records."""
    return tuple(sorted(Counter(g.model for n in nodes for g in n.gpus if not g.mig_profile).items()))


def live_demands(cache: ClusterCache) -> list[Demand]:
    """What every gpupack pod in the cache asks for, bound or pending; finished, deleting and unreadable
    pods left out."""
    return [
        p.demand
        for p in cache.pods()
        if isinstance(p.demand, Demand) and p.phase not in TERMINAL_PHASES and not p.deleting
    ]


def target(cache: ClusterCache, source: str) -> TargetWorkload:
    """The workload for the cache's state: learned from its pods (built-in while too few), on its fleet."""
    base = learned(live_demands(cache)) if source == LEARNED else None
    return (base if base is not None else default_workload()).on_fleet(cache.inventory())


@dataclass
class WorkloadClock:
    """When to look again: at once on a fleet change, else every `learn_every_s`."""

    source: str
    learn_every_s: float = LEARN_EVERY_S
    fleet: Fleet | None = None  # as of the last look; None: never looked
    learned_at: float = 0.0

    def due(self, cache: ClusterCache, now: float) -> bool:
        if self.fleet is None or fleet_of(cache.inventory()) != self.fleet:
            return True
        return self.source == LEARNED and now - self.learned_at >= self.learn_every_s

    def look(self, cache: ClusterCache, now: float, current: TargetWorkload) -> TargetWorkload | None:
        """The workload to switch to, or None when the current one (same shapes, same fleet) stays."""
        wanted = target(cache, self.source)
        self.fleet, self.learned_at = wanted.fleet, now
        same = wanted.shapes == current.shapes and wanted.fleet == current.fleet
        return None if same else wanted


def workload_of(policy: object) -> TargetWorkload | None:
    """The policy's target workload, if it has one (FragAware does; binpack and spread do not)."""
    wl = getattr(policy, "workload", None)
    return wl if isinstance(wl, TargetWorkload) else None
