"""An extender runtime without Kubernetes, for tests and benchmarks: always ready and leading, in memory."""

from __future__ import annotations

from app.core.placement import Policy
from app.core.placement.workload import TargetWorkload
from app.kube.cache import ClusterCache
from app.kube.quotas import QuotaStore
from extender.binder import Binder
from extender.rankings import Rankings
from extender.runtime import refresh_workload
from extender.stats import PendingReasons
from extender.workloads import WorkloadClock


class StaticRuntime:
    """`extender.runtime.Runtime` over a cache the caller fills: always ready and leading."""

    def __init__(
        self, cache: ClusterCache, policy: Policy, binder: Binder, decide_in_filter: bool = True
    ) -> None:
        self.cache = cache
        self.pending = PendingReasons()
        self.quotas = QuotaStore()
        self.policy = policy
        self.rankings = Rankings(cache, policy)
        self.binder = binder
        self.decide_in_filter = decide_in_filter

    def refresh_workload(self, clock: WorkloadClock, now: float = 0.0) -> TargetWorkload | None:
        """What KubeRuntime does on its own cadence, when a test or bench asks (see `refresh_workload`)."""
        return refresh_workload(self, clock, now)

    def ready(self) -> tuple[bool, str]:
        return True, "ready"

    def alive(self) -> tuple[bool, str]:
        return True, "alive"

    def is_leader(self) -> bool:
        return True
