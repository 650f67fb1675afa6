"""What one extender process runs besides HTTP: cache, informers, lease, binder, and readiness."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Protocol

from app.core import log, names
from app.core.autoscale.plan import Pool
from app.core.placement import Policy, registry
from app.core.placement.workload import TargetWorkload
from app.core.pods import SlimPod
from app.kube import paths
from app.kube.assume import AssumeCache
from app.kube.cache import ClusterCache
from app.kube.informers import Informer, InformerConfig, KubeApi
from app.kube.lease import LeaderElector, LeaseConfig
from app.kube.quotas import QuotaStore
from extender import stats
from extender.autoscaler import AutoscaleConfig, Autoscaler
from extender.binder import Binder
from extender.config import Settings
from extender.metrics import ExtenderGauges
from extender.rankings import Rankings
from extender.workloads import CHECK_EVERY_S, WorkloadClock, workload_of

LOG = log.get("gpupack.extender")


class Runtime(Protocol):
    """What the routes need from the process; tests provide an in-memory one."""

    cache: ClusterCache
    pending: stats.PendingReasons  # why each pending pod was last refused
    quotas: QuotaStore
    policy: Policy
    rankings: Rankings  # the policy's verdicts on the cache's nodes, per demand shape
    binder: Binder
    decide_in_filter: bool

    def ready(self) -> tuple[bool, str]: ...

    def alive(self) -> tuple[bool, str]: ...

    def is_leader(self) -> bool: ...


class _Judged(Protocol):
    cache: ClusterCache
    policy: Policy
    rankings: Rankings
    binder: Binder


def refresh_workload(rt: _Judged, clock: WorkloadClock, now: float) -> TargetWorkload | None:
    """Switch `rt` to a policy judging against the workload the cache's state now calls for, when the
    clock says it is time to look and that workload differs; the new workload, else None.

    The new policy gets new rankings, ready before the swap (rows read here, not in a request); a
    request already running finishes on the old pair. Policies without a workload never switch.
    """
    current = workload_of(rt.policy)
    if current is None or not clock.due(rt.cache, now):
        return None
    wanted = clock.look(rt.cache, now, current)
    if wanted is None:
        return None
    policy = registry.create(rt.policy.name, wanted)
    rankings = Rankings(rt.cache, policy)
    rankings.prepare()
    rt.policy, rt.rankings, rt.binder.policy = policy, rankings, policy
    LOG.info(
        "target workload changed",
        extra={"shapes": len(wanted.shapes), "fleet": dict(wanted.fleet), "source": clock.source},
    )
    return wanted


def gauges_of(rt: Runtime) -> ExtenderGauges:
    """The scrape-time collector's source."""
    cache = rt.cache
    pending = rt.pending.of(p.uid for p in cache.pods() if p.pending)
    return stats.gauges(cache.snapshot(), cache.allocations(), pending, rt.is_leader(), rt.quotas.uses())


def informer_config(settings: Settings) -> InformerConfig:
    """The informers' timing from the extender's settings."""
    return InformerConfig(
        resync_s=settings.resync_s,
        watch_timeout_s=settings.watch_timeout_s,
        live_within_s=settings.live_within_s,
        stuck_after_s=max(300.0, 3 * settings.live_within_s),
    )


def informers(
    kube: KubeApi, cache: ClusterCache, cfg: InformerConfig, clock: Callable[[], float] = time.monotonic
) -> tuple[Informer, Informer, Informer]:
    """The informers that feed `cache`: GPUNodes, pods and Nodes."""
    return (
        Informer(
            kube, paths.gpunodes(), cache.gpunode_handler, name=names.GPUNODE_PLURAL, config=cfg, clock=clock
        ),
        # Every pod, not only managed ones: node CPU and memory free count all pods' requests, and a
        # share must stay counted even if someone strips the managed label. Only what gpupack reads of
        # each pod is kept (a fifth of a listed pod), so 50 000 pods list in bounded memory.
        Informer(kube, paths.pods(), cache.pod_handler, name="pods", config=cfg, clock=clock, shape=SlimPod),
        Informer(kube, paths.nodes(), cache.node_handler, name="nodes", config=cfg, clock=clock),
    )


def settle_heap() -> None:
    """Move every object alive now out of the garbage collector's sight (gc.freeze).

    After a sync the heap holds one object graph per pod and node that lives as long as they do; a
    full collection walks all of it (0.4 s at 80 000 pods, measured) and lands inside some request.
    Frozen objects are still freed by reference counting when the cache drops them.
    """
    gc.freeze()


def autoscaler_of(
    kube: KubeApi,
    cache: ClusterCache,
    policy: Policy,
    settings: Settings,
    *,
    can_write: Callable[[], bool],
    views_live: Callable[[], tuple[bool, str]],
) -> Autoscaler | None:
    """The scale-up loop when node pools are configured (`--autoscale-pool`), else None."""
    if not settings.autoscale_pools:
        return None
    config = AutoscaleConfig(
        pools=tuple(Pool.parse(p) for p in settings.autoscale_pools),
        namespace=settings.lease_namespace,
        resource=settings.autoscale_resource,
        interval_s=settings.autoscale_interval_s,
        grace_s=settings.autoscale_grace_s,
    )
    return Autoscaler(kube, cache, policy, config, can_write=can_write, views_live=views_live)


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
        self.pending = stats.PendingReasons()
        self.policy: Policy = registry.create(settings.policy)
        self.rankings = Rankings(self.cache, self.policy)
        cfg = informer_config(settings)
        self.informers = informers(kube, self.cache, cfg, clock)
        # Namespaces' ResourceQuotas, for the quota gauges only: observability, so neither readiness nor
        # liveness waits for it, and an install without RBAC on resourcequotas still schedules.
        self.quotas = QuotaStore()
        self.quota_informer = Informer(
            kube, paths.resource_quotas(), self.quotas.handler, name="resourcequotas", config=cfg, clock=clock
        )
        self._leader_since: float | None = None
        self._settled = False  # the heap was frozen since the last time the replica became ready
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
        self.autoscaler = autoscaler_of(
            kube,
            self.cache,
            self.policy,
            settings,
            can_write=self.elector.can_write,
            views_live=self.views_live,
        )
        self.workload_clock = WorkloadClock(settings.workload)
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

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
        live, why = self.views_live()
        if not live:
            problems.append(why)
        if problems:
            self._settled = False
            return False, "; ".join(problems)
        if not self._settled:
            # Every view is live: the workload is read from the cache's pods and fleet before the first
            # request, so a replica that just took over judges as the old leader did on the same pods.
            if self._refresh_workload() is None:
                self.rankings.prepare()  # views and rows built before the heap is frozen, not in a request
            settle_heap()
            self._settled = True
        return True, "ready"

    def views_live(self) -> tuple[bool, str]:
        """Whether every informer's view is live; otherwise why not, "; "-joined."""
        problems = [why for live, why in (inf.live() for inf in self.informers) if not live]
        return not problems, "; ".join(problems)

    def _refresh_workload(self) -> TargetWorkload | None:
        """`refresh_workload` on this replica; the scale-up planner follows the new policy too."""
        wanted = refresh_workload(self, self.workload_clock, self._clock())
        if wanted is not None and self.autoscaler is not None:
            self.autoscaler.policy = self.policy
        return wanted

    def alive(self) -> tuple[bool, str]:
        for worker in (*self.informers, self.elector):
            ok, why = worker.alive()
            if not ok:
                return False, why
        return True, "alive"

    def _watch_workload(self) -> None:
        # Only once Ready: before, the cache is still filling and ready() makes the first look.
        while not self._stopping.wait(CHECK_EVERY_S):
            if self._settled:
                try:
                    self._refresh_workload()
                except Exception:  # a bad look keeps the current policy; the next tick tries again
                    LOG.exception("target workload refresh failed")

    def start(self) -> None:
        self._threads = [inf.start() for inf in (*self.informers, self.quota_informer)]
        self._threads.append(self.elector.start())
        if self.autoscaler is not None:
            self._threads.append(self.autoscaler.start())
        watcher = threading.Thread(target=self._watch_workload, name="workload", daemon=True)
        watcher.start()
        self._threads.append(watcher)

    def stop(self) -> None:
        self._stopping.set()
        if self.autoscaler is not None:
            self.autoscaler.stop()
        self.elector.stop()
        self.elector.release()
        for inf in (*self.informers, self.quota_informer):
            inf.stop()
