"""What one extender process runs besides HTTP: cache, informers, lease, binder, and readiness."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from app import log, names
from app.kube import paths
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.kube.informers import Informer, InformerConfig, KubeApi
from app.kube.lease import LeaderElector, LeaseConfig
from app.placement import Policy, registry
from app.placement.memo import MemoPolicy
from extender import stats
from extender.binder import Binder
from extender.config import Settings
from extender.metrics import ExtenderGauges, PendingReason

LOG = log.get("gpupack.extender")


class Runtime(Protocol):
    """What the routes need from the process; tests provide an in-memory one."""

    cache: ClusterCache
    policy: Policy
    binder: Binder
    decide_in_filter: bool

    def ready(self) -> tuple[bool, str]: ...

    def alive(self) -> tuple[bool, str]: ...

    def is_leader(self) -> bool: ...


def gauges_of(rt: Runtime) -> ExtenderGauges:
    """The scrape-time collector's source."""
    cache = rt.cache
    pending = [
        PendingReason(cache.pending_reason.get(p.uid, PendingReason.WAITING))
        for p in cache.pods()
        if p.pending
    ]
    return stats.gauges(cache.snapshot(), cache.allocations(), pending, rt.is_leader())


class StaticRuntime:
    """Always ready and leading: in-memory state for tests and benchmarks."""

    def __init__(
        self, cache: ClusterCache, policy: Policy, binder: Binder, decide_in_filter: bool = True
    ) -> None:
        self.cache = cache
        self.policy = policy
        self.binder = binder
        self.decide_in_filter = decide_in_filter

    def ready(self) -> tuple[bool, str]:
        return True, "ready"

    def alive(self) -> tuple[bool, str]:
        return True, "alive"

    def is_leader(self) -> bool:
        return True


class KubeRuntime:
    """Informers on GPUNodes, pods and Nodes, a leader elector, and readiness that waits for them.

    Ready: leading, and every informer's view is live. Alive: every worker thread runs and makes
    progress; if not, /healthz fails and Kubernetes restarts the replica.
    """

    def __init__(
        self, kube: KubeApi, settings: Settings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.decide_in_filter = settings.decide_in_filter
        self._clock = clock
        self.cache = ClusterCache(AssumeCache(settings.assume_ttl_s), settings.heartbeat_timeout_s)
        self.policy: Policy = MemoPolicy(registry.create(settings.policy))
        cfg = InformerConfig(
            resync_s=settings.resync_s,
            watch_timeout_s=settings.watch_timeout_s,
            live_within_s=settings.live_within_s,
            stuck_after_s=max(300.0, 3 * settings.live_within_s),
        )
        self.informers = (
            Informer(
                kube,
                paths.gpunodes(),
                self.cache.gpunode_handler,
                name=names.GPUNODE_PLURAL,
                config=cfg,
                clock=clock,
            ),
            # Every pod, not only managed ones: node CPU and memory free count all pods' requests, and a
            # share must stay counted even if someone strips the managed label.
            Informer(kube, paths.pods(), self.cache.pod_handler, name="pods", config=cfg, clock=clock),
            Informer(kube, paths.nodes(), self.cache.node_handler, name="nodes", config=cfg, clock=clock),
        )
        self._leader_since: float | None = None
        self.elector = LeaderElector(
            kube,
            LeaseConfig(
                namespace=settings.lease_namespace,
                name=settings.lease_name,
                identity=settings.identity,
                lease_duration_s=settings.lease_duration_s,
                renew_deadline_s=settings.renew_deadline_s,
                retry_period_s=settings.retry_period_s,
            ),
            on_started=self._on_started,
            on_stopped=self._on_stopped,
            clock=clock,
        )
        self.binder = Binder(kube, self.cache, self.policy, can_write=self.elector.can_write)
        self._threads: list[threading.Thread] = []

    def _on_started(self) -> None:
        # A standby has watched all along, and the old leader stopped serving a renew deadline before
        # the lease could expire, so its last writes are already here; the relist (at the next watch
        # turnover) is a cheap extra check, not a gate.
        self._leader_since = self._clock()
        for inf in self.informers:
            inf.request_relist()

    def _on_stopped(self) -> None:
        self._leader_since = None

    def is_leader(self) -> bool:
        return self.elector.is_leader

    def ready(self) -> tuple[bool, str]:
        """Leading and every view live; otherwise every reason why not, "; "-joined."""
        problems = []
        if not self.elector.is_leader or self._leader_since is None:
            problems.append("not the leader")
        for inf in self.informers:
            live, why = inf.live()
            if not live:
                problems.append(why)
        return (False, "; ".join(problems)) if problems else (True, "ready")

    def alive(self) -> tuple[bool, str]:
        for worker in (*self.informers, self.elector):
            ok, why = worker.alive()
            if not ok:
                return False, why
        return True, "alive"

    def start(self) -> None:
        self._threads = [inf.start() for inf in self.informers]
        self._threads.append(self.elector.start())

    def stop(self) -> None:
        self.elector.stop()
        self.elector.release()
        for inf in self.informers:
            inf.stop()
