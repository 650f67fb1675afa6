"""Replaying a pod trace against a cluster with one policy, the FGD way (shuffle, inflate, no departures)."""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from app.model import MILLI_PER_GPU, Demand, Node
from app.placement import Placement, Policy, TargetWorkload, place, to_allocation
from app.placement.fit import (
    Headroom,
    HeadroomScore,
    fits_check,
    headroom,
    headroom_fits,
    is_share,
    uses_fit_filter,
    within,
)
from app.sim.loader import TracePod

MAX_ARRIVED_PCT = 130  # the paper's x-axis ends here
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RunResult:
    """One (policy, seed) run. Curves are indexed by arrived % (0..130), NaN where nothing arrived."""

    policy: str
    seed: int
    pods: int
    placed: int
    failed: int
    seconds: float
    alloc_pct: tuple[float, ...]
    frag_pct: tuple[float, ...]

    def unallocated_at(self, arrived_pct: int) -> float:
        return 100.0 - self.alloc_pct[arrived_pct]

    @property
    def pods_per_second(self) -> float:
        return self.pods / self.seconds if self.seconds > 0 else math.inf


def arrival_sequence(
    pods: Sequence[TracePod], nodes: int, capacity_milli: int, seed: int, inflate: float
) -> tuple[list[TracePod], list[int]]:
    """The pod arrival order and the node order (tie-break rank) for one seed.

    Shuffle the trace, then append pods drawn with replacement until the total GPU request reaches
    `inflate` x capacity (or drop random pods if it is already above), as FGD's TunePodsByNodeTotalResource.
    """
    rng = random.Random(seed)
    base = sorted(pods, key=lambda p: p.name)
    seq = list(base)
    rng.shuffle(seq)
    target = inflate * capacity_milli
    total = sum(p.gpu_milli for p in seq)
    if total < target:
        while True:
            extra = base[rng.randrange(len(base))]
            # FGD checks the per-device milli here, not the pod's total; kept for comparable numbers.
            if total + (extra.demand.milli or 0) > target:
                break
            seq.append(extra)
            total += extra.gpu_milli
    else:
        while total > target and seq:
            total -= seq.pop(rng.randrange(len(seq))).gpu_milli
    order = list(range(nodes))
    rng.shuffle(order)
    return seq, order


class Cluster:
    """Mutable per-node bookkeeping; every decision is delegated to the policy."""

    def __init__(self, nodes: Sequence[Node], workload: TargetWorkload):
        self.nodes = list(nodes)
        self.workload = workload
        self.frag = [self._frag(n) for n in self.nodes]
        self.frag_total = sum(self.frag)

    def _frag(self, node: Node) -> float:
        return self.workload.node_frag(node.cpu_milli_free, node.whole_lefts, node.model)

    def apply(self, i: int, demand: Demand, gpus: tuple[int, ...]) -> int:
        """Reserve `demand` on node i's `gpus`; returns the milli reserved. Refuses any over-commit."""
        node = self.nodes[i]
        if len(gpus) != demand.count or len(set(gpus)) != len(gpus):
            raise AssertionError(f"{node.name}: policy chose GPUs {gpus} for a {demand.count}-GPU demand")
        allocs = (to_allocation(node, demand, gpus),) if gpus else ()
        new = node.reserve(allocs).charge_host(demand.cpu_milli, demand.host_memory_mib)
        for g in new.gpus:
            if g.index in gpus and (g.milli_free < 0 or g.memory_free_mib < 0):
                raise AssertionError(f"{node.name}/gpu{g.index}: over-commit on {g}")
        if (new.cpu_milli_free or 0) < 0 or (new.memory_mib_free or 0) < 0:
            raise AssertionError(f"{node.name}: over-commit of host CPU or memory")
        self._set(i, new)
        return sum(a.milli for a in allocs) * len(gpus)

    def release(self, i: int, demand: Demand, gpus: tuple[int, ...]) -> None:
        """Give back what `apply(i, demand, gpus)` reserved (a departure or an eviction)."""
        node = self.nodes[i]
        allocs = (to_allocation(node, demand, gpus),) if gpus else ()
        self._set(i, node.reserve(allocs, sign=-1).charge_host(-demand.cpu_milli, -demand.host_memory_mib))

    def _set(self, i: int, node: Node) -> None:
        self.nodes[i] = node
        f = self._frag(node)
        self.frag_total += f - self.frag[i]
        self.frag[i] = f


def _signature(node: Node) -> tuple[object, ...]:
    gpus = tuple(
        (
            g.model,
            g.memory_mib,
            g.milli_used,
            g.memory_used_mib,
            g.foreign_mib,
            g.live_free_mib,
            g.healthy,
            g.mig_profile,
        )
        for g in node.gpus
    )
    return (node.cpu_milli_free, node.memory_mib_free, node.schedulable, gpus)


class IndexedChooser:
    """The same answer as `place(nodes, demand, policy)`, without rescoring unchanged nodes.

    Scores depend only on (node, demand), so each demand shape keeps a heap of (-score, rank) that is
    refreshed only for nodes changed since that shape was last placed (read from one log of changes, so
    a change costs nothing per shape); stale entries are skipped by version. Identical node states share
    one evaluation per shape through an interned state id. With FitFilter's own fit check, a share demand
    is judged from each node state's `Headroom`, computed once per change rather than once per shape; a
    policy whose score reads only that (`HeadroomScore`) shares evaluations between all node states
    with equal headroom. Where its score also falls as the headroom shrinks, a node that only took pods
    keeps its stale entry as an upper bound and is judged again only when that entry reaches the top.
    """

    def __init__(self, cluster: Cluster, policy: Policy):
        self.cluster = cluster
        self.policy = policy
        n = len(cluster.nodes)
        self.version = [0] * n
        self.log: list[int] = []  # nodes changed, oldest first
        self.grown: list[int] = []  # the changes that left a node's headroom not `within` the old one
        self.grown_at = [0] * n  # node -> its version after the last such change
        self.shapes: dict[Demand, _Shape] = {}
        self.fits = fits_check(policy)
        self.margin = policy.margin_mib if uses_fit_filter(policy) else None
        self.scorer = policy if isinstance(policy, HeadroomScore) else None
        self.rooms = (
            [headroom(node, self.margin) for node in cluster.nodes] if self.margin is not None else []
        )
        self.room_states: dict[Headroom, int] = {}
        self.room_state = [self.room_states.setdefault(r, len(self.room_states)) for r in self.rooms]
        self.states: dict[tuple[object, ...], int] = {}
        self.state: list[int] = []  # by node signature; built when a shape first needs it

    def _shape(self, demand: Demand) -> _Shape:
        """A new shape's bookkeeping: how it judges node i, the state ids that share its answers, and
        the log of changes it reads (only the growths when its stale entries are bounds)."""
        nodes, policy, rooms, scorer = self.cluster.nodes, self.policy, self.rooms, self.scorer
        n = len(nodes)
        share = self.margin is not None and is_share(demand)
        if share and scorer is not None:
            score = scorer.score_headroom

            def by_headroom(i: int) -> float | None:
                room = rooms[i]
                return score(room, demand) if headroom_fits(room, demand) else None

            lazy = scorer.score_falls_with_room
            log = self.grown if lazy else self.log
            return _Shape(self.room_state, by_headroom, log, len(log), True, lazy, [-1] * n, [-1] * n)
        fits = self.fits

        def by_node(i: int) -> float | None:
            ok = headroom_fits(rooms[i], demand) if share else fits(nodes[i], demand)
            return policy.score(nodes[i], demand) if ok else None

        if not self.state and nodes:
            self.state = [self._state_id(node) for node in nodes]
        return _Shape(self.state, by_node, self.log, len(self.log), share, False, [-1] * n, [])

    def _state_id(self, node: Node) -> int:
        return self.states.setdefault(_signature(node), len(self.states))

    def choose(self, demand: Demand) -> int | None:
        shape = self.shapes.get(demand)
        if shape is None:
            shape = self.shapes[demand] = self._shape(demand)
            self._judge(shape, range(len(self.cluster.nodes)))
        elif len(shape.log) > shape.seen:
            self._judge(shape, set(shape.log[shape.seen :]))
            shape.seen = len(shape.log)
        heap, version, lazy, judged = shape.heap, self.version, shape.lazy, shape.judged
        while heap:
            top = heap[0]
            i = top[1]
            v = version[i]
            if top[2] == v:
                return i
            if lazy and judged[i] != v:  # its stale entry was the best bound left: judge it again
                s = self._answer(shape, i)
                if s is not None:
                    heapq.heapreplace(heap, (-s, i, v))  # one sift for the pop and the push
                    continue
            heapq.heappop(heap)
        return None

    def _judge(self, shape: _Shape, todo: Iterable[int]) -> None:
        """Score `todo` for `shape` and push the fitting ones on its heap."""
        unfit, grown_at, answer, version, heap = (
            shape.unfit,
            self.grown_at,
            self._answer,
            self.version,
            shape.heap,
        )
        push = heapq.heappush
        for i in todo:
            if unfit[i] < grown_at[i]:  # else a share it did not fit, and it has only shrunk since
                s = answer(shape, i)
                if s is not None:
                    push(heap, (-s, i, version[i]))

    def _answer(self, shape: _Shape, i: int) -> float | None:
        """Node i's score for `shape` at its current version (None: it does not fit, noted for shares)."""
        sid = shape.state[i]
        memo = shape.memo
        s = memo.get(sid, _UNJUDGED)
        if s is _UNJUDGED:
            s = memo[sid] = shape.judge(i)
        v = self.version[i]
        if s is None and shape.share:
            shape.unfit[i] = v
        if shape.lazy:
            shape.judged[i] = v
        return s

    def changed(self, i: int) -> None:
        v = self.version[i] = self.version[i] + 1
        self.log.append(i)
        node = self.cluster.nodes[i]
        if self.margin is not None:
            before = self.rooms[i]
            room = self.rooms[i] = headroom(node, self.margin)
            self.room_state[i] = self.room_states.setdefault(room, len(self.room_states))
            if not within(room, before):
                self.grown.append(i)
                self.grown_at[i] = v
        if self.state:
            self.state[i] = self._state_id(node)


_UNJUDGED = math.nan  # memo default: no score is NaN (None is a real answer, "does not fit")


@dataclass(slots=True)
class _Shape:
    state: list[int]  # node -> the state id its answers are memoized by (the chooser's list, kept current)
    judge: Callable[[int], float | None]  # node -> score, None when filtered
    log: list[int]  # the chooser's log of the changes this shape must judge again before placing
    seen: int  # entries of `log` already applied to the heap
    # A share demand judged by headroom: a node it did not fit keeps not fitting while it only shrinks.
    share: bool
    # Stale entries are upper bounds (the score falls with the headroom): judge a node again only when
    # its entry reaches the top, or when it appears in `log` (a change that gave it room).
    lazy: bool
    unfit: list[int]  # node -> version at which it last did not fit this share demand (-1: none)
    judged: list[int]  # lazy shapes: node -> version last judged (-1: never)
    heap: list[tuple[float, int, int]] = field(default_factory=list)
    memo: dict[int, float | None] = field(default_factory=dict)  # state id -> score (None = filtered)


def simulate(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: Policy,
    workload: TargetWorkload,
    *,
    seed: int,
    inflate: float = 1.3,
    indexed: bool = True,
    progress: Progress | None = None,
) -> RunResult:
    """Replay `pods` on `nodes` with `policy`; `workload` is the fragmentation yardstick for the report.

    `indexed=False` calls `place` over every node for every pod: slow, the reference chooser, and the
    oracle the fast path is tested against.
    """
    started = time.perf_counter()
    capacity = MILLI_PER_GPU * sum(len(n.gpus) for n in nodes)
    if capacity == 0:
        raise ValueError("the cluster has no GPUs")
    seq, order = arrival_sequence(pods, len(nodes), capacity, seed, inflate)
    cluster = Cluster([nodes[j] for j in order], workload)
    chooser = IndexedChooser(cluster, policy) if indexed else None
    bins = MAX_ARRIVED_PCT + 1
    alloc_sum, frag_sum, rows = [0.0] * bins, [0.0] * bins, [0] * bins
    arrived = used = failed = 0
    for k, pod in enumerate(seq):
        demand = pod.demand
        arrived += pod.gpu_milli
        if chooser is not None:
            i = chooser.choose(demand)
            gpus = () if i is None else policy.choose_gpus(cluster.nodes[i], demand)
        else:
            result = place(cluster.nodes, demand, policy)
            i, gpus = (
                (cluster.nodes.index(result.node), result.gpus)
                if isinstance(result, Placement)
                else (None, ())
            )
        if i is None:
            failed += 1
        else:
            used += cluster.apply(i, demand, gpus)
            if chooser is not None:
                chooser.changed(i)
        b = min(round(100 * arrived / capacity), MAX_ARRIVED_PCT)
        alloc_sum[b] += 100 * used / capacity
        frag_sum[b] += 100 * cluster.frag_total / capacity
        rows[b] += 1
        if progress is not None and (k % 256 == 0 or k == len(seq) - 1):
            progress(k + 1, len(seq))
    return RunResult(
        policy=policy.name,
        seed=seed,
        pods=len(seq),
        placed=len(seq) - failed,
        failed=failed,
        seconds=time.perf_counter() - started,
        alloc_pct=_discretise(alloc_sum, rows),
        frag_pct=_discretise(frag_sum, rows),
    )


Where = tuple[int, tuple[int, ...]] | None  # (node position, GPU indexes), None when it did not fit


def replay(
    nodes: Sequence[Node], demands: Sequence[Demand], policy: Policy, workload: TargetWorkload
) -> tuple[list[Where], list[Node]]:
    """Place `demands` in exactly this order on `nodes` in this order (no shuffle, no inflation).

    What a live cluster does with the same arrivals and no departures (the nodes' order is the
    tie-break order, as the extender's natural name order is); returns where each went and the nodes after.
    """
    cluster = Cluster(list(nodes), workload)
    chooser = IndexedChooser(cluster, policy)
    out: list[Where] = []
    for demand in demands:
        i = chooser.choose(demand)
        if i is None:
            out.append(None)
            continue
        gpus = policy.choose_gpus(cluster.nodes[i], demand)
        cluster.apply(i, demand, gpus)
        chooser.changed(i)
        out.append((i, gpus))
    return out, cluster.nodes


def _discretise(sums: list[float], rows: list[int]) -> tuple[float, ...]:
    """Mean per arrived-% bin; an empty bin borrows its neighbours' rows (merge_alloc_discrete.py)."""
    out = []
    for a in range(len(sums)):
        if rows[a]:
            out.append(sums[a] / rows[a])
            continue
        near = range(max(a - 1, 0), min(a + 2, len(sums)))
        n = sum(rows[j] for j in near)
        out.append(sum(sums[j] for j in near) / n if n else math.nan)
    return tuple(out)
