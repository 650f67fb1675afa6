"""The extender's cluster cache: GPUNode inventory + pod-annotation allocations + assume holds -> Nodes.

Host CPU and memory come from Node allocatable minus the requests of every pod bound to the node, so
placement scores with the same inputs as the simulator.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app.core import hostres, log, podview
from app.core.hostres import HostResources
from app.core.model import Allocation, ClusterState, Node
from app.core.pods import TERMINAL_PHASES, PodInfo, info_of, is_gpupack
from app.kube import gpunode
from app.kube.assume import AssumeCache
from app.kube.calls import JsonDict

LOG = log.get("gpupack.cache")

# Changes a reader of frame() may be behind by before it is told to start over (a full re-read is one
# pass over the nodes, so a log longer than a few passes saves nothing).
CHANGE_LOG_LIMIT = 50_000


def obj_name(obj: JsonDict) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def node_order_key(name: str) -> tuple[Any, ...]:
    """Natural order (gpu-node-2 before gpu-node-10): the tie-break order the extender gives placement."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _read_pod(obj: JsonDict) -> tuple[str, PodInfo | None, tuple[str, HostResources] | None]:
    """(uid, how gpupack reads it if it is a gpupack pod, (node, requests) if it holds host resources)."""
    view = podview.read(obj)
    info = info_of(view) if is_gpupack(view) else None
    if info is not None and info.allocation_error:
        LOG.warning(
            "corrupt allocation annotations ignored", extra={"pod": info.key, "error": info.allocation_error}
        )
    holds = bool(view.node_name) and view.phase not in TERMINAL_PHASES
    return view.uid, info, (view.node_name, view.host) if holds else None


def _adjust(node: Node, alloc: Allocation | None, host: HostResources, sign: int) -> Node:
    """`node` with a pod's allocation and host request added (`sign=1`) or taken away (`sign=-1`)."""
    node = node.reserve(() if alloc is None else (alloc,), sign)
    return node.charge_host(sign * host.cpu_milli, sign * host.memory_mib)


# An allocation and a host request, added (+1) or taken away (-1) on top of a node's view.
Delta = tuple[Allocation | None, HostResources, int]

# Heartbeats that go stale within this many seconds of a frame are checked exactly (see frame()).
STALE_CHECK_AHEAD_S = 1.0


@dataclass(frozen=True, slots=True)
class Frame:
    """One request's reading of the cache for a Ranking (see ClusterCache.frame)."""

    token: int  # hand back to the next frame() to get only what changed after this one
    full: bool  # `changed` holds every node: the token was too old, or the node order moved
    changed: dict[str, Node | None]  # views changed since the token (None: the node is gone)
    rank: Mapping[str, int]  # natural-order position of every node with a GPUNode
    # Nodes this request sees other than their view: holds, the pod's own share, a stale heartbeat.
    adjusted: dict[str, Node | None]


@dataclass(frozen=True, slots=True)
class Handler:
    """What an informer feeds: the cache's methods for one collection."""

    replace: Callable[[list[JsonDict]], None]
    upsert: Callable[[JsonDict], None]
    delete: Callable[[JsonDict], None]
    listing: Callable[[], None] = lambda: None


class ClusterCache:
    """Thread-safe cluster view fed by the GPUNode and pod informers, read by the scheduling verbs."""

    def __init__(
        self,
        assume: AssumeCache | None = None,
        heartbeat_timeout_s: float | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.assume = assume if assume is not None else AssumeCache()
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._wall = wall
        self._lock = threading.RLock()
        self._base: dict[str, Node] = {}  # from GPUNode objects, nothing reserved
        self._heartbeat: dict[str, gpunode.Heartbeat] = {}  # by our --heartbeat-timeout, else the agent's
        self._pods: dict[str, PodInfo] = {}  # gpupack pods by uid
        self._pods_listed_at: float | None = None  # assume-cache time the running pod list started
        self._allocatable: dict[str, HostResources] = {}  # node -> Node allocatable CPU and memory
        self._bound: dict[str, tuple[str, HostResources]] = {}  # uid -> (node, requests), every bound pod
        self._host_used: dict[str, HostResources] = {}  # node -> sum of its bound pods' requests
        self._by_node: dict[str, dict[str, Allocation]] = {}  # node -> uid -> counted pod allocation
        self._view: dict[str, Node] = {}  # base + pod allocations, rebuilt lazily per node
        self._order: list[str] = []
        self._rank: dict[str, int] = {}  # name -> position in _order, so sorting a request is cheap
        self._fresh_until: dict[str, float] = {}  # name -> heartbeat + staleness limit (-inf: none yet)
        # Heartbeats near or past their limit, as of the last pass over _fresh_until (frame()), and the
        # earliest limit of the rest: a dead agent's node stays in the list, not in every request's pass.
        self._near_stale: list[str] = []
        self._earliest_stale = -math.inf  # no entry of _fresh_until outside _near_stale is lower
        # Names whose view changed, in order; token t (see frame()) has seen the log up to t - _log_start.
        self._log: list[str] = []
        self._log_start = 0
        self._quiet = False  # set while a relist rebuilds: it compares once at the end instead
        self.pending_reason: dict[str, str] = {}  # uid -> reason class of the last refusal

    # --- fed by the informers ---

    @property
    def gpunode_handler(self) -> Handler:
        return Handler(self.set_gpunodes, self.upsert_gpunode, self.delete_gpunode)

    @property
    def pod_handler(self) -> Handler:
        return Handler(self.set_pods, self.upsert_pod, self.delete_pod, self.pods_listing)

    @property
    def node_handler(self) -> Handler:
        return Handler(self.set_nodes, self.upsert_node, self.delete_node)

    def set_nodes(self, objs: Iterable[JsonDict]) -> None:
        with self._lock:
            before = dict(self._allocatable)
            self._allocatable.clear()
            for obj in objs:
                self._put_node(obj)
            self._changed_where(before, self._allocatable)

    def upsert_node(self, obj: JsonDict) -> None:
        name = obj_name(obj)
        with self._lock:
            before = self._allocatable.get(name)
            self._put_node(obj)
            # Node status changes often (conditions, images); only allocatable matters to placement,
            # and an unchanged view keeps the node's memoised answers valid.
            if self._allocatable.get(name) != before:
                self._changed(name)

    def delete_node(self, obj: JsonDict) -> None:
        name = obj_name(obj)
        with self._lock:
            self._allocatable.pop(name, None)
            self._changed(name)

    def _put_node(self, obj: JsonDict) -> str:
        name = obj_name(obj)
        alloc = hostres.node_allocatable(obj)
        if alloc is None:
            self._allocatable.pop(name, None)
        else:
            self._allocatable[name] = alloc
        return name

    def set_gpunodes(self, objs: Iterable[JsonDict]) -> None:
        with self._lock:
            before, self._base = self._base, {}
            self._heartbeat.clear()
            self._fresh_until.clear()
            for obj in objs:
                self._put_gpunode(obj)
            self._changed_where(before, self._base)
            self._reorder()

    def upsert_gpunode(self, obj: JsonDict) -> None:
        with self._lock:
            before = self._base.get(obj_name(obj))
            name = self._put_gpunode(obj)
            # Most updates are heartbeats: staleness is judged per request, so an unchanged inventory
            # keeps the node's view (and every answer ranked on it).
            if self._base[name] != before:
                self._changed(name)
            if name not in self._rank:
                self._reorder()

    def delete_gpunode(self, obj: JsonDict) -> None:
        name = obj_name(obj)
        with self._lock:
            self._base.pop(name, None)
            self._heartbeat.pop(name, None)
            self._fresh_until.pop(name, None)
            self._changed(name)
            self._reorder()

    def _put_gpunode(self, obj: JsonDict) -> str:
        node, heartbeat = gpunode_to_node(obj, self.heartbeat_timeout_s)
        self._base[node.name] = node
        self._heartbeat[node.name] = heartbeat
        until = heartbeat.fresh_until
        self._fresh_until[node.name] = until
        self._earliest_stale = min(self._earliest_stale, until)  # a lower bound; frame() tightens it
        return node.name

    def _reorder(self) -> None:
        order = sorted(self._base, key=node_order_key)
        if order != self._order:
            # Every rank after an added or removed node moved: readers re-read every view (the views
            # themselves do not depend on the order, so unchanged ones keep their verdicts).
            self._restart_log()
        self._order = order
        self._rank = {name: i for i, name in enumerate(order)}

    def _changed_where(
        self,
        before: Mapping[str, object],
        after: Mapping[str, object],
        norm: Callable[[Any], object] = lambda v: v,
    ) -> None:
        """A relist replaced `before` with `after` (one input of the views): only nodes whose entry differs
        change, so a relist that finds what the watch already delivered invalidates nothing."""
        for name in before.keys() | after.keys():
            if norm(before.get(name)) != norm(after.get(name)):
                self._changed(name)

    def _changed(self, name: str) -> None:
        """`name`'s view is out of date: rebuild it on next read, and tell frame() readers."""
        if self._quiet:
            return
        self._view.pop(name, None)
        self._log.append(name)
        if len(self._log) > CHANGE_LOG_LIMIT:
            self._restart_log()  # the views stay: readers re-read them all, judging only changed objects

    def _restart_log(self) -> None:
        """Readers of frame() start over: their next frame is `full` (every node's view)."""
        self._log_start += len(self._log) + 1  # no token handed out so far is within the log
        self._log.clear()

    def pods_listing(self) -> None:
        """The pod informer starts a full list (see `set_pods`)."""
        self._pods_listed_at = self.assume.now()

    def set_pods(self, objs: Iterable[JsonDict]) -> None:
        listed_at, self._pods_listed_at = self._pods_listed_at, None
        # Every pod is read before the lock is taken: a relist of 50 000 pods takes seconds to read, and
        # scheduling requests wait on the lock meanwhile.
        read = [_read_pod(obj) for obj in objs]
        present = {uid for uid, _, _ in read}
        with self._lock:
            by_node, host_used = self._by_node, self._host_used
            self._pods, self._by_node, self._bound, self._host_used = {}, {}, {}, {}
            self._quiet = True  # one comparison after the list instead of a change per pod
            try:
                for uid, info, bound in read:
                    self._put_bound(uid, bound)
                    if info is not None:
                        self._put_pod(info)
            finally:
                self._quiet = False
            self._changed_where(by_node, self._by_node, lambda d: d or None)
            self._changed_where(host_used, self._host_used)
            live = set(self._pods)
            for uid in list(self.pending_reason):
                if uid not in live:
                    del self.pending_reason[uid]
            listed = dict(self._pods)
        # A relist replaces the watch: where it shows a pod bound with the held allocation, that is
        # the echo; a pod it lacks although its hold is older than the list was deleted meanwhile.
        if listed_at is not None:
            gone = self.assume.release_absent(present, listed_at)
            if gone:
                LOG.info("holds of deleted pods released at relist", extra={"pods": len(gone)})
        for uid, held in self.assume.items().items():
            info = listed.get(uid)
            if info is not None and info.alloc == held and info.node_name:
                self.assume.release(uid)

    def upsert_pod(self, obj: JsonDict) -> None:
        uid, info, bound = _read_pod(obj)
        with self._lock:
            self._drop_bound(uid)
            self._put_bound(uid, bound)
            self._drop_pod(uid)
            if info is not None:
                self._put_pod(info)
        if info is None:
            return
        held = self.assume.get(info.uid)
        if held is not None and info.alloc == held and info.node_name:
            self.assume.release(info.uid)  # the watch echo shows the bound allocation: the hold is done

    def delete_pod(self, obj: JsonDict) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        with self._lock:
            self._drop_bound(uid)
            self._drop_pod(uid)
            self.pending_reason.pop(uid, None)
        self.assume.release(uid)

    def _put_bound(self, uid: str, bound: tuple[str, HostResources] | None) -> None:
        if bound is None:
            return
        node, req = bound
        self._bound[uid] = bound
        self._host_used[node] = self._host_used.get(node, hostres.ZERO) + req
        self._changed(node)

    def _drop_bound(self, uid: str) -> None:
        old = self._bound.pop(uid, None)
        if old is None:
            return
        node, req = old
        left = self._host_used.get(node, hostres.ZERO) - req
        if left == hostres.ZERO:
            self._host_used.pop(node, None)
        else:
            self._host_used[node] = left
        self._changed(node)

    def _put_pod(self, info: PodInfo) -> None:
        self._pods[info.uid] = info
        if info.alloc is not None:
            self._by_node.setdefault(info.alloc.node, {})[info.uid] = info.alloc
            self._changed(info.alloc.node)
        if not info.pending:
            self.pending_reason.pop(info.uid, None)

    def _drop_pod(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None and old.alloc is not None:
            self._by_node.get(old.alloc.node, {}).pop(uid, None)
            self._changed(old.alloc.node)

    # --- read by the verbs ---

    def pod(self, uid: str) -> PodInfo | None:
        with self._lock:
            return self._pods.get(uid)

    def pod_by_key(self, key: str) -> PodInfo | None:
        with self._lock:
            return next((p for p in self._pods.values() if p.key == key), None)

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return list(self._pods.values())

    def inventory(self) -> list[Node]:
        """Every GPUNode's node as its agent reports it, nothing reserved, stale or not: the fleet the
        target workload is judged on (`TargetWorkload.on_fleet`)."""
        with self._lock:
            return list(self._base.values())

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._order)

    def nodes(self, names_: Iterable[str] | None = None, exclude_uid: str = "") -> dict[str, Node | None]:
        """Current Node per name (None: no GPUNode), with holds applied and `exclude_uid`'s own share removed.

        Nodes come back in natural name order, the order placement breaks ties in.
        """
        now = self._wall()
        holds = self.assume.items()
        with self._lock:
            rank = self._rank
            last = len(rank)
            wanted = (
                self._order
                if names_ is None
                else sorted(
                    set(names_), key=lambda n: (rank.get(n, last), node_order_key(n) if n not in rank else ())
                )
            )
            delta = self._deltas(holds, exclude_uid)
            return {name: self._current(name, delta, now) for name in wanted}

    def busy(self) -> bool:
        """Whether another thread holds the cache now (an informer applying a list, say): a reader
        would wait for it."""
        if self._lock.acquire(blocking=False):
            self._lock.release()
            return False
        return True

    def frame(self, token: int | None, exclude_uid: str = "") -> Frame:
        """What changed since `token` (a previous frame's), and what one request sees differently.

        `nodes()` for any name is the frame's `adjusted` node where it has one, else its view as of
        this frame; `changed` holds the views that changed since `token` (every view when `full`).
        """
        now = self._wall()
        holds = self.assume.items()
        with self._lock:
            full = token is None or token < self._log_start
            names = self._order if token is None or full else set(self._log[token - self._log_start :])
            changed = {name: self._materialize(name) for name in names}
            delta = self._deltas(holds, exclude_uid)
            touched = set(delta)
            # A heartbeat this close to its limit is judged exactly, as nodes() does; the rest are fresh.
            soon = now + STALE_CHECK_AHEAD_S
            if soon >= self._earliest_stale:  # else no other heartbeat is near its limit: skip the pass
                near = [name for name, until in self._fresh_until.items() if until <= soon]
                self._near_stale = near
                rest = (until for until in self._fresh_until.values() if until > soon)
                self._earliest_stale = min(rest, default=math.inf)
            touched.update(self._near_stale)  # one beaten since is judged fresh again: harmless
            adjusted: dict[str, Node | None] = {}
            for name in touched:
                view = self._materialize(name)
                node = self._current(name, delta, now)
                if view is not None and node is not view:
                    adjusted[name] = node
            return Frame(self._log_start + len(self._log), full, changed, self._rank, adjusted)

    def _deltas(self, holds: Mapping[str, Allocation], exclude_uid: str) -> dict[str, list[Delta]]:
        """Per node: allocations and host requests to add (+1) or take away (-1) on top of the view."""
        delta: dict[str, list[Delta]] = {}
        zero = hostres.ZERO
        for uid, held in holds.items():
            info = self._pods.get(uid)
            counted = info.alloc if info is not None else None
            if counted is not None and counted != held:
                delta.setdefault(counted.node, []).append((counted, zero, -1))
            if uid == exclude_uid:
                continue
            add = None if counted == held else held
            # A held pod's host request is charged once its bound pod shows up in the watch.
            bound = self._bound.get(uid)
            host = info.host if info is not None and (bound is None or bound[0] != held.node) else zero
            if add is not None or host != zero:
                delta.setdefault(held.node, []).append((add, host, +1))
        own = self._pods.get(exclude_uid)
        if exclude_uid and exclude_uid not in holds and own is not None and own.alloc is not None:
            delta.setdefault(own.alloc.node, []).append((own.alloc, zero, -1))
        own_bound = self._bound.get(exclude_uid) if exclude_uid else None
        if own_bound is not None:
            delta.setdefault(own_bound[0], []).append((None, own_bound[1], -1))
        return delta

    def _current(self, name: str, delta: Mapping[str, list[Delta]], now: float) -> Node | None:
        """The view of `name` with `delta` applied and its heartbeat judged at `now`."""
        node = self._materialize(name)
        if node is not None:
            for alloc, host, sign in delta.get(name, ()):
                node = _adjust(node, alloc, host, sign)
            node = self._with_heartbeat(node, now)
        return node

    def node(self, name: str, exclude_uid: str = "") -> Node | None:
        return self.nodes([name], exclude_uid)[name]

    def _materialize(self, name: str) -> Node | None:
        cached = self._view.get(name)
        if cached is not None:
            return cached
        base = self._base.get(name)
        if base is None:
            return None
        node = base.reserve(self._by_node.get(name, {}).values())
        allocatable = self._allocatable.get(name)
        if allocatable is not None:
            free = allocatable - self._host_used.get(name, hostres.ZERO)
            node = replace(node, cpu_milli_free=free.cpu_milli, memory_mib_free=free.memory_mib)
        self._view[name] = node
        return node

    def _with_heartbeat(self, node: Node, now: float) -> Node:
        if not node.schedulable:
            return node
        heartbeat = self._heartbeat.get(node.name) or gpunode.Heartbeat.of(None, self.heartbeat_timeout_s)
        reason = heartbeat.stale_reason(now)
        return replace(node, schedulable=False, unschedulable_reason=reason) if reason else node

    def snapshot(self) -> ClusterState:
        """Every node as the verbs see it (for /state and metrics)."""
        return ClusterState({n: node for n, node in self.nodes().items() if node is not None})

    def allocations(self) -> dict[str, Allocation]:
        """Counted allocations by pod UID: pod annotations overlaid with holds."""
        with self._lock:
            out = {uid: p.alloc for uid, p in self._pods.items() if p.alloc is not None}
        out.update(self.assume.items())
        return out

    def pods_by_gpu(self) -> dict[tuple[str, int], list[str]]:
        """Pod keys (namespace/name, or the UID of a hold whose pod is gone) per (node, GPU index)."""
        allocs = self.allocations()
        with self._lock:
            keys = {uid: p.key for uid, p in self._pods.items()}
        out: dict[tuple[str, int], list[str]] = {}
        for uid, alloc in allocs.items():
            for idx in alloc.gpu_indexes:
                out.setdefault((alloc.node, idx), []).append(keys.get(uid, uid))
        return out

    def note_refusal(self, uid: str, reason_class: str) -> None:
        """Remember why the last filter refused a pending pod everywhere (for the pending-pods metric)."""
        with self._lock:
            info = self._pods.get(uid)
            if info is None or info.pending:
                self.pending_reason[uid] = reason_class

    def clear_refusal(self, uid: str) -> None:
        with self._lock:
            self.pending_reason.pop(uid, None)


# --- GPUNode objects (gpupack.io/v1alpha1) ---


def gpunode_to_node(obj: JsonDict, heartbeat_timeout_s: float | None) -> tuple[Node, gpunode.Heartbeat]:
    """A GPUNode as a Node with nothing reserved, and its heartbeat (by `heartbeat_timeout_s` when set,
    else the agent's own limit).

    Staleness is left to the reader (`ClusterCache`), which judges it against the time of each request.
    An object that does not fit the CRD's types gives a node without GPUs that says which field is wrong.
    """
    try:
        gn = gpunode.read(obj)
    except gpunode.GPUNodeError as exc:
        node = Node(name=obj_name(obj), gpus=(), schedulable=False, unschedulable_reason=str(exc))
        return node, gpunode.Heartbeat.of(None, heartbeat_timeout_s)
    return gn.to_model_node(), gpunode.Heartbeat.of(gn.status, heartbeat_timeout_s)
