"""The extender's stores, one per informer: Node allocatable, GPUNode inventory and heartbeats, pods.

Each keeps what placement reads of its collection and tells a `Changes` sink (the view builder) which
nodes' views an event touched. None locks: the cluster cache applies every event under its own lock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from app.core import hostres, log, podview
from app.core.hostres import HostResources
from app.core.model import Node
from app.core.pods import TERMINAL_PHASES, PodInfo, info_of, is_gpupack
from app.kube import gpunode
from app.kube.calls import JsonDict

LOG = log.get("gpupack.cache")

# A pod as the pod store keeps it: (uid, how gpupack reads it if it is a gpupack pod, (node, requests)
# if it holds host resources there).
PodReading = tuple[str, PodInfo | None, tuple[str, HostResources] | None]


class Changes(Protocol):
    """Where a store reports what its events changed."""

    def changed(self, name: str) -> None:
        """Node `name`'s view is out of date."""
        ...

    def restart(self) -> None:
        """Every view may have moved (the node order changed): readers start over."""
        ...


def obj_name(obj: JsonDict) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def node_order_key(name: str) -> tuple[Any, ...]:
    """Natural order (gpu-node-2 before gpu-node-10): the tie-break order the extender gives placement."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def changed_where(
    changes: Changes,
    before: Mapping[str, object],
    after: Mapping[str, object],
    norm: Callable[[Any], object] = lambda v: v,
) -> None:
    """A relist replaced `before` with `after` (one input of the views): only nodes whose entry differs
    change, so a relist that finds what the watch already delivered invalidates nothing."""
    for name in before.keys() | after.keys():
        if norm(before.get(name)) != norm(after.get(name)):
            changes.changed(name)


class NodeStore:
    """Each Node's allocatable CPU and memory (the Node informer)."""

    def __init__(self, changes: Changes) -> None:
        self._changes = changes
        self.allocatable: dict[str, HostResources] = {}

    def replace(self, objs: Iterable[JsonDict]) -> None:
        before = dict(self.allocatable)
        self.allocatable.clear()
        for obj in objs:
            self._put(obj)
        changed_where(self._changes, before, self.allocatable)

    def upsert(self, obj: JsonDict) -> None:
        name = obj_name(obj)
        before = self.allocatable.get(name)
        self._put(obj)
        # Node status changes often (conditions, images); only allocatable matters to placement,
        # and an unchanged view keeps the node's memoised answers valid.
        if self.allocatable.get(name) != before:
            self._changes.changed(name)

    def delete(self, obj: JsonDict) -> None:
        name = obj_name(obj)
        self.allocatable.pop(name, None)
        self._changes.changed(name)

    def _put(self, obj: JsonDict) -> None:
        name = obj_name(obj)
        alloc = hostres.node_allocatable(obj)
        if alloc is None:
            self.allocatable.pop(name, None)
        else:
            self.allocatable[name] = alloc


class GpuNodeStore:
    """Each GPUNode as a Node with nothing reserved, its heartbeat, and the natural order of their names
    (the GPUNode informer)."""

    def __init__(self, changes: Changes, heartbeat_timeout_s: float | None) -> None:
        self._changes = changes
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.base: dict[str, Node] = {}  # from GPUNode objects, nothing reserved
        self.heartbeat: dict[str, gpunode.Heartbeat] = {}  # by our --heartbeat-timeout, else the agent's
        self.order: list[str] = []
        self.rank: dict[str, int] = {}  # name -> position in order, so sorting a request is cheap
        self._fresh_until: dict[str, float] = {}  # name -> heartbeat + staleness limit (-inf: none yet)
        # Heartbeats near or past their limit, as of the last pass over _fresh_until (near_stale()), and
        # the earliest limit of the rest: a dead agent's node stays in the list, not in every request's pass.
        self._near_stale: list[str] = []
        self._earliest_stale = -math.inf  # no entry of _fresh_until outside _near_stale is lower

    def replace(self, objs: Iterable[JsonDict]) -> None:
        before, self.base = self.base, {}
        self.heartbeat.clear()
        self._fresh_until.clear()
        for obj in objs:
            self._put(obj)
        changed_where(self._changes, before, self.base)
        self._reorder()

    def upsert(self, obj: JsonDict) -> None:
        before = self.base.get(obj_name(obj))
        name = self._put(obj)
        # Most updates are heartbeats: staleness is judged per request, so an unchanged inventory
        # keeps the node's view (and every answer ranked on it).
        if self.base[name] != before:
            self._changes.changed(name)
        if name not in self.rank:
            self._reorder()

    def delete(self, obj: JsonDict) -> None:
        name = obj_name(obj)
        self.base.pop(name, None)
        self.heartbeat.pop(name, None)
        self._fresh_until.pop(name, None)
        self._changes.changed(name)
        self._reorder()

    def _put(self, obj: JsonDict) -> str:
        node, heartbeat = gpunode_to_node(obj, self.heartbeat_timeout_s)
        self.base[node.name] = node
        self.heartbeat[node.name] = heartbeat
        until = heartbeat.fresh_until
        self._fresh_until[node.name] = until
        self._earliest_stale = min(self._earliest_stale, until)  # a lower bound; near_stale() tightens it
        return node.name

    def _reorder(self) -> None:
        order = sorted(self.base, key=node_order_key)
        if order != self.order:
            # Every rank after an added or removed node moved: readers re-read every view (the views
            # themselves do not depend on the order, so unchanged ones keep their verdicts).
            self._changes.restart()
        self.order = order
        self.rank = {name: i for i, name in enumerate(order)}

    def near_stale(self, soon: float) -> list[str]:
        """Nodes whose heartbeat goes stale by `soon` (or was, at an earlier call: one beaten since is
        judged fresh again, which is harmless); the pass over every heartbeat runs only when one may."""
        if soon >= self._earliest_stale:  # else no other heartbeat is near its limit: skip the pass
            self._near_stale = [name for name, until in self._fresh_until.items() if until <= soon]
            rest = (until for until in self._fresh_until.values() if until > soon)
            self._earliest_stale = min(rest, default=math.inf)
        return self._near_stale

    def judged(self, node: Node, now: float) -> Node:
        """`node` unschedulable, saying why, when its heartbeat is stale at `now`."""
        if not node.schedulable:
            return node
        heartbeat = self.heartbeat.get(node.name) or gpunode.Heartbeat.of(None, self.heartbeat_timeout_s)
        reason = heartbeat.stale_reason(now)
        return replace(node, schedulable=False, unschedulable_reason=reason) if reason else node


def read_pod(obj: JsonDict) -> PodReading:
    """What the pod store keeps of one pod object."""
    view = podview.read(obj)
    info = info_of(view) if is_gpupack(view) else None
    if info is not None and info.allocation_error:
        LOG.warning(
            "corrupt allocation annotations ignored", extra={"pod": info.key, "error": info.allocation_error}
        )
    holds = bool(view.node_name) and view.phase not in TERMINAL_PHASES
    return view.uid, info, (view.node_name, view.host) if holds else None


class PodStore:
    """gpupack pods by uid, the allocations they count summed per node and GPU, and every bound pod's host
    requests summed per node (the pod informer)."""

    def __init__(self, changes: Changes) -> None:
        self._changes = changes
        self.pods: dict[str, PodInfo] = {}  # gpupack pods by uid
        self.bound: dict[str, tuple[str, HostResources]] = {}  # uid -> (node, requests), every bound pod
        self.host_used: dict[str, HostResources] = {}  # node -> sum of its bound pods' requests
        # node -> GPU index -> [allocations, milli, memory MiB] counted on it: a view reserves these sums,
        # 8 entries on an 8-GPU node however many pods share its GPUs.
        self.reserved: dict[str, dict[int, list[int]]] = {}

    def replace(self, read: Iterable[PodReading]) -> None:
        """Every pod anew, from a list; each node whose counted allocations or host use differ changes."""
        reserved, host_used = self.reserved, self.host_used
        self.pods, self.reserved, self.bound, self.host_used = {}, {}, {}, {}
        changes, self._changes = self._changes, _UNHEARD  # one comparison after the list, not one per pod
        try:
            for uid, info, bound in read:
                self._put_bound(uid, bound)
                if info is not None:
                    self._put_pod(info)
        finally:
            self._changes = changes
        # A node's view is built from these sums (NodeViews.view): where they are equal, so is its view.
        changed_where(changes, reserved, self.reserved, lambda d: d or None)
        changed_where(changes, host_used, self.host_used)

    def upsert(self, reading: PodReading) -> None:
        uid, info, bound = reading
        self._drop_bound(uid)
        self._put_bound(uid, bound)
        self._drop_pod(uid)
        if info is not None:
            self._put_pod(info)

    def delete(self, uid: str) -> None:
        self._drop_bound(uid)
        self._drop_pod(uid)

    def _put_bound(self, uid: str, bound: tuple[str, HostResources] | None) -> None:
        if bound is None:
            return
        node, req = bound
        self.bound[uid] = bound
        self.host_used[node] = self.host_used.get(node, hostres.ZERO) + req
        self._changes.changed(node)

    def _drop_bound(self, uid: str) -> None:
        old = self.bound.pop(uid, None)
        if old is None:
            return
        node, req = old
        left = self.host_used.get(node, hostres.ZERO) - req
        if left == hostres.ZERO:
            self.host_used.pop(node, None)
        else:
            self.host_used[node] = left
        self._changes.changed(node)

    def _put_pod(self, info: PodInfo) -> None:
        self.pods[info.uid] = info
        alloc = info.alloc
        if alloc is not None:
            gpus = self.reserved.setdefault(alloc.node, {})
            for i in alloc.gpu_indexes:
                sums = gpus.setdefault(i, [0, 0, 0])
                sums[0] += 1
                sums[1] += alloc.milli
                sums[2] += alloc.memory_mib
            self._changes.changed(alloc.node)

    def _drop_pod(self, uid: str) -> None:
        old = self.pods.pop(uid, None)
        alloc = None if old is None else old.alloc
        if alloc is not None:
            gpus = self.reserved.get(alloc.node, {})
            for i in alloc.gpu_indexes:
                sums = gpus[i]
                sums[0] -= 1
                sums[1] -= alloc.milli
                sums[2] -= alloc.memory_mib
                if not sums[0]:
                    del gpus[i]
            self._changes.changed(alloc.node)


class _Unheard:
    """A sink that drops every change (a relist compares once at its end instead)."""

    def changed(self, name: str) -> None:
        pass

    def restart(self) -> None:
        pass


_UNHEARD = _Unheard()


# --- GPUNode objects (gpupack.io/v1alpha1) ---


def gpunode_to_node(obj: JsonDict, heartbeat_timeout_s: float | None) -> tuple[Node, gpunode.Heartbeat]:
    """A GPUNode as a Node with nothing reserved, and its heartbeat (by `heartbeat_timeout_s` when set,
    else the agent's own limit).

    Staleness is left to the reader, which judges it against the time of each request
    (`GpuNodeStore.judged`). An object that does not fit the CRD's types gives a node without GPUs that
    says which field is wrong.
    """
    try:
        gn = gpunode.read(obj)
    except gpunode.GPUNodeError as exc:
        node = Node(name=obj_name(obj), gpus=(), schedulable=False, unschedulable_reason=str(exc))
        return node, gpunode.Heartbeat.of(None, heartbeat_timeout_s)
    return gn.to_model_node(), gpunode.Heartbeat.of(gn.status, heartbeat_timeout_s)
