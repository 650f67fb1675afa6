"""The leader's scale-up loop: size pending pods' GPUs with the placement engine, put it to the autoscaler.

It runs in the extender, not in a component of its own, because the extender already holds everything
the plan needs (the cluster view built from GPUNodes and pod annotations, the policy, the pending pods) and
the lease that makes exactly one replica act: a separate component would rebuild the same view and elect
its own leader. Only the leader writes, each write fenced like a bind (`can_write`); a new leader starts
from the placeholders it lists, so nothing depends on memory but how long each pod has been pending.
The decisions are `app.core.autoscale` (pure); this module reads the inputs and sends the calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.core import log
from app.core.autoscale import placeholders
from app.core.autoscale.plan import Coming, PendingPod, Pool, ScalePlan, plan
from app.core.errors import KubeError
from app.core.model import Demand
from app.core.placement import Policy
from app.kube import calls, paths
from app.kube.cache import ClusterCache
from app.kube.calls import Request
from app.kube.informers import KubeApi

LOG = log.get("gpupack.extender.autoscaler")
PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    pools: tuple[Pool, ...]
    namespace: str
    resource: str = placeholders.DEFAULT_RESOURCE
    interval_s: float = 5.0
    grace_s: float = 5.0


@dataclass(frozen=True, slots=True)
class TickResult:
    plan: ScalePlan
    created: int
    deleted: tuple[str, ...]


class Autoscaler:
    """One reconcile per `tick`; `start` runs ticks on a thread while the replica leads."""

    def __init__(
        self,
        kube: KubeApi,
        cache: ClusterCache,
        policy: Policy,
        config: AutoscaleConfig,
        *,
        can_write: Callable[[], bool],
        views_live: Callable[[], tuple[bool, str]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.policy = policy
        self.config = config
        self.can_write = can_write
        # Whether the cluster view is current (every informer live): a plan from a stale view would ask
        # for nodes for pods already bound, or withdraw what pods still wait for.
        self.views_live = views_live
        self._paused = ""  # why the last tick did not plan (logged once per reason)
        self._clock = clock
        self._first_pending: dict[str, float] = {}  # pod uid -> when this replica first saw it pending
        self._priority_class_ok = False
        self._reported: set[str] = set()  # unplaceable pods already logged
        self._stop = threading.Event()
        self.last_tick_at: float | None = None

    def pending(self, now: float) -> list[PendingPod]:
        """Unallocated pending pods with a valid GPU demand, pending for the grace period, oldest first.

        A pod with a hold is being bound: its GPUs already count on its node (`ClusterCache.nodes`), so
        planning it again would ask a node for a pod that has one."""
        held = self.cache.assume.items()
        seen: dict[str, float] = {}
        out: list[tuple[float, PendingPod]] = []
        for p in self.cache.pods():
            if not p.pending or p.allocation is not None or p.uid in held or not isinstance(p.demand, Demand):
                continue
            since = self._first_pending.get(p.uid, now)
            seen[p.uid] = since
            if now - since >= self.config.grace_s:
                out.append((since, PendingPod(p.key, p.demand)))
        self._first_pending = seen
        return [pod for _, pod in sorted(out, key=lambda t: (t[0], t[1].key))]

    def tick(self) -> TickResult | None:
        """Plan and reconcile once; None when this replica may not write now or its view is not live."""
        if not self.can_write():
            self._first_pending.clear()  # a standby's clock of who waits how long would be stale
            return None
        live, why = self.views_live()
        if not live:
            # Placeholders stay as they are until the view is back; so does the pending clock (a pod seen
            # pending before the outage has waited at least that long).
            if why != self._paused:
                LOG.warning("autoscale paused: the cluster view is not live", extra={"why": why})
            self._paused = why
            return None
        if self._paused:
            LOG.info("autoscale resumed: the cluster view is live again")
            self._paused = ""
        now = self._clock()
        self.last_tick_at = now
        # Nodes before pods: a bind that starts between the two reads is then missing from both (planned
        # next round) rather than counted twice (a node asked for it).
        nodes = [n for n in self.cache.nodes().values() if n is not None]
        # A node counts as arrived once its agent has reported its GPUs: a GPUNode created but not yet
        # reported on takes no pod, so a placeholder bound there still stands for capacity on its way.
        arriving = self.cache.unreported()
        published = {n.name for n in nodes if n.name not in arriving}
        listed = self.kube.send(
            calls.list_request(paths.pods(self.config.namespace), f"{placeholders.LABEL_PLACEHOLDER}=true")
        )
        have = [p for p in map(placeholders.read, listed.get("items") or []) if p is not None]
        pools = {pool.model: pool for pool in self.config.pools}
        # Nodes already asked for count before new ones (two placeholders bound to one node: one node).
        coming = {
            p.coming: Coming(p.coming, pools[p.model])
            for p in have
            if p.node not in published and p.model in pools
        }
        wanted = plan(nodes, self.pending(now), self.config.pools, self.policy, tuple(coming.values()))
        changes = placeholders.reconcile(have, wanted.requests, published, frozenset(wanted.awaited))
        deleted = []
        for name in changes.delete:
            if self._send(Request("DELETE", paths.pod(self.config.namespace, name)), (404,)):
                deleted.append(name)
        if changes.create:
            self._ensure_priority_class()
        created = sum(
            self._send(calls.create(placeholders.body(r, self.config.namespace, self.config.resource)))
            for r in changes.create
        )
        if changes.create or changes.delete:
            LOG.info(
                "autoscale placeholders reconciled",
                extra={
                    "gpus_wanted": wanted.gpus,
                    "requests": [f"{r.pool.model}x{r.gpus}" for r in wanted.requests],
                    "placeholders_created": created,
                    "placeholders_deleted": len(deleted),
                    "fit_now": len(wanted.fit_now),
                },
            )
        for u in wanted.unplaceable:
            if u.key not in self._reported:  # once per pod, not every round
                LOG.warning("pending pod fits no autoscaler pool", extra={"pod": u.key, "why": u.why})
        self._reported = {u.key for u in wanted.unplaceable}
        return TickResult(wanted, created, tuple(deleted))

    def _ensure_priority_class(self) -> None:
        if not self._priority_class_ok:
            self._priority_class_ok = self._send(
                Request("POST", PRIORITY_CLASSES, placeholders.priority_class()), (409,)
            )

    def _send(self, req: Request, fine: Sequence[int] = ()) -> bool:
        """Send one write if still leading; False (logged) when it failed or the lease is gone."""
        if not self.can_write():
            return False
        try:
            self.kube.send(req)
        except KubeError as exc:
            if exc.code in fine:
                return True
            LOG.warning(
                "autoscale write failed", extra={"method": req.method, "path": req.path, "error": str(exc)}
            )
            return False
        return True

    def run(self) -> None:
        while not self._stop.wait(self.config.interval_s):
            try:
                self.tick()
            except Exception as exc:  # never let the loop die: the next tick starts from the API again
                LOG.warning("autoscale tick failed", extra={"error": f"{type(exc).__name__}: {exc}"})

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="autoscaler", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
