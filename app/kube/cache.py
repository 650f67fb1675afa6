"""The extender's cluster cache: the informers' stores, the node views built from them, and assume holds.

One lock over the stores (`app.kube.stores`, one per informer) and the views (`app.kube.views`): each
informer event is applied whole, and each request reads one consistent state. Host CPU and memory come
from Node allocatable minus the requests of every pod bound to the node, so placement scores with the
same inputs as the simulator.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.core import log
from app.core.model import Allocation, ClusterState, Node
from app.core.pods import PodInfo
from app.kube.assume import AssumeCache
from app.kube.calls import JsonDict
from app.kube.stores import GpuNodeStore, NodeStore, PodStore, read_pod
from app.kube.views import ChangeLog, Frame, NodeViews

LOG = log.get("gpupack.cache")


@dataclass(frozen=True, slots=True)
class Handler:
    """What an informer feeds: the cache's methods for one collection."""

    replace: Callable[[list[JsonDict]], None]
    upsert: Callable[[JsonDict], None]
    delete: Callable[[JsonDict], None]
    listing: Callable[[], None] = lambda: None


class ClusterCache:
    """Thread-safe cluster view fed by the GPUNode, pod and Node informers, read by the scheduling verbs."""

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
        changes = ChangeLog()
        self._gpunodes = GpuNodeStore(changes, heartbeat_timeout_s)
        self._nodes = NodeStore(changes)
        self._pods = PodStore(changes)
        self._views = NodeViews(self._gpunodes, self._nodes, self._pods, changes)
        self._pods_listed_at: float | None = None  # assume-cache time the running pod list started

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
            self._nodes.replace(objs)

    def upsert_node(self, obj: JsonDict) -> None:
        with self._lock:
            self._nodes.upsert(obj)

    def delete_node(self, obj: JsonDict) -> None:
        with self._lock:
            self._nodes.delete(obj)

    def set_gpunodes(self, objs: Iterable[JsonDict]) -> None:
        with self._lock:
            self._gpunodes.replace(objs)

    def upsert_gpunode(self, obj: JsonDict) -> None:
        with self._lock:
            self._gpunodes.upsert(obj)

    def delete_gpunode(self, obj: JsonDict) -> None:
        with self._lock:
            self._gpunodes.delete(obj)

    def pods_listing(self) -> None:
        """The pod informer starts a full list (see `set_pods`)."""
        self._pods_listed_at = self.assume.now()

    def set_pods(self, objs: Iterable[JsonDict]) -> None:
        listed_at, self._pods_listed_at = self._pods_listed_at, None
        # Every pod is read before the lock is taken: a relist of 50 000 pods takes seconds to read, and
        # scheduling requests wait on the lock meanwhile.
        read = [read_pod(obj) for obj in objs]
        present = {uid for uid, _, _ in read}
        with self._lock:
            self._pods.replace(read)
            listed = dict(self._pods.pods)
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
        reading = read_pod(obj)
        with self._lock:
            self._pods.upsert(reading)
        info = reading[1]
        if info is None:
            return
        held = self.assume.get(info.uid)
        if held is not None and info.alloc == held and info.node_name:
            self.assume.release(info.uid)  # the watch echo shows the bound allocation: the hold is done

    def delete_pod(self, obj: JsonDict) -> None:
        uid = str((obj.get("metadata") or {}).get("uid", ""))
        with self._lock:
            self._pods.delete(uid)
        self.assume.release(uid)

    # --- read by the verbs ---

    def pod(self, uid: str) -> PodInfo | None:
        with self._lock:
            return self._pods.pods.get(uid)

    def pod_by_key(self, key: str) -> PodInfo | None:
        with self._lock:
            return next((p for p in self._pods.pods.values() if p.key == key), None)

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return list(self._pods.pods.values())

    def inventory(self) -> list[Node]:
        """Every GPUNode's node as its agent reports it, nothing reserved, stale or not: the fleet the
        target workload is judged on (`TargetWorkload.on_fleet`)."""
        with self._lock:
            return list(self._gpunodes.base.values())

    def unreported(self) -> frozenset[str]:
        """GPUNodes whose agent has not written a status yet: the node is there, its GPUs not yet (an
        agent creates its GPUNode first and reports on it next; until then nothing fits there)."""
        with self._lock:
            return frozenset(name for name, beat in self._gpunodes.heartbeat.items() if beat.at is None)

    def node_names(self) -> list[str]:
        with self._lock:
            return list(self._gpunodes.order)

    def nodes(self, names_: Iterable[str] | None = None, exclude_uid: str = "") -> dict[str, Node | None]:
        """Current Node per name (None: no GPUNode), with holds applied and `exclude_uid`'s own share removed.

        Nodes come back in natural name order, the order placement breaks ties in.
        """
        now = self._wall()
        holds = self.assume.items()
        with self._lock:
            return self._views.seen(self._views.ordered(names_), holds, exclude_uid, now)

    def busy(self) -> bool:
        """Whether another thread holds the cache now (an informer applying a list, say): a reader
        would wait for it."""
        if self._lock.acquire(blocking=False):
            self._lock.release()
            return False
        return True

    def frame(self, token: int | None, exclude_uid: str = "") -> Frame:
        """What changed since `token` (a previous frame's), and what one request sees differently
        (`NodeViews.frame`)."""
        now = self._wall()
        holds = self.assume.items()
        with self._lock:
            return self._views.frame(token, holds, exclude_uid, now)

    def node(self, name: str, exclude_uid: str = "") -> Node | None:
        return self.nodes([name], exclude_uid)[name]

    def snapshot(self) -> ClusterState:
        """Every node as the verbs see it (for /state and metrics)."""
        return ClusterState({n: node for n, node in self.nodes().items() if node is not None})

    def allocations(self) -> dict[str, Allocation]:
        """Counted allocations by pod UID: pod annotations overlaid with holds."""
        with self._lock:
            out = {uid: p.alloc for uid, p in self._pods.pods.items() if p.alloc is not None}
        out.update(self.assume.items())
        return out

    def pods_by_gpu(self) -> dict[tuple[str, int], list[str]]:
        """Pod keys (namespace/name, or the UID of a hold whose pod is gone) per (node, GPU index)."""
        allocs = self.allocations()
        with self._lock:
            keys = {uid: p.key for uid, p in self._pods.pods.items()}
        out: dict[tuple[str, int], list[str]] = {}
        for uid, alloc in allocs.items():
            for idx in alloc.gpu_indexes:
                out.setdefault((alloc.node, idx), []).append(keys.get(uid, uid))
        return out
