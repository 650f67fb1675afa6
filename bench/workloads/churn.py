"""Replaying a trace with departures, optionally repacking between waves (the repack planner, unchanged).

The cluster is first filled the FGD way (shuffled arrivals, failed pods dropped) until the arrived GPU
request reaches the cluster's capacity. Then each round: every running pod departs with probability
`depart`; the planner runs on what is left (when `repack` is on) and its moves are carried out as the
cluster would (evict, then the policy re-places the pod where the plan predicted); then new pods arrive
(drawn from the trace with replacement, the same draws with or without repack) until the round has
offered the departed GPU request plus `pressure` x capacity, so the cluster is saturated again.
Unallocated GPU % is read after each round; idle whole GPUs when the round's arrivals start.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from app.core.model import MILLI_PER_GPU, Allocation, Demand, Node
from app.core.placement import Policy, TargetWorkload, to_allocation
from app.tools.repack.plan import Move, PodRef, plan
from app.tools.sim.engine import Cluster, arrival_sequence, chooser
from app.tools.sim.loader import TracePod


@dataclass(frozen=True, slots=True)
class ChurnResult:
    policy: str
    seed: int
    repack: bool
    unallocated_pct: tuple[float, ...]  # after the fill (index 0), then after each round
    evictions: tuple[int, ...]  # per round (0 without repack)
    gpus_freed: tuple[int, ...]  # per round: GPUs the plan emptied
    idle_gpus: tuple[int, ...]  # per round: whole GPUs idle when the round's arrivals start
    seconds: float

    @property
    def median_unallocated(self) -> float:
        """Median over the rounds (the fill is not a round)."""
        return statistics.median(self.unallocated_pct[1:])


@dataclass(slots=True)
class _Running:
    uid: str
    node: int
    gpus: tuple[int, ...]
    demand: Demand
    alloc: Allocation | None  # None for a CPU-only pod


class Replay:
    def __init__(self, nodes: Sequence[Node], policy: Policy, workload: TargetWorkload, order: list[int]):
        self.cluster = Cluster([nodes[j] for j in order], workload)
        self.chooser = chooser(self.cluster, policy)
        self.policy = policy
        self.running: dict[str, _Running] = {}
        self.capacity = MILLI_PER_GPU * sum(len(n.gpus) for n in nodes)
        self._next = 0

    def arrive(self, demand: Demand) -> bool:
        """Place the pod where the policy says; False when it fits nowhere (it is dropped, as in FGD)."""
        i = self.chooser.choose(demand)
        if i is None:
            return False
        self._next += 1
        self._put(f"pod-{self._next}", i, demand)
        return True

    def _put(self, uid: str, i: int, demand: Demand) -> tuple[int, ...]:
        """Reserve the pod on node i, on the GPUs the policy chooses there; returns them."""
        node = self.cluster.nodes[i]
        gpus = self.chooser.gpus(i, demand)
        alloc = to_allocation(node, demand, gpus) if gpus else None
        self.cluster.apply(i, demand, gpus)
        self.chooser.set(i, self.cluster.nodes[i])
        self.running[uid] = _Running(uid, i, gpus, demand, alloc)
        return gpus

    def depart(self, uid: str) -> None:
        pod = self.running.pop(uid)
        self.cluster.release(pod.node, pod.demand, pod.gpus)
        self.chooser.set(pod.node, self.cluster.nodes[pod.node])

    def idle_gpus(self) -> int:
        return sum(g.milli_used == 0 for n in self.cluster.nodes for g in n.gpus)

    def unallocated_pct(self) -> float:
        used = sum(g.milli_used for n in self.cluster.nodes for g in n.gpus)
        return 100.0 - 100.0 * used / self.capacity

    def pod_refs(self) -> list[PodRef]:
        """Every running GPU pod as the planner sees it (each may move: the trace has no PDBs or owners)."""
        return [PodRef(p.uid, p.uid, p.alloc, p.demand) for p in self.running.values() if p.alloc]

    def repack(self, max_evictions: int | None) -> tuple[int, int]:
        """Plan on the current state and carry the moves out; (evictions, GPUs freed)."""
        got = plan(self.cluster.nodes, self.pod_refs(), {}, self.policy, max_evictions=max_evictions)
        self.carry_out(got.moves)
        return got.evictions, len(got.freed_gpus)

    def carry_out(self, moves: Sequence[Move]) -> None:
        """Evict each moved pod and let the policy re-place it; it must land where the plan said."""
        index = {n.name: i for i, n in enumerate(self.cluster.nodes)}
        for m in moves:
            pod = self.running[m.uid]
            self.depart(m.uid)
            i = self.chooser.choose(pod.demand)
            target = index[m.target.node]
            gpus = self._put(m.uid, i, pod.demand) if i is not None else ()
            if i is None or (i, gpus) != (target, m.target.gpu_indexes):
                raise AssertionError(f"{m.pod}: re-placed on {i}/{gpus}, the plan said {target}/{m.target}")


def churn(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy: Policy,
    workload: TargetWorkload,
    *,
    seed: int,
    rounds: int = 8,
    depart: float = 0.1,
    pressure: float = 0.3,
    repack: bool = False,
    max_evictions: int | None = None,
) -> ChurnResult:
    """One seed of the churn replay (see the module docstring); the same seed gives the same arrivals."""
    started = time.perf_counter()
    seq, order = arrival_sequence(
        pods, len(nodes), MILLI_PER_GPU * sum(len(n.gpus) for n in nodes), seed, 1.0
    )
    sim = Replay(nodes, policy, workload, order)
    for pod in seq:
        sim.arrive(pod.demand)
    rng = random.Random(seed * 7919 + 1)
    base = sorted(pods, key=lambda p: p.name)
    unalloc = [sim.unallocated_pct()]

    def offer(milli: float) -> None:
        offered = 0
        while offered < milli:
            pod = base[rng.randrange(len(base))]
            offered += pod.gpu_milli
            sim.arrive(pod.demand)

    evictions: list[int] = []
    freed: list[int] = []
    idle: list[int] = []
    for _ in range(rounds):
        leaving = [uid for uid in sim.running if rng.random() < depart]
        departed = sum((sim.running[u].demand.milli or 0) * sim.running[u].demand.count for u in leaving)
        for uid in leaving:
            sim.depart(uid)
        ev, fr = sim.repack(max_evictions) if repack else (0, 0)
        evictions.append(ev)
        freed.append(fr)
        idle.append(sim.idle_gpus())
        offer(departed + pressure * sim.capacity)
        unalloc.append(sim.unallocated_pct())
    return ChurnResult(
        policy=policy.name,
        seed=seed,
        repack=repack,
        unallocated_pct=tuple(unalloc),
        evictions=tuple(evictions),
        gpus_freed=tuple(freed),
        idle_gpus=tuple(idle),
        seconds=time.perf_counter() - started,
    )
