"""Replaying a pod trace against a cluster with one policy, the FGD way (shuffle, inflate, no departures)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from app.core.model import MILLI_PER_GPU, Demand, Node
from app.core.placement import Placement, Policy, TargetWorkload, place, to_allocation
from app.core.placement.engine import Engine, HeadroomStanding
from app.tools.sim.loader import TracePod

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


def chooser(cluster: Cluster, policy: Policy) -> Engine:
    """The placement engine over `cluster`'s positions: equal node states share their answers, and no
    refusal is kept (the replay only needs where a pod goes). Tell it each change with `engine.set`."""
    engine = Engine(policy, HeadroomStanding(), by_value=True)
    engine.reset(cluster.nodes)
    return engine


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
    oracle the placement engine is tested against.
    """
    started = time.perf_counter()
    capacity = MILLI_PER_GPU * sum(len(n.gpus) for n in nodes)
    if capacity == 0:
        raise ValueError("the cluster has no GPUs")
    seq, order = arrival_sequence(pods, len(nodes), capacity, seed, inflate)
    cluster = Cluster([nodes[j] for j in order], workload)
    engine = chooser(cluster, policy) if indexed else None
    bins = MAX_ARRIVED_PCT + 1
    alloc_sum, frag_sum, rows = [0.0] * bins, [0.0] * bins, [0] * bins
    arrived = used = failed = 0
    for k, pod in enumerate(seq):
        demand = pod.demand
        arrived += pod.gpu_milli
        if engine is not None:
            i = engine.choose(demand)
            gpus = () if i is None else engine.gpus(i, demand)
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
            if engine is not None:
                engine.set(i, cluster.nodes[i])
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
    engine = chooser(cluster, policy)
    out: list[Where] = []
    for demand in demands:
        i = engine.choose(demand)
        if i is None:
            out.append(None)
            continue
        gpus = engine.gpus(i, demand)
        cluster.apply(i, demand, gpus)
        engine.set(i, cluster.nodes[i])
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
