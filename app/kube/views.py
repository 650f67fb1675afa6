"""Node views built from the extender's stores, and the change log that feeds the placement engine.

A node's view is its GPUNode with the pods' counted allocations reserved and host CPU and memory free
as Node allocatable less its bound pods' requests. It is built on first read and kept until a store says
it changed; each change is logged, so a reader (the engine's `Rankings`) takes only what changed since its
last `Frame`. What one request sees on top of the views (assume holds, the pod's own share taken away, a
stale heartbeat) is applied per request, never kept. Not locked: the cluster cache reads under its lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from app.core import hostres
from app.core.hostres import HostResources
from app.core.model import Allocation, Gpu, Node
from app.kube.stores import GpuNodeStore, NodeStore, PodStore, node_order_key

# Changes a reader of frame() may be behind by before it is told to start over (a full re-read is one
# pass over the nodes, so a log longer than a few passes saves nothing).
CHANGE_LOG_LIMIT = 50_000

# Heartbeats that go stale within this many seconds of a frame are checked exactly (see frame()).
STALE_CHECK_AHEAD_S = 1.0

# An allocation and a host request, added (+1) or taken away (-1) on top of a node's view.
Delta = tuple[Allocation | None, HostResources, int]

# A node's GPUs as its GPUNode gives them (nothing reserved), and as its last view reserved them.
Built = tuple[tuple[Gpu, ...], tuple[Gpu, ...]]


@dataclass(frozen=True, slots=True)
class Frame:
    """One request's reading of the views for a Ranking (see NodeViews.frame)."""

    token: int  # hand back to the next frame() to get only what changed after this one
    full: bool  # `changed` holds every node: the token was too old, or the node order moved
    changed: dict[str, Node | None]  # views changed since the token (None: the node is gone)
    rank: Mapping[str, int]  # natural-order position of every node with a GPUNode
    # Nodes this request sees other than their view: holds, the pod's own share, a stale heartbeat.
    adjusted: dict[str, Node | None]


class ChangeLog:
    """Which nodes' views changed, in order, and the views built since each one's last change (the
    stores' `Changes` sink)."""

    def __init__(self, limit: int = CHANGE_LOG_LIMIT) -> None:
        self.limit = limit
        self.built: dict[str, Node] = {}  # name -> its view, until it changes
        # Token t (see NodeViews.frame) has seen the log up to t - _start.
        self._log: list[str] = []
        self._start = 0

    def changed(self, name: str) -> None:
        """`name`'s view is out of date: rebuilt on next read, and reported to frame() readers."""
        self.built.pop(name, None)
        self._log.append(name)
        if len(self._log) > self.limit:
            self.restart()  # the views stay: readers re-read them all, judging only changed objects

    def restart(self) -> None:
        """Readers of frame() start over: their next frame is `full` (every node's view)."""
        self._start += len(self._log) + 1  # no token handed out so far is within the log
        self._log.clear()

    @property
    def token(self) -> int:
        return self._start + len(self._log)

    def since(self, token: int | None) -> set[str] | None:
        """The names changed after `token`; None when it is too old to say (or None): every name."""
        if token is None or token < self._start:
            return None
        return set(self._log[token - self._start :])


def _adjust(node: Node, alloc: Allocation | None, host: HostResources, sign: int) -> Node:
    """`node` with a pod's allocation and host request added (`sign=1`) or taken away (`sign=-1`)."""
    node = node.reserve(() if alloc is None else (alloc,), sign)
    return node.charge_host(sign * host.cpu_milli, sign * host.memory_mib)


def _reserved(base: Node, sums: Mapping[int, list[int]] | None, before: Built | None) -> tuple[Gpu, ...]:
    """`base`'s GPUs with its pods' allocations reserved, from their sums per GPU (`PodStore.reserved`):
    those `base.reserve(allocations)` gives, in one step per GPU rather than one per pod.

    A GPU whose reservation is what it was in the node's previous view (`before`, built on the same
    GPUNode) is that view's GPU object, not a copy: a bind changes one GPU of a node, and every object a
    rebuilt view makes new lives on, for the garbage collector to walk (its middle-generation pauses land
    in the scheduler's requests)."""
    if not sums:
        return base.gpus
    old = before[1] if before is not None and before[0] is base.gpus else None
    gpus = []
    for k, g in enumerate(base.gpus):
        reserved = sums.get(g.index)
        if reserved is None:
            gpus.append(g)
            continue
        if old is not None:
            prev = old[k]
            milli, memory = g.milli_used + reserved[1], g.memory_used_mib + reserved[2]
            if prev.milli_used == milli and prev.memory_used_mib == memory:
                gpus.append(prev)
                continue
        gpus.append(g.reserve(reserved[1], reserved[2]))
    return tuple(gpus)


class NodeViews:
    """The views of every node with a GPUNode, from the three stores, kept current by the change log."""

    def __init__(self, gpunodes: GpuNodeStore, nodes: NodeStore, pods: PodStore, log: ChangeLog) -> None:
        self.gpunodes, self.nodes, self.pods, self.log = gpunodes, nodes, pods, log
        self._gpus: dict[str, Built] = {}  # per node: the GPUs of its last view with pods, and their base

    def view(self, name: str) -> Node | None:
        """`name`'s view (None: no GPUNode), built now if it changed since it was last built."""
        built = self.log.built
        cached = built.get(name)
        if cached is not None:
            return cached
        base = self.gpunodes.base.get(name)
        if base is None:
            self._gpus.pop(name, None)
            return None
        pods = self.pods
        gpus = _reserved(base, pods.reserved.get(name), self._gpus.get(name))
        if gpus is not base.gpus:
            self._gpus[name] = (base.gpus, gpus)
        allocatable = self.nodes.allocatable.get(name)
        if allocatable is not None:
            free = allocatable - pods.host_used.get(name, hostres.ZERO)
            node = replace(base, gpus=gpus, cpu_milli_free=free.cpu_milli, memory_mib_free=free.memory_mib)
        else:
            node = base if gpus is base.gpus else replace(base, gpus=gpus)
        built[name] = node
        return node

    def ordered(self, names: Iterable[str] | None) -> list[str]:
        """`names` (None: every node with a GPUNode) in natural order, those without a GPUNode last."""
        if names is None:
            return self.gpunodes.order
        rank = self.gpunodes.rank
        last = len(rank)
        return sorted(
            set(names), key=lambda n: (rank.get(n, last), node_order_key(n) if n not in rank else ())
        )

    def seen(
        self, names: Iterable[str], holds: Mapping[str, Allocation], exclude_uid: str, now: float
    ) -> dict[str, Node | None]:
        """What a request sees of each node: its view with `holds` applied, `exclude_uid`'s own share
        taken away and its heartbeat judged at `now`."""
        delta = self._deltas(holds, exclude_uid)
        return {name: self._current(name, delta, now) for name in names}

    def frame(
        self, token: int | None, holds: Mapping[str, Allocation], exclude_uid: str, now: float
    ) -> Frame:
        """What changed since `token` (a previous frame's), and what one request sees differently.

        `seen()` for any name is the frame's `adjusted` node where it has one, else its view as of
        this frame; `changed` holds the views that changed since `token` (every view when `full`).
        """
        since = self.log.since(token)
        full = since is None
        names = self.gpunodes.order if since is None else since
        view = self.view
        changed = {name: view(name) for name in names}
        delta = self._deltas(holds, exclude_uid)
        touched = set(delta)
        # A heartbeat this close to its limit is judged exactly, as seen() does; the rest are fresh.
        touched.update(self.gpunodes.near_stale(now + STALE_CHECK_AHEAD_S))
        adjusted: dict[str, Node | None] = {}
        for name in touched:
            base = view(name)
            node = self._current(name, delta, now)
            if base is not None and node is not base:
                adjusted[name] = node
        return Frame(self.log.token, full, changed, self.gpunodes.rank, adjusted)

    def _deltas(self, holds: Mapping[str, Allocation], exclude_uid: str) -> dict[str, list[Delta]]:
        """Per node: allocations and host requests to add (+1) or take away (-1) on top of the view."""
        delta: dict[str, list[Delta]] = {}
        zero = hostres.ZERO
        pods, bound_pods = self.pods.pods, self.pods.bound
        for uid, held in holds.items():
            info = pods.get(uid)
            counted = info.alloc if info is not None else None
            if counted is not None and (counted != held or uid == exclude_uid):
                # The hold replaces what the pod store counts; for the asking pod, nothing replaces it
                # (also where the two agree: its annotation echoed mid-bind, the binding not yet).
                delta.setdefault(counted.node, []).append((counted, zero, -1))
            if uid == exclude_uid:
                continue
            add = None if counted == held else held
            # A held pod's host request is charged once its bound pod shows up in the watch.
            bound = bound_pods.get(uid)
            host = info.host if info is not None and (bound is None or bound[0] != held.node) else zero
            if add is not None or host != zero:
                delta.setdefault(held.node, []).append((add, host, +1))
        own = pods.get(exclude_uid)
        if exclude_uid and exclude_uid not in holds and own is not None and own.alloc is not None:
            delta.setdefault(own.alloc.node, []).append((own.alloc, zero, -1))
        own_bound = bound_pods.get(exclude_uid) if exclude_uid else None
        if own_bound is not None:
            delta.setdefault(own_bound[0], []).append((None, own_bound[1], -1))
        return delta

    def _current(self, name: str, delta: Mapping[str, list[Delta]], now: float) -> Node | None:
        """The view of `name` with `delta` applied and its heartbeat judged at `now`."""
        node = self.view(name)
        if node is not None:
            for alloc, host, sign in delta.get(name, ()):
                node = _adjust(node, alloc, host, sign)
            node = self.gpunodes.judged(node, now)
        return node
