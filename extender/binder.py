"""Bind: choose GPUs, hold them, write the allocation (resourceVersion precondition), create the Binding.

The pod comes from the informer's copy (its resourceVersion the allocation patch's precondition; a copy
that is behind meets 409 and the pod is read once and decided again) or, for a pod the informer has not
shown pending and unheld, from the API server.

Fenced twice: one bind per pod in flight (a retried or concurrent bind of the same pod joins the first
and gets its result), and leadership is re-checked right before each write, so a replica that lost its
lease mid-bind stops writing and rolls its own change back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core import log, podview, request
from app.core.errors import KubeError
from app.core.explain import NO_GPUNODE, reason_text
from app.core.model import Allocation, Demand
from app.core.placement import Policy, to_allocation
from app.core.pods import PodInfo
from app.kube import calls
from app.kube.cache import ClusterCache
from app.kube.informers import KubeApi
from extender.metrics import BindOutcome
from extender.verbs import invalid_request

LOG = log.get("gpupack.extender.bind")


@dataclass(frozen=True, slots=True)
class BindResult:
    outcome: BindOutcome
    error: str = ""
    allocation: Allocation | None = None


NOT_LEADER = "stopped before writing: this replica no longer holds the leader lease"


@dataclass(slots=True)
class _Flight:
    """One bind of one pod, in progress; later binds of the same pod wait on `done`."""

    node: str
    done: threading.Event = field(default_factory=threading.Event)
    result: BindResult | None = None


class Binder:
    """Serialises placement decisions; does the API calls outside the lock so binds overlap on the wire."""

    def __init__(
        self,
        kube: KubeApi,
        cache: ClusterCache,
        policy: Policy,
        can_write: Callable[[], bool] = lambda: True,
        join_timeout_s: float = 120.0,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.policy = policy
        self.can_write = can_write  # the lease fence, asked right before every write
        self.join_timeout_s = join_timeout_s
        # Held from reading the node view to recording the hold: the next bind sees this one's share.
        self.lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}
        self._flights_lock = threading.Lock()

    def bind(self, namespace: str, name: str, uid: str, node_name: str) -> BindResult:
        """Bind once per pod at a time: a second call while the first runs joins it."""
        key = uid or f"{namespace}/{name}"
        with self._flights_lock:
            flight = self._flights.get(key)
            first = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight(node_name)
        if not first:
            return self._join(flight, {"pod": f"{namespace}/{name}", "node": node_name})
        result = BindResult(BindOutcome.ERROR, "bind did not finish")
        try:
            result = self._bind(namespace, name, uid, node_name)
        finally:
            flight.result = result
            with self._flights_lock:
                del self._flights[key]
            flight.done.set()
        return result

    def _join(self, flight: _Flight, where: dict[str, str]) -> BindResult:
        """The answer for a bind that arrived while another bind of the same pod was running."""
        node = where["node"]
        LOG.info("bind joins one in flight", extra={**where, "in_flight_node": flight.node})
        if not flight.done.wait(self.join_timeout_s) or flight.result is None:
            return self._fail(
                BindOutcome.ERROR, f"a bind of this pod to {flight.node} is still in flight", where
            )
        first = flight.result
        if flight.node == node:
            return first
        if first.outcome is BindOutcome.BOUND:
            error = f"pod was bound to {flight.node} by a concurrent bind; this bind asked for {node}"
        else:
            error = (
                f"a concurrent bind of this pod to {flight.node} failed ({first.error}); "
                f"this bind asked for {node}"
            )
        return self._fail(BindOutcome.CONFLICT, error, where)

    def _bind(self, namespace: str, name: str, uid: str, node_name: str) -> BindResult:
        where = {"pod": f"{namespace}/{name}", "node": node_name}
        cached = self._cached(namespace, name, uid)
        if cached is not None:
            # The informer's copy saves reading the pod; its resourceVersion is the patch's precondition,
            # so a copy that is behind writes nothing (409), and the pod is read once and decided again.
            result = self._write(
                namespace,
                name,
                cached.uid,
                rv=cached.resource_version,
                demand=cached.demand,
                where=where,
                stale=True,
            )
            if result is not None:
                return result
        try:
            pod = self.kube.send(calls.get_pod(namespace, name))
        except KubeError as exc:
            return self._fail(BindOutcome.ERROR, f"reading pod: {exc}", where)
        view = podview.read(pod)
        if uid and view.uid != uid:
            return self._fail(BindOutcome.CONFLICT, f"pod was re-created (uid {view.uid}, want {uid})", where)
        uid = view.uid or uid
        if view.node_name:
            return self._already_bound(view.annotations, view.node_name, where)
        rv = view.resource_version
        result = self._write(
            namespace, name, uid, rv=rv, demand=request.pod_demand(view), where=where, stale=False
        )
        assert result is not None  # only a write from the informer's copy asks to be read again
        return result

    def _cached(self, namespace: str, name: str, uid: str) -> PodInfo | None:
        """The informer's copy of the pod when a bind may start from it; None: read the pod first.

        Only a pending pod that no hold of ours covers: a hold means an earlier bind of this pod wrote,
        or may have written, its allocation, and only the pod as the API server has it tells which.
        """
        info = self.cache.pod(uid) if uid else None
        if info is None or (info.namespace, info.name) != (namespace, name):
            return None
        if not info.pending or not info.resource_version or self.cache.assume.get(uid) is not None:
            return None
        return info

    def _write(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        rv: str,
        demand: request.PodDemand,
        where: dict[str, str],
        stale: bool,
    ) -> BindResult | None:
        """Decide, then write the allocation (precondition `rv`) and the Binding.

        None when `stale` (rv is the informer's) and the allocation patch met a newer pod: nothing was
        written and nothing is held, so the caller reads the pod and tries once more.
        """
        node_name = where["node"]
        if not self.can_write():
            return self._fail(BindOutcome.ERROR, NOT_LEADER, where)
        decided = self._decide(uid, demand, node_name)
        if isinstance(decided, BindResult):
            return self._fail(decided.outcome, decided.error, where)
        alloc = decided
        if not self.can_write():  # re-checked right before the write: the decision took time
            self.cache.assume.release(uid)
            return self._fail(BindOutcome.ERROR, NOT_LEADER, where)
        try:
            patched = self.kube.send(calls.allocation_patch(namespace, name, rv, alloc))
        except KubeError as exc:
            # Nothing was written: the hold is ours alone to drop.
            self.cache.assume.release(uid)
            if stale and exc.is_conflict:
                LOG.info("informer's copy of the pod is behind: reading it", extra=where)
                return None
            outcome = BindOutcome.CONFLICT if exc.is_conflict else BindOutcome.ERROR
            return self._fail(outcome, f"writing allocation: {exc}", where)
        if not self.can_write():
            # Our own allocation is rolled back (preconditioned on the version our patch produced, so
            # it cannot undo anything the new leader wrote); the Binding is never sent.
            self._undo(namespace, name, uid, patched)
            return self._fail(BindOutcome.ERROR, f"{NOT_LEADER}; allocation rolled back", where)
        patched_rv = str((patched.get("metadata") or {}).get("resourceVersion", ""))
        try:
            # Preconditioned on the version our patch produced: if anyone wrote the pod since (another
            # replica's bind, a new leader), the apiserver refuses and nothing is bound against them.
            self.kube.send(calls.binding(namespace, name, uid, node_name, patched_rv))
        except KubeError as exc:
            self._undo(namespace, name, uid, patched)
            outcome = BindOutcome.CONFLICT if exc.is_conflict else BindOutcome.ERROR
            return self._fail(outcome, f"creating binding: {exc}", where)
        LOG.info(
            "bound",
            extra={
                **where,
                "gpus": list(alloc.gpu_indexes),
                "milli": alloc.milli,
                "memory_mib": alloc.memory_mib,
            },
        )
        return BindResult(BindOutcome.BOUND, allocation=alloc)

    def _already_bound(
        self, annotations: Mapping[str, str], bound_to: str, where: dict[str, str]
    ) -> BindResult:
        """A retried bind that finds its own earlier bind done succeeds; anything else is a conflict."""
        node = where["node"]
        if bound_to != node:
            return self._fail(
                BindOutcome.CONFLICT, f"pod is already bound to {bound_to}; this bind asked for {node}", where
            )
        try:
            alloc = Allocation.from_annotations(annotations)
        except ValueError:
            alloc = None
        if alloc is None or alloc.node != node:
            return self._fail(
                BindOutcome.CONFLICT,
                f"pod is already bound to {bound_to} without a gpupack allocation",
                where,
            )
        LOG.info("already bound by an earlier bind", extra=where)
        return BindResult(BindOutcome.BOUND, allocation=alloc)

    def _decide(self, uid: str, demand: request.PodDemand, node_name: str) -> Allocation | BindResult:
        """Under the lock: the GPUs on `node_name` for this pod, held in the assume cache."""
        if not isinstance(demand, Demand):
            return BindResult(BindOutcome.ERROR, invalid_request(demand))
        with self.lock:
            node = self.cache.node(node_name, exclude_uid=uid)
            if node is None:
                return BindResult(BindOutcome.NO_FIT, NO_GPUNODE)
            reason = self.policy.filter(node, demand)
            if reason is not None:
                return BindResult(BindOutcome.NO_FIT, f"{node_name}: {reason_text(reason)}")
            alloc = to_allocation(node, demand, self.policy.choose_gpus(node, demand))
            self.cache.assume.hold(uid, alloc)
        return alloc

    def _undo(self, namespace: str, name: str, uid: str, patched: dict[str, Any]) -> None:
        """After a failed Binding: remove the allocation, then the hold.

        The removal carries the resourceVersion our patch produced, so if the Binding did go through
        (a lost reply), the pod has changed, the removal fails with 409 and the allocation stays. Only a
        successful removal lets the hold go; otherwise it stays until the watch shows what happened.
        """
        rv = str((patched.get("metadata") or {}).get("resourceVersion", ""))
        try:
            self.kube.send(calls.clear_allocation_patch(namespace, name, rv))
        except KubeError as exc:
            LOG.warning("allocation left in place", extra={"pod": f"{namespace}/{name}", "error": str(exc)})
            return
        self.cache.assume.release(uid)

    @staticmethod
    def _fail(outcome: BindOutcome, error: str, where: dict[str, str]) -> BindResult:
        LOG.warning("bind failed", extra={**where, "outcome": outcome.value, "error": error})
        return BindResult(outcome, error)
