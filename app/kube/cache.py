"""The extender's cluster cache: GPUNode inventory + pod-annotation allocations + assume holds -> Nodes.

Host CPU and memory come from Node allocatable minus the requests of every pod bound to the node, so
placement scores with the same inputs as the simulator.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from app import hostres, log, objects
from app.hostres import HostResources
from app.kube import gpunode
from app.kube.assume import AssumeCache
from app.kube.calls import JsonDict
from app.model import Allocation, ClusterState, Node
from app.pods import TERMINAL_PHASES, PodInfo, is_gpupack_pod, pod_info

LOG = log.get("gpupack.cache")


def node_order_key(name: str) -> tuple[Any, ...]:
    """Natural order (gpu-node-2 before gpu-node-10): the tie-break order the extender gives placement."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _read(pod: Mapping[str, Any]) -> PodInfo:
    info = pod_info(pod)
    if info.allocation_error:
        LOG.warning(
            "corrupt allocation annotations ignored", extra={"pod": info.key, "error": info.allocation_error}
        )
    return info


def _bound_host(pod: Mapping[str, Any], host: HostResources | None) -> tuple[str, HostResources] | None:
    """(node, requests) for a pod that holds host resources on a node now, else None.

    `host` is the pod's request when the caller computed it already.
    """
    spec = objects.as_object(pod.get("spec"))
    node = spec.get("nodeName")
    phase = objects.as_object(pod.get("status")).get("phase")
    if not node or not isinstance(node, str) or phase in TERMINAL_PHASES:
        return None
    return node, host if host is not None else hostres.pod_requests(spec)


def _adjust(node: Node, alloc: Allocation | None, host: HostResources, sign: int) -> Node:
    """`node` with a pod's allocation and host request added (`sign=1`) or taken away (`sign=-1`)."""
    node = node.reserve(() if alloc is None else (alloc,), sign)
    return node.charge_host(sign * host.cpu_milli, sign * host.memory_mib)


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
        self._heartbeat: dict[str, float | None] = {}
        self._stale_after: dict[str, int | None] = {}  # each agent's own limit, used when ours is None
        self._pods: dict[str, PodInfo] = {}  # gpupack pods by uid
        self._pods_listed_at: float | None = None  # assume-cache time the running pod list started
        self._allocatable: dict[str, HostResources] = {}  # node -> Node allocatable CPU and memory
        self._bound: dict[str, tuple[str, HostResources]] = {}  # uid -> (node, requests), every bound pod
        self._host_used: dict[str, HostResources] = {}  # node -> sum of its bound pods' requests
        self._by_node: dict[str, dict[str, Allocation]] = {}  # node -> uid -> counted pod allocation
        self._view: dict[str, Node] = {}  # base + pod allocations, rebuilt lazily per node
        self._order: list[str] = []
        self._rank: dict[str, int] = {}  # name -> position in _order, so sorting a request is cheap
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
            self._allocatable.clear()
            for obj in objs:
                self._put_node(obj)
            self._view.clear()

    def upsert_node(self, obj: JsonDict) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            before = self._allocatable.get(name)
            self._put_node(obj)
            # Node status changes often (conditions, images); only allocatable matters to placement,
            # and an unchanged view keeps the node's memoised answers valid.
            if self._allocatable.get(name) != before:
                self._view.pop(name, None)

    def delete_node(self, obj: JsonDict) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            self._allocatable.pop(name, None)
            self._view.pop(name, None)

    def _put_node(self, obj: JsonDict) -> str:
        name = str((obj.get("metadata") or {}).get("name", ""))
        alloc = hostres.node_allocatable(obj)
        if alloc is None:
            self._allocatable.pop(name, None)
        else:
            self._allocatable[name] = alloc
        return name

    def set_gpunodes(self, objs: Iterable[JsonDict]) -> None:
        with self._lock:
            self._base.clear()
            self._heartbeat.clear()
            self._stale_after.clear()
            for obj in objs:
                self._put_gpunode(obj)
            self._view.clear()
            self._reorder()

    def upsert_gpunode(self, obj: JsonDict) -> None:
        with self._lock:
            name = self._put_gpunode(obj)
            self._view.pop(name, None)
            if name not in self._order:
                self._reorder()

    def delete_gpunode(self, obj: JsonDict) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            self._base.pop(name, None)
            self._heartbeat.pop(name, None)
            self._stale_after.pop(name, None)
            self._view.pop(name, None)
            self._reorder()

    def _put_gpunode(self, obj: JsonDict) -> str:
        node, heartbeat, stale_after = gpunode_to_node(obj)
        self._base[node.name] = node
        self._heartbeat[node.name] = heartbeat
        self._stale_after[node.name] = stale_after
        return node.name

    def _reorder(self) -> None:
        self._order = sorted(self._base, key=node_order_key)
        self._rank = {name: i for i, name in enumerate(self._order)}

    def pods_listing(self) -> None:
        """The pod informer starts a full list (see `set_pods`)."""
        self._pods_listed_at = self.assume.now()

    def set_pods(self, objs: Iterable[JsonDict]) -> None:
        listed_at, self._pods_listed_at = self._pods_listed_at, None
        present: set[str] = set()
        with self._lock:
            self._pods.clear()
            self._by_node.clear()
            self._bound.clear()
            self._host_used.clear()
            for obj in objs:
                present.add(str((obj.get("metadata") or {}).get("uid", "")))
                info = _read(obj) if is_gpupack_pod(obj) else None
                self._put_bound(obj, info)
                if info is not None:
                    self._put_pod(info)
            self._view.clear()
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
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        ours = is_gpupack_pod(obj)
        info = _read(obj) if ours else None
        with self._lock:
            self._drop_bound(uid)
            self._put_bound(obj, info)
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

    def _put_bound(self, obj: JsonDict, info: PodInfo | None) -> None:
        bound = _bound_host(obj, info.host if info is not None else None)
        if bound is None:
            return
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        node, req = bound
        self._bound[uid] = bound
        self._host_used[node] = self._host_used.get(node, hostres.ZERO) + req
        self._view.pop(node, None)

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
        self._view.pop(node, None)

    def _put_pod(self, info: PodInfo) -> None:
        self._pods[info.uid] = info
        if info.alloc is not None:
            self._by_node.setdefault(info.alloc.node, {})[info.uid] = info.alloc
            self._view.pop(info.alloc.node, None)
        if not info.pending:
            self.pending_reason.pop(info.uid, None)

    def _drop_pod(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None and old.alloc is not None:
            self._by_node.get(old.alloc.node, {}).pop(uid, None)
            self._view.pop(old.alloc.node, None)

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
            # Per node: allocations and host requests to add (+1) or take away (-1) on top of the view.
            delta: dict[str, list[tuple[Allocation | None, HostResources, int]]] = {}
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
            out: dict[str, Node | None] = {}
            for name in wanted:
                node = self._materialize(name)
                if node is not None:
                    for alloc, host, sign in delta.get(name, ()):
                        node = _adjust(node, alloc, host, sign)
                    node = self._with_heartbeat(node, now)
                out[name] = node
            return out

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
        limit = (
            self.heartbeat_timeout_s
            or self._stale_after.get(node.name)
            or gpunode.DEFAULT_HEARTBEAT_S * gpunode.STALE_FACTOR
        )
        reason = gpunode.stale_reason(self._heartbeat.get(node.name), limit, now)
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


def gpunode_to_node(obj: Mapping[str, Any]) -> tuple[Node, float | None, int | None]:
    """A GPUNode as a Node with nothing reserved, its heartbeat (Unix time) and its own staleness limit.

    Staleness is left to the reader (`ClusterCache`), which judges it against the time of each request.
    """
    gn = gpunode.GPUNode.from_dict(obj)
    if gn.status is None:
        return gn.to_model_node(0.0), None, None
    node = gn.to_model_node(gn.status.heartbeat_time)
    return node, gn.status.heartbeat_time or None, gn.status.stale_after_seconds
